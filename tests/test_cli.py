"""The command line as a user meets it: every command listed, every flag explained, both
families from `--impl`, typed answers for what cannot be run, check-trace's header rules."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from properties.ar.harness import ArHarness
from properties.harness import Harness
from reference.ar.seeded_bugs import AR_SEEDED_BUGS
from reference.ar.vidur import make_vidur_vllm
from reference.dllm import make_scheduler
from reference.seeded_bugs import SEEDED_BUGS
from schedspec_cli import bench_conformance, engine_cmds, list_impls, release, simulate, version
from schedspec_cli import main as cli
from schedspec_cli.main import PASS_THROUGH, build_parser, main
from schedspec_cli.registry import BUILTINS
from spec import DllmConfig, Mode, RequestSpec
from spec.ar.config import ArConfig, ArRequest
from spec.ar.trace import write_ar_trace
from spec.trace import config_to_dict, write_events


def out_err(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    cap = capsys.readouterr()
    return cap.out, cap.err


# ---------------------------------------------------------------------------- help and version
def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out, _ = out_err(capsys)
    for command in ("verify", "list-impls", "check-trace", "prove", "bench", *PASS_THROUGH):
        assert f"    {command}" in out, command


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert out_err(capsys)[0].strip() == f"schedspec {version()}"


def _parsers() -> list[argparse.ArgumentParser]:
    """Every parser a user reaches: the top level's, each command's, the pass-through
    commands' own (parity, bench engine|conformance, release-check) and simulate's with each
    of its subcommands'."""
    found: list[argparse.ArgumentParser] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    for parser in (
        build_parser(),
        engine_cmds.parity_parser(),
        engine_cmds.bench_engine_parser(),
        bench_conformance.build_parser(),
        release.build_parser(),
        simulate.build_parser(),
    ):
        walk(parser)
    return found


def test_every_flag_has_help_text() -> None:
    for parser in _parsers():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
                continue
            assert action.help, f"{parser.prog}: {action.option_strings or action.dest}"


def test_list_impls_shows_every_builtin_with_family_and_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["list-impls"]) == 0
    out, _ = out_err(capsys)
    for name, builtin in BUILTINS.items():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert f" {builtin.family.value} " in line, line
        if builtin.engine:
            assert "installed" in line or "not in this build" in line, line


def test_list_impls_fits_a_terminal_and_shows_every_profile_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real engines' profiles run to a few hundred characters: they are wrapped under
    their built-in's line, not spread over one table row, and nothing of them is cut.
    `--json` writes the same fields unwrapped."""
    out_json = tmp_path / "impls.json"
    assert main(["list-impls", "--json", str(out_json)]) == 0
    out, _ = out_err(capsys)
    assert max(len(line) for line in out.splitlines()) <= list_impls.WIDTH
    lines = out.split("\n\nseeded bugs")[0].splitlines()  # the built-ins, without the bugs
    written = json.loads(out_json.read_text(encoding="utf-8"))["builtins"]
    assert [row["name"] for row in written] == list(BUILTINS)
    starts = [i for i, line in enumerate(lines) if not line.startswith(" ")][2:]
    assert len(starts) == len(written)
    for row, begin, end in zip(written, starts, [*starts[1:], len(lines)], strict=True):
        entry = " ".join(" ".join(lines[begin:end]).split())
        assert entry.startswith(f"{row['name']} {row['family']} {row['engine']} "), entry
        for field in ("description", "target", "profile"):
            assert " ".join(row[field].split()) in entry, (field, entry)
    assert any(len(row["profile"]) > list_impls.WIDTH for row in written)  # some do wrap


def test_list_impls_lists_the_shipped_seeded_bugs_with_their_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "impls.json"
    assert main(["list-impls", "--json", str(out_json)]) == 0
    out, _ = out_err(capsys)
    section = out.split("\n\nseeded bugs", 1)[1]
    written = json.loads(out_json.read_text(encoding="utf-8"))["seeded_bugs"]
    assert [b["target"] for b in written] == [b.target for b in SEEDED_BUGS + AR_SEEDED_BUGS]
    for bug in written:
        assert f"\n    {bug['target']}\n        {bug['rule']}: " in section, bug


def test_list_impls_refuses_a_json_path_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list-impls", "--json", str(tmp_path)]) == 2
    _, err = out_err(capsys)
    assert "--json" in err and "this is a directory" in err and err.count("\n") == 1, err


def test_list_impls_imports_neither_torch_nor_an_engine() -> None:
    """Naming the torch engine's built-ins' targets used to import `gpu.engine`, and so torch:
    `list-impls` took 3 s instead of half of one."""
    code = (
        "import sys; from schedspec_cli.main import main; main(['list-impls']); "
        "print(sorted(m for m in ('torch', 'vllm', 'sglang', 'vidur') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-1] == "[]", res.stdout[-2000:]
    assert any(line.startswith("engine ") for line in res.stdout.splitlines())


# ---------------------------------------------------------------------------- both families
def test_verify_an_ar_builtin_and_a_bare_ar_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "v.json"
    argv = ["verify", "--impl", "vidur-vllm", "--impl", "reference.ar.vidur:make_vidur_vllm"]
    assert main([*argv, "--examples", "5", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["family"] for r in data["results"]] == ["ar", "ar"]
    assert all(r["passed"] and r["examples"] >= 1 for r in data["results"])
    assert data["run"]["commit"] and data["run"]["date"]


def test_the_run_record_names_the_device_only_when_torch_was_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verify does not import torch to describe a pure-Python run; when an implementation
    loaded it (the torch engine picks CUDA when there is one) the record names the device."""
    import sys

    from schedspec_cli import meta

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert meta.run_metadata(with_device=False)["device"] == "not used"
    monkeypatch.setitem(sys.modules, "torch", sys)  # any loaded module under that name
    monkeypatch.setattr(meta, "device", lambda: "cuda: NVIDIA H200")
    recorded = meta.run_metadata(with_device=False)["device"]
    assert recorded.startswith("cuda: NVIDIA H200 (torch loaded by an implementation"), recorded


