"""docs/upstream-reports.md (`scripts/upstream_reports.py`), without vLLM or SGLang: the file is
what the script renders from docs/shrunk/, every shrunk program (and SGLang record, with its
calls on SGLang's scheduler) has a report, and each vLLM report's shrink command asks
`scripts/vllm_shrink.py` (`scripts/vllm_dllm_shrink.py` for the diffusion path's) for the very
options, fixes and loop its program was recorded with. That SGLang's records say what SGLang
does: tests/test_sglang_findings.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm import cache_aware_arguments, loop_arguments
from integrations.vllm.dllm_arguments import fix_names, space
from integrations.vllm.loop_arguments import loop_options
from integrations.vllm.shrink import recorded_options
from tests.script_module import load_script

reports = load_script("upstream_reports")


def test_the_reports_are_in_step_with_the_shrunk_programs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert reports.main(["--check"]) == 0, capsys.readouterr().out
    text = reports.REPORTS.read_text()
    for path in sorted(reports.SHRUNK.glob("*.json")):
        record = json.loads(path.read_text())
        assert record["program"] in text, path.stem
    for path in sorted(reports.SHRUNK.glob("sglang-*.json")):  # SGLang's: its calls too
        record = json.loads(path.read_text())
        assert "\n".join(record["transcript"]) in text, path.stem
        assert f"--finding {record['key']}\n" in text, path.stem
    # the programs said to pass on vLLM 0.34.0 (or, found there, on 0.33.0) are shrunk
    # programs, and each report says how its program fares on the release it was not found on
    stems = {path.stem for path in reports.SHRUNK.glob("vllm-*.json")}
    said = set(reports.GONE_IN_0_34) | set(reports.ONLY_IN_0_34)
    assert said <= stems, sorted(said - stems)
    on_other = text.count("\n- vLLM 0.34.0: ") + text.count("\n- vLLM 0.33.0: ")
    assert on_other == len(stems)


@pytest.mark.parametrize("stem", sorted(p.stem for p in reports.SHRUNK.glob("vllm-*.json")))
def test_a_reports_shrink_command_asks_for_the_recorded_options(
    stem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = json.loads((reports.SHRUNK / f"{stem}.json").read_text())
    # the flags, not the release: a setting new in vLLM 0.34.0 is refused on 0.33.0, and
    # vLLM need not be installed at all
    no_vllm = SimpleNamespace(config=SimpleNamespace(SchedulerConfig=None))
    for module in (loop_arguments, cache_aware_arguments):
        monkeypatch.setattr(module, "check_scheduler_settings", lambda *_: None)
        monkeypatch.setattr(module, "load_vllm", lambda: no_vllm)
    if record.get("path") == "diffusion":
        dllm = load_script("vllm_dllm_shrink").build_parser()
        args = dllm.parse_args(reports.shrink_arguments(record))
        assert (
            space(args) == record["space"]
            and args.pipeline_parallel == record["pipeline_parallel_size"]
        )
        assert " + ".join(fix_names(args)) == (record["fix"] or "")
        assert args.seed == record["seed"] and args.loop == record["loop"]
        assert " + ".join(sorted(args.lifted_by)) == record["lifted_by"]
        return
    shrink = load_script("vllm_shrink")
    parser = shrink.build_parser()
    args = parser.parse_args(reports.shrink_arguments(record))
    options, names = loop_options(args, parser)
    recorded = recorded_options(options)  # older records lack newer options: at their default
    assert {k: recorded[k] for k in record["options"]} == record["options"]
    assert " + ".join(names) == (record["fix"] or "")
    assert args.seed == record["seed"] and args.loop == record["loop"]
    assert " + ".join(sorted(args.lifted_by)) == record["lifted_by"]
    assert args.programs_from == record["programs_from"]


def test_a_shrunk_program_without_a_title_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, one line naming it; and a stale file is exit 1 under --check."""
    titles = dict(reports.TITLES)
    titles.pop("vllm-spec-pad")
    monkeypatch.setattr(reports, "TITLES", titles)
    assert reports.main(["--check"]) == 2
    assert "no title for the shrunk programs ['vllm-spec-pad']" in capsys.readouterr().err
    monkeypatch.setattr(reports, "TITLES", {**reports.TITLES, "vllm-spec-pad": ("x", "y", None)})
    assert reports.main(["--check"]) == 1


