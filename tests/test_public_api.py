"""The public API reads the same in every type checker and in an editor's hover.

Every package of ours documents every public function, class, method and property (what an
editor shows on hover: for `spec`'s adapter protocols, each method's part of the contract) and
declares the type of every public instance attribute, so pyright (`--verifytypes`) reads them
as mypy does. The checker itself (`tests/public_api.py`) is shown to catch each gap on a
seeded module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.public_api import Gap, gaps_in_sources, package_gaps

ROOT = Path(__file__).resolve().parents[1]


PACKAGES = ["spec", "properties", "integrations", "reference", "gpu", "schedspec_cli"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_symbol_is_documented(package: str) -> None:
    gaps = package_gaps(ROOT / package, declarations=False)
    assert not gaps, "\n".join(map(str, gaps))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_attribute_declares_its_type(package: str) -> None:
    gaps = package_gaps(ROOT / package, docstrings=False)
    assert not gaps, "\n".join(map(str, gaps))


SEEDED = '''
class Counter:
    """Counts."""

    total: int

    def __init__(self, start: int, label: str) -> None:
        self.total = start
        self.count = 0
        self.label = label
        self.name: str = label
        self._hidden = 0

    def bump(self) -> None:
        self.count += 1

    def reset(self) -> None:
        """Back to zero."""
        self.first, self.rest = 0, []


class Child(Counter):
    """Inherits `total` and `name` declared."""

    def again(self) -> None:
        """Reassigns what the base declares."""
        self.total = 3
        self.name = "x"


class _Private:
    def __init__(self) -> None:
        self.loose = 0


def helper() -> None:
    pass


def _internal() -> None:
    pass
'''


def test_the_checker_names_each_gap_of_a_seeded_module() -> None:
    gaps = gaps_in_sources({"seeded.py": SEEDED})
    assert [str(g) for g in gaps] == [
        "seeded.py:9 Counter.count has no declared type",
        "seeded.py:14 Counter.bump has no docstring",
        "seeded.py:19 Counter.first has no declared type",
        "seeded.py:19 Counter.rest has no declared type",
        "seeded.py:36 helper has no docstring",
    ]


def test_the_checker_passes_the_seeded_module_once_mended() -> None:
    mended = (
        SEEDED.replace("        self.count = 0", "        self.count: int = 0")
        .replace(
            "    def bump(self) -> None:\n", '    def bump(self) -> None:\n        """+1."""\n'
        )
        .replace("self.first, self.rest = 0, []", "self.first: int = 0")
        .replace("def helper() -> None:\n", 'def helper() -> None:\n    """Helps."""\n')
    )
    assert gaps_in_sources({"seeded.py": mended}) == []


def test_a_gap_reads_as_where_what_and_why() -> None:
    assert str(Gap("m.py:3", "C.f", "undocumented")) == "m.py:3 C.f has no docstring"
    assert str(Gap("m.py:4", "C.x", "undeclared")) == "m.py:4 C.x has no declared type"
