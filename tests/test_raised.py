"""`properties.raised.describe_raised`: the type, the message or, for a bare `assert`, the line
that raised, its place, and where the user's own code met an installed package's check."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from properties.raised import describe_raised


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as err:  # the test's own calls: any error is what it examines
        return err
    raise AssertionError("it did not raise")


@pytest.fixture
def engine_and_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], object]:
    """An installed package (under a `site-packages/`) with a bare assert, and a user's module
    outside it whose subclass-like function calls it."""
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "fake_engine").mkdir(parents=True)
    (site / "fake_engine" / "__init__.py").write_text(
        "def schedule(running, cap):\n    assert running <= cap\n    return running\n"
    )
    user = tmp_path / "user"
    user.mkdir()
    (user / "my_sched.py").write_text(
        "import fake_engine\n\n\ndef schedule():\n    return fake_engine.schedule(3, 2)\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(user))
    for name in ("fake_engine", "my_sched"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    schedule: Callable[[], object] = importlib.import_module("my_sched").schedule
    return schedule


def test_a_message_is_kept_and_its_frame_named() -> None:
    def boom() -> None:
        raise RuntimeError("out of pages")

    said = describe_raised(_raised(boom))
    assert said.startswith("RuntimeError: out of pages (at ")
    assert f"{__file__}:" in said and said.endswith(" in boom)")


def test_a_bare_assert_is_named_by_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(In a module of its own: pytest rewrites the asserts of test modules to carry messages.)"""
    (tmp_path / "plain_check.py").write_text(
        "def check(running, cap):\n    assert running <= cap\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "plain_check", raising=False)
    check = importlib.import_module("plain_check").check
    said = describe_raised(_raised(lambda: check(3, 2)))
    assert (
        said == f"AssertionError: assert running <= cap (at {tmp_path}/plain_check.py:2 in check)"
    )


def test_an_engines_assert_names_the_users_frame_that_reached_it(
    engine_and_user: Callable[[], object], tmp_path: Path
) -> None:
    said = describe_raised(_raised(engine_and_user))
    engine = tmp_path / "venv" / "lib" / "site-packages" / "fake_engine" / "__init__.py"
    user = tmp_path / "user" / "my_sched.py"
    assert said == (
        f"AssertionError: assert running <= cap (at {engine}:2 in schedule; "
        f"via {user}:5 in schedule)"
    ), said


def test_no_via_when_the_users_own_code_raised() -> None:
    def own() -> None:
        raise ValueError("bad")

    assert "; via " not in describe_raised(_raised(own))


MULTI_LINE = """\
def check(new, resumed, running, cap):
    # vLLM's schedule() ends with an assert like this one
    assert len(new) + len(resumed) + len(
        running  # those it scheduled
        # (a whole-line comment)
    ) <= cap


def long_check(x):
    assert x == [
        {}
    ]
"""


def test_a_multi_line_assert_is_named_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `FrameSummary.line` gave the statement's first line only:
    `assert len(new) + len(resumed) + len(`."""
    (tmp_path / "multi_check.py").write_text(MULTI_LINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "multi_check", raising=False)
    module = importlib.import_module("multi_check")
    said = describe_raised(_raised(lambda: module.check([1], [2], [3], 2)))
    assert said == (
        "AssertionError: assert len(new) + len(resumed) + len(running) <= cap "
        f"(at {tmp_path}/multi_check.py:3 in check)"
    ), said
    monkeypatch.setattr("spec.source_statement.STATEMENT_CHARS", 12)
    said = describe_raised(_raised(lambda: module.long_check([])))
    assert said.startswith("AssertionError: assert x... (at "), said


def test_the_engine_core_loop_names_a_multi_line_assert_whole_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scripts/vllm_async_check.py`'s loop names a bare assert by its own words
    (`integrations.vllm.core_loop._raised`), from the same `spec.source_statement`."""
    from integrations.vllm.core_loop import _raised as loop_raised

    (tmp_path / "multi_check.py").write_text(MULTI_LINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "multi_check", raising=False)
    module = importlib.import_module("multi_check")
    said = loop_raised(_raised(lambda: module.check([1], [2], [3], 2)))
    assert said.endswith("multi_check.py:3 (assert len(new) + len(resumed) + len(running) <= cap)")