def test_an_sglang_record_of_nothing_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record whose program broke nothing would be a report of nothing: exit 2, one line."""
    for path in reports.SHRUNK.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    record = json.loads((tmp_path / "sglang-idle-round.json").read_text())
    record["rule"] = record["message"] = None
    (tmp_path / "sglang-idle-round.json").write_text(json.dumps(record))
    monkeypatch.setattr(reports, "SHRUNK", tmp_path)
    assert reports.main(["--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the SGLang records ['idle-round'] reproduce nothing" in err and "\n" not in err


@pytest.mark.parametrize("field", ["key", "order"])
def test_two_sglang_records_of_one_finding_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """A stray copy of a record (another file, the same finding) rendered one report twice and
    left a number out (a review's finding): exit 2, one line naming both files."""
    for path in reports.SHRUNK.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    stray = json.loads((tmp_path / "sglang-idle-round.json").read_text())
    other = json.loads((tmp_path / "sglang-ragged-row.json").read_text())
    stray[field] = other[field]
    (tmp_path / "sglang-idle-round.json").write_text(json.dumps(stray))
    monkeypatch.setattr(reports, "SHRUNK", tmp_path)
    assert reports.main(["--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"its {field} " in err and "expected one record per" in err, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--check", "extra"], "unrecognized arguments: extra"),
        (["--check=yes"], "argument --check: ignored explicit argument 'yes'"),
    ],
)
def test_a_usage_error_is_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with one line, as the script's own errors, no usage block (found by a review)."""
    assert reports.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"scripts/upstream_reports.py: error: {said}\n", err


def test_help_still_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as leaving:
        reports.main(["--help"])
    assert leaving.value.code == 0
    assert capsys.readouterr().out.startswith("usage: scripts/upstream_reports.py")


