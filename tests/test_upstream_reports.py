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