def test_a_factory_whose_family_cannot_be_told_needs_family(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["verify", "--impl", "tests.broken_adapters:no_family", "--examples", "3"]) == 2
    assert "--family dllm|ar" in out_err(capsys)[1]
    argv = ["verify", "--impl", "tests.broken_adapters:no_family", "--family", "dllm"]
    assert main([*argv, "--examples", "3"]) == 0


def test_a_factory_that_returns_no_adapter_is_an_input_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["verify", "--impl", "tests.broken_adapters:not_an_adapter", "--examples", "3"])
    _, err = out_err(capsys)
    assert code == 2, err
    assert "SchedulerAdapter" in err and "dict" in err and err.count("\n") == 1, err


def test_parity_without_torch_names_the_engine_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(engine_cmds, "module_available", lambda name: name != "torch")
    assert main(["parity", "--device", "cpu", "--prompts", "1"]) == 2
    _, err = out_err(capsys)
    assert "schedspec[engine]" in err and err.count("\n") == 1, err
    assert err.startswith("schedspec: error: parity needs torch, which is not installed here: ")


def test_install_engines_dispatches_lazily(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "module_available", lambda name: True)

    def run(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(cli, "load_object", lambda target, flag: run)
    assert main(["install-engines", "vidur"]) == 0
    assert main(["install-engines"]) == 0  # all
    # the value of `--jobs N` is not an engine name (it was refused as "unknown engine '2'")
    assert main(["install-engines", "--jobs", "2", "vidur"]) == 0
    assert seen == [["vidur"], [], ["--jobs", "2", "vidur"]]
    assert main(["install-engines", "--jobs", "2", "tensorrt"]) == 2
    assert "unknown engine 'tensorrt'" in out_err(capsys)[1]
    monkeypatch.setattr(cli, "module_available", lambda name: False)
    assert main(["install-engines", "vllm"]) == 2
    assert "integrations.install" in out_err(capsys)[1]


@pytest.mark.parametrize("stale", [False, True])
def test_a_missing_or_stale_engine_is_named_before_anything_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stale: bool,
) -> None:
    from integrations.manifest import STAMP

    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(tmp_path))
    other = tmp_path / "vidur-0.0.1-0123456789"
    if stale:  # an install made for other pins: another checkout's, or from before a pull
        other.mkdir()
        (other / STAMP).write_text(json.dumps({"engine": "vidur", "packages": ["vidur==0.0.1"]}))
    state = f"installed only for other pins, in {other}" if stale else "not installed"
    assert main(["verify", "--impl", "real-vidur-vllm", "--examples", "1"]) == 2
    _, err = out_err(capsys)
    assert f"vidur is {state}" in err and "schedspec install-engines vidur" in err, err
    assert err.count("\n") == 1, err
    assert main(["list-impls"]) == 0
    row = next(line for line in out_err(capsys)[0].splitlines() if "real-vidur-vllm" in line)
    assert ("other pins only" if stale else "not installed") in row, row


# ---------------------------------------------------------------------------- check-trace
DLLM_CFG = DllmConfig(block_size=2, page_size=4, kv_pages=4, max_context=8, mode=Mode.FDFO)


def dllm_trace(tmp_path: Path, *, header: bool = True, finish: bool = True) -> Path:
    h = Harness(make_scheduler, DLLM_CFG)
    h.submit(RequestSpec("a", (1, 2, 3), 3))
    if finish:
        h.drain()
    else:
        h.round()
    buf = io.StringIO()
    write_events(h.events, buf)
    path = tmp_path / "dllm.jsonl"
    head = json.dumps(config_to_dict(DLLM_CFG)) + "\n" if header else ""
    path.write_text(head + buf.getvalue())
    return path