def _spoilt(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`record` with `changes`."""
    return {**record, **changes}


def _options(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**record, "options": {**record["options"], **changes}}


#: (record file, what is written there instead (text, or a function of the stored record),
#: words the one-line error must hold)
MALFORMED: list[tuple[str, Any, list[str]]] = [
    ("vllm-spec-pad", '{"release": "0.33.0", "seed"', ["not valid JSON", "expected a JSON object"]),
    ("vllm-spec-pad", "", ["not valid JSON"]),
    ("vllm-spec-pad", "[]", ["an array, not an object", "scripts/vllm_shrink.py --json"]),
    ("vllm-spec-pad", '"text"', ["a string, not an object"]),
    ("vllm-spec-pad", "{}", ['no "release", "seed", "loop"', '"lifted_by"', "every field"]),
    (
        "vllm-spec-pad",
        lambda r: _spoilt(r, program=None),
        ['"program" is null', "expected the smaller program's source, a non-empty string"],
    ),
    (
        "vllm-spec-pad",
        lambda r: {k: v for k, v in r.items() if k != "lifted_by"},
        ['no "lifted_by" field', "scripts/vllm_shrink.py --json --trace"],
    ),
    ("vllm-spec-pad", lambda r: _spoilt(r, seed="132"), ['"seed" is a string ("132")']),
    ("vllm-spec-pad", lambda r: _spoilt(r, loop="both"), ['"loop" is', '"sync" or "async"']),
    (
        "vllm-spec-pad",
        lambda r: _spoilt(r, size_after={"requests": 3}),
        ['"size_after" is an object', '"requests", "aborts" and "tokens"'],
    ),
    ("vllm-spec-pad", lambda r: _spoilt(r, trace="a run"), ['"trace" is a string']),
    (
        "vllm-spec-pad",
        lambda r: _spoilt(r, lifted_by="no-such-fix"),
        ["\"lifted_by\" names 'no-such-fix'", "expected fixes among", "pad-what-fits"],
    ),
    (
        "vllm-spec-pad",
        lambda r: _spoilt(r, programs_from="nowhere"),
        ['"programs_from" is a string ("nowhere")', "random"],
    ),
    (
        "vllm-spec-pad",
        lambda r: _options(r, speculative_tokenz=2),
        ["\"options\" holds 'speculative_tokenz'", "no `LoopOptions` field"],
    ),
    (
        "vllm-spec-pad",
        lambda r: _options(r, encoder={"items": 2}),
        ['"options" "encoder" is an object', "EncoderOptions"],
    ),
    (
        "vllm-spec-pad",
        lambda r: _spoilt(r, release="0.34.0"),
        ["recorded on vLLM 0.34.0", "ONLY_IN_0_34"],
    ),
    (  # a field of the right name and kind holding a value of another: the report's guard
        "vllm-offloading-window-part",
        lambda r: _options(r, offload_blocks_per_chunk="3"),
        ["a field of the wrong kind (TypeError:"],
    ),
    (
        "vllm-dllm-model-len",
        lambda r: _spoilt(r, space=["budget_binds"]),
        ['"space" is an array', "budget_binds"],
    ),
    (
        "vllm-dllm-model-len",
        lambda r: _spoilt(r, path="autoregressive"),
        ['"path" is a string ("autoregressive")', 'expected "diffusion"'],
    ),
    ("sglang-idle-round", '{"key": "idle-round",', ["not valid JSON"]),
    ("sglang-idle-round", "[]", ["an array, not an object", "scripts/sglang_findings.py"]),
    ("sglang-idle-round", "{}", ['no "key", "order"', "scripts/sglang_findings.py --record"]),
    ("sglang-idle-round", lambda r: _spoilt(r, order="4"), ['"order" is a string ("4")']),
    (
        "sglang-idle-round",
        lambda r: _spoilt(r, transcript="calls"),
        ['"transcript" is a string', "a list of strings"],
    ),
    (
        "sglang-idle-round",
        lambda r: _spoilt(r, lifted_by=[["no-such-fix"]]),
        ["\"lifted_by\" names 'no-such-fix'", "worst-case-estimate"],
    ),
]


@pytest.mark.parametrize(
    ("stem", "written", "said"),
    MALFORMED,
    ids=[f"{stem}-{i}" for i, (stem, _, _) in enumerate(MALFORMED)],
)
def test_a_malformed_record_is_a_one_line_error_naming_it(
    stem: str,
    written: Any,
    said: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A record cut short, not an object, without a field or with one of another kind: exit 2
    and one line naming the file, what is wrong and what is expected, never a traceback (found
    by a review: JSONDecodeError, TypeError, or a bare "lifted_by")."""
    for path in reports.SHRUNK.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    target = tmp_path / f"{stem}.json"
    if callable(written):
        written = json.dumps(written(json.loads(target.read_text())))
    target.write_text(written)
    monkeypatch.setattr(reports, "SHRUNK", tmp_path)
    monkeypatch.setattr(reports, "REPORTS", tmp_path / "upstream-reports.md")
    for argv in (["--check"], []):
        assert reports.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith(f"scripts/upstream_reports.py: error: {target}: "), err
        assert "expected" in err and all(words in err for words in said), err
    assert not (tmp_path / "upstream-reports.md").exists()


def test_a_record_that_cannot_be_read_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory named as a record, and a record that is not UTF-8 text."""
    monkeypatch.setattr(reports, "SHRUNK", tmp_path)
    (tmp_path / "vllm-spec-pad.json").mkdir()
    assert reports.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'vllm-spec-pad.json'}: cannot be read" in err
    (tmp_path / "vllm-spec-pad.json").rmdir()
    (tmp_path / "sglang-idle-round.json").write_bytes(b"\xff\xfe{}")
    assert reports.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sglang-idle-round.json: cannot be read" in err, err


def test_a_record_under_the_checkout_is_named_from_its_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user sees it: docs/shrunk/NAME.json, not the checkout's absolute path."""
    shrunk = tmp_path / "docs" / "shrunk"
    shrunk.mkdir(parents=True)
    (shrunk / "vllm-spec-pad.json").write_text('{"release": ')
    monkeypatch.setattr(reports, "ROOT", tmp_path)
    monkeypatch.setattr(reports, "SHRUNK", shrunk)
    assert reports.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "scripts/upstream_reports.py: error: docs/shrunk/vllm-spec-pad.json: not valid JSON "
        "(Expecting value at line 1, column 13); expected a JSON object, a record as "
        "scripts/vllm_shrink.py --json --trace writes it"
    ), err
