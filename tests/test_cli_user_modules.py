"""A user's own module behind `--impl` or `--scheduler` fails in the user's code, and the command
says so: a module that raises or exits while it is imported, a factory that raises while it
builds, a callable that is no factory, a `--mode` the user's profile does not declare. Each is
exit 2 with one line naming the flag and the user's line that raised, or, where the suite is
already running the implementation, the `implementation_error` rule with that line (never a rule
named after the exception's type, never a traceback, never the module's own exit status).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedspec_cli.main import main

MODULES = {
    "boom_at_import": 'raise RuntimeError("boom at import")\n',
    "exits_at_import": "import sys\n\nsys.exit(3)\n",
    "past_ties": (
        "from reference.dllm import ReferenceDllmScheduler\n"
        "from spec.config import DllmConfig, RequestSpec\n"
        "from spec.snapshot import FinishedOutput\n"
        "\n"
        "class WrongGolden(ReferenceDllmScheduler):\n"
        "    def golden_output(self, request: RequestSpec) -> FinishedOutput:\n"
        "        real = super().golden_output(request)\n"
        "        last = (real.tokens[-1] + 1) % 15\n"
        "        return FinishedOutput((*real.tokens[:-1], last), real.reason)\n"
        "\n"
        "    def golden_output_past_ties(self, request: object, actual: object) -> object:\n"
        '        raise ValueError("boom in past ties")\n'
        "\n"
        "def raising(config: DllmConfig, sink: object) -> WrongGolden:\n"
        "    return WrongGolden(config, sink)  # type: ignore[arg-type]\n"
        "\n"
        "class Explains(WrongGolden):  # every mismatch explained by one (made-up) tie\n"
        "    def golden_output_past_ties(self, request: object, actual: object) -> object:\n"
        "        from spec.golden import GoldenBranch, GoldenTie\n"
        "\n"
        '        return GoldenBranch(actual, (GoldenTie(0, "block 0, forward 1: made up"),))\n'
        "\n"
        "def explains(config: DllmConfig, sink: object) -> Explains:\n"
        "    return Explains(config, sink)  # type: ignore[arg-type]\n"
    ),
    "my_factories": (
        "import dataclasses\n"
        "from reference.dllm import REFERENCE_DLLM\n"
        "from spec.ar.config import ArConfig\n"
        "from spec.config import DllmConfig, Mode\n"
        "\n"
        "def raising(config: DllmConfig, sink: object) -> object:\n"
        '    raise ValueError("the pool is not ready")\n'
        "\n"
        "def no_args():\n"
        "    return 1\n"
        "\n"
        "def ar_raising(config: ArConfig, sink: object) -> object:\n"
        '    raise KeyError("block_size")\n'
        "\n"
        "class RulesNamed:  # an AR adapter whose rules are a name, not an ArRules\n"
        '    rules = "fcfs"\n'
        "\n"
        "    def __init__(self, inner: object) -> None:\n"
        "        self._inner = inner\n"
        "\n"
        "    def __getattr__(self, name: str) -> object:\n"
        "        return getattr(self._inner, name)\n"
        "\n"
        "def ar_rules_named(config: ArConfig, sink: object) -> object:\n"
        "    from reference.ar.vllm_v1 import VLLM_V1\n"
        "\n"
        "    return RulesNamed(VLLM_V1.factory(config, sink))\n"
        "\n"
        "SYNC_ONLY = dataclasses.replace(\n"
        "    REFERENCE_DLLM,\n"
        "    profile=dataclasses.replace(\n"
        "        REFERENCE_DLLM.profile,\n"
        "        space=dataclasses.replace(\n"
        "            REFERENCE_DLLM.profile.space,\n"
        "            modes=frozenset({Mode.SYNC}),\n"
        "            in_place_reuse=frozenset({False}),\n"
        "            reloop=frozenset({False}),\n"
        "        ),\n"
        "    ),\n"
        ")\n"
        "\n"
        "# SGLang's shape of space: a page of one block, reuse always, no re-loop\n"
        "REUSE_ONLY = dataclasses.replace(\n"
        "    REFERENCE_DLLM,\n"
        "    profile=dataclasses.replace(\n"
        "        REFERENCE_DLLM.profile,\n"
        "        space=dataclasses.replace(\n"
        "            REFERENCE_DLLM.profile.space,\n"
        "            page_multiples=frozenset({1}),\n"
        "            in_place_reuse=frozenset({True}),\n"
        "            reloop=frozenset({False}),\n"
        "            kv_headroom_pages=2,\n"
        "        ),\n"
        "    ),\n"
        ")\n"
    ),
}


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory holding the user's modules, as the current directory (importable)."""
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (
            "boom_at_import:X",
            "invalid impl='boom_at_import:X': a module that imports (importing it raised "
            "RuntimeError: boom at import (at {dir}/boom_at_import.py:1 in <module>))",
        ),
        (
            "exits_at_import:X",
            "invalid impl='exits_at_import:X': a module that imports (importing it raised "
            "SystemExit: 3 (at {dir}/exits_at_import.py:3 in <module>))",
        ),
    ],
)
def test_a_module_failing_at_import_is_one_line_naming_the_line(
    target: str, says: str, user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--impl", target, "--examples", "2"]) == 2
    assert _one_error_line(capsys) == "schedspec: error: " + says.format(dir=user_dir)


def test_a_factory_that_raises_breaks_implementation_error_at_its_line(
    user_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    code = main(["verify", "--impl", "my_factories:raising", "--examples", "3", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 1
    assert (
        "[implementation_error] building the implementation raised ValueError: the pool is not "
        f"ready (at {user_dir}/my_factories.py:7 in raising)"
    ) in printed
    # CI reads the rules from the JSON: only rules that exist, never an exception's type name
    assert json.loads(out.read_text())["rules"] == ["implementation_error"]


def test_an_undeclared_mode_is_a_usage_error(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--impl", "my_factories:SYNC_ONLY", "--mode", "fdfo"]) == 2
    assert _one_error_line(capsys) == (
        "schedspec: error: invalid --mode='fdfo': a mode that my_factories:SYNC_ONLY declares: sync"
    )
    assert (
        main(["verify", "--impl", "my_factories:SYNC_ONLY", "--mode", "sync", "--examples", "3"])
        == 0
    )


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("os:path", "this is a module"),
        (
            "my_factories:no_args",
            "building it raised TypeError: no_args() takes 0 positional arguments but 2 were given",
        ),
        (
            "my_factories:ar_raising",
            "building it raised KeyError: 'block_size' (at {dir}/my_factories.py:13 in ar_raising)",
        ),
        ("boom_at_import:X", "this is not a module that imports (importing it raised"),
        # the members verify asks of an AR adapter, values too: `rules` is read by the suite
        (
            "my_factories:ar_rules_named",
            "whose rules is the str 'fcfs', not a spec.ar.ArRules or None",
        ),
    ],
)
def test_a_simulated_scheduler_of_the_users_is_checked_before_the_run(
    target: str, says: str, user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "replicas", "--scheduler", target]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"schedspec: error: invalid --scheduler='{target}': "), line
    assert says.format(dir=user_dir) in line


def test_parity_runs_the_modes_the_profile_declares(
    user_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`parity --impl` runs the mode variants the profile declares, on a pool the profile
    admits (its headroom), and says which: an implementation shaped as SGLang's (reuse always,
    no re-loop) used to be refused for the variants it does not run, whatever the flags."""
    out = tmp_path / "p.json"
    argv = ["parity", "--impl", "my_factories:REUSE_ONLY", "--prompts", "3"]
    assert main([*argv, "--block-size", "4", "--page-size", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "IDENTICAL" in printed and "the modes its profile declares: sync, fdfo+reuse" in printed
    report = json.loads(out.read_text())
    assert report["modes"] == ["sync", "fdfo+reuse"]
    assert sorted(report["seconds"]) == ["fdfo+reuse@1", "fdfo+reuse@3", "sync@1", "sync@3"]
    # a flag's value outside the space is named by the flag
    assert main([*argv, "--block-size", "4", "--page-size", "8"]) == 2
    assert _one_error_line(capsys) == (
        "schedspec: error: invalid --page-size=8: a value my_factories:REUSE_ONLY declares: "
        "block_size x {1}"
    )


def test_parity_refuses_an_implementation_without_fdfo(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["parity", "--impl", "my_factories:SYNC_ONLY", "--prompts", "2"]) == 2
    assert _one_error_line(capsys) == (
        "schedspec: error: invalid impl='my_factories:SYNC_ONLY': an implementation that runs "
        "sync and FDFO (parity compares FDFO's outputs with sync's); of sync, fdfo, fdfo+reuse, "
        "fdfo+reuse+reloop it declares sync"
    )


def test_parity_names_a_raising_golden_output_past_ties_as_the_implementations_error(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the comparison ran the user's `golden_output_past_ties` unguarded: a traceback,
    exit 1, and no `--run-timeout`."""
    argv = ["parity", "--impl", "past_ties:raising", "--prompts", "2", "--max-new-tokens", "8"]
    assert main(argv) == 1
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    said = cap.out + cap.err
    assert "[implementation_error]" in said and "boom in past ties" in said, said
    assert "during golden_output_past_ties" in said, said


def test_verify_counts_the_golden_mismatches_it_agreed_past_ties(
    user_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before, such a run said PASS and nothing else: an adapter explaining every mismatch as
    a tie went unseen. The count and the first are under the table and in the JSON."""
    out = tmp_path / "v.json"
    code = main(["verify", "--impl", "past_ties:explains", "--examples", "10", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    assert result["golden_ties"] > 0, result
    n = result["golden_ties"]
    assert f"past_ties:explains: {n} golden mismatch" in printed, printed
    assert "agreed once float ties were taken the other way" in printed
    assert "(the first: 'r" in printed and "block 0, forward 1: made up" in printed