def write_config(tmp_path: Path, **changes: object) -> Path:
    data = {k: v for k, v in config_to_dict(DLLM_CFG).items() if k != "kind"}
    data.update(changes)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    return p


def test_check_trace_header_and_config_must_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = dllm_trace(tmp_path)
    assert main(["check-trace", str(trace)]) == 0
    assert main(["check-trace", str(trace), "--config", str(write_config(tmp_path))]) == 0
    other = write_config(tmp_path, kv_pages=8)
    out_err(capsys)
    assert main(["check-trace", str(trace), "--config", str(other)]) == 2
    assert "disagree" in out_err(capsys)[1]
    bare = dllm_trace(tmp_path, header=False)
    assert main(["check-trace", str(bare), "--config", str(write_config(tmp_path))]) == 0
    out_err(capsys)
    assert main(["check-trace", str(bare)]) == 2
    # named by the file and the line that is no header, not by a --config never given
    err = out_err(capsys)[1]
    assert f"invalid file='{bare}:1': an event log whose first line is its config header" in err
    assert "(this line is not one), or pass --config" in err and err.count("\n") == 1, err


def test_check_trace_reports_work_still_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = dllm_trace(tmp_path, finish=False)
    assert main(["check-trace", str(trace)]) == 0
    assert "warning" in out_err(capsys)[0]
    assert main(["check-trace", str(trace), "--require-idle"]) == 1
    assert "--require-idle" in out_err(capsys)[0]


def ar_trace(tmp_path: Path, *, header: bool = True) -> tuple[Path, ArConfig]:
    cfg = ArConfig(
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=16,
        max_model_len=16,
        enable_chunked_prefill=False,
    )
    h = ArHarness(make_vidur_vllm, cfg)
    h.submit(ArRequest("a", 5, 3))
    h.submit(ArRequest("b", 3, 2))
    h.drain()
    buf = io.StringIO()
    write_ar_trace(h.events, buf, cfg if header else None)
    path = tmp_path / "ar.jsonl"
    path.write_text(buf.getvalue())
    return path, cfg


def test_check_trace_dispatches_an_ar_trace_by_its_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, _ = ar_trace(tmp_path)
    assert main(["check-trace", str(trace)]) == 0
    out, _ = out_err(capsys)
    assert "steps conform" in out
    assert main(["check-trace", str(trace), "--family", "dllm"]) == 2
    err = out_err(capsys)[1]
    assert "invalid --family='dllm': the trace's family, which its header line says is ar" in err
    assert "pass --family ar or drop it" in err, err
    bad = tmp_path / "bad.jsonl"
    lines = trace.read_text().splitlines()
    events = [json.loads(x) for x in lines[1:]]
    first_alloc = next(i for i, e in enumerate(events) if e["kind"] == "ar_blocks_allocated")
    del events[first_alloc]  # schedule tokens without blocks
    bad.write_text("\n".join([lines[0], *map(json.dumps, events)]) + "\n")
    assert main(["check-trace", str(bad)]) == 1
    assert "FAIL" in out_err(capsys)[0]


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (ConnectionError("no route to the cluster"), "schedspec: error: no route to the cluster"),
        (
            PermissionError(13, "Permission denied", "/out/report.json"),
            "schedspec: error: /out/report.json: Permission denied",
        ),
    ],
)
def test_an_unforeseen_os_error_is_one_line_exit_2(
    error: OSError, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError no check foresaw (disk full, permissions, a connection) is one line, with the
    file when it has one (a file-less error once printed `error::`)."""

    def fail(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(list_impls, "run", fail)
    assert main(["list-impls"]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_forward_costs_is_not_refused_for_a_page_size_it_never_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bench engine --forward-costs --block-size 3` used to be refused for the default
    `--page-size=16`, a flag that mode does not read; the benchmark itself is stubbed here."""
    ran: list[list[str]] = []

    def bench_main(argv: list[str]) -> int:
        ran.append(argv)
        return 0

    monkeypatch.setattr(engine_cmds, "load_object", lambda target, flag: bench_main)
    argv = ["bench", "engine", "--forward-costs", "--block-size", "3"]
    assert main(argv) == 0
    assert ran == [argv[2:]]


def test_the_prove_json_says_what_was_proved_at_which_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CI artifact of `prove` names its bound, its families and the run (commit, versions,
    date), as `verify`'s does; it held only the results before. The table's cut details say
    they are cut."""
    out = tmp_path / "prove.json"
    assert main(["prove", "--family", "bmc", "--bound", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["bound"] == 1 and report["families"] == ["bmc"]
    assert {"commit", "date", "versions"} <= set(report["run"])
    assert report["proofs"] and all(p["name"].startswith("bmc/") for p in report["proofs"])
    table = capsys.readouterr().out
    long = [p["detail"] for p in report["proofs"] if len(p["detail"]) > 70]
    assert long and long[0][:69] + "…" in table
