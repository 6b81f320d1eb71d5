"""`schedspec parity --impl` for any dLLM implementation and `release-check --impl`: batch parity
at batch size 1 and > 1, golden agreement when the implementation has a golden decoder, leaks;
exit codes 0/1/2 with one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reference.dllm import ReferenceDllmScheduler, _Req
from reference.oracle import OracleRow
from schedspec_cli.main import main
from spec.adapter import EventSink
from spec.batch_parity import batch_sizes_clause
from spec.config import DllmConfig, Mode, RequestSpec
from spec.golden import GoldenDecoder
from spec.snapshot import Snapshot

ARGS = ["--prompts", "4", "--max-new-tokens", "12", "--block-size", "4", "--page-size", "8"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["parity", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_reference_passes_with_golden_and_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "ref.json"
    code, out, _ = _run(["--impl", "reference-dllm-joint", *ARGS, "--json", str(out_json)], capsys)
    assert code == 0, out
    data = json.loads(out_json.read_text())
    assert data["impl"] == "reference-dllm-joint"
    assert data["golden"] is True and data["golden_checked"] is True
    assert data["batch_sizes"] == [1, 4] and data["identical"] is True
    assert len(data["cases"]) == 4 and all(c["golden"] is True for c in data["cases"])
    assert "IDENTICAL, golden agrees" in out
    # the gate reads which implementation ran
    assert main(["release-check", str(out_json)]) == 1
    assert "produced for implementation 'reference-dllm-joint'" in capsys.readouterr().out
    assert main(["release-check", "--impl", "reference-dllm-joint", str(out_json)]) == 1
    refused = capsys.readouterr().out
    # refused for its short run only: a plain-Python scheduler runs no kernels, so no device
    assert "fewer than 128 new tokens" in refused and "produced for" not in refused
    assert "CUDA" not in refused


@pytest.mark.parametrize(
    ("impl", "says"),
    [
        ("bogus name", "names no implementation"),
        ("vllm-v1", "is an autoregressive built-in"),
    ],
)
def test_release_check_refuses_an_impl_that_parity_cannot_have_run(
    impl: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in `--impl` (or an AR built-in, which parity never runs) is a usage error in one
    line naming the valid choices, not a report "produced for another implementation"; a
    `module:attribute` is taken as given, so the report's own name decides."""
    report = tmp_path / "report.json"
    fields = {"device": "cpu", "identical": True, "golden": True, "leaked_slots": 0}
    fields |= {"leaked_rows": 0, "batch_sizes": [1, 4], "cases": []}
    report.write_text(json.dumps({"impl": "reference-dllm-joint", **fields}))
    assert main(["release-check", "--impl", impl, str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "reference-dllm-joint" in err and "module:attribute" in err
    assert len(err.splitlines()) == 1, err
    assert main(["release-check", "--impl", "mine:factory", str(report)]) == 1
    assert "produced for implementation 'reference-dllm-joint'" in capsys.readouterr().out


def test_one_prompt_says_batch_parity_was_not_exercised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With one prompt the batched runs never batch: the summary says so instead of listing a
    batch size of 1 twice, and the report is no release run."""
    one = ["--prompts", "1", *ARGS[2:]]
    out_json = tmp_path / "one.json"
    code, out, _ = _run(["--impl", "reference-dllm-joint", *one, "--json", str(out_json)], capsys)
    assert code == 0, out  # batch size 1 is still checked, and passes
    assert json.loads(out_json.read_text())["batch_sizes"] == [1, 1]
    summary = out.strip().splitlines()[-1]
    assert "batch parity not exercised: no batched run held two rows at once" in summary
    assert "batch sizes 1, 1" not in summary
    assert batch_sizes_clause([1, 4]) == "every mode at batch sizes 1, 4 vs sync at batch size 1"
    assert "not exercised" not in batch_sizes_clause([1, 2])


def test_events_are_checked_under_the_implementations_declared_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An implementation that gives rows back between rounds, as its profile declares, is at
    parity: its events are replayed under that policy, not the idealised spec (which refused
    them: `[row_exclusive] 'p000' is running without a row`)."""
    code, out, err = _run(["--impl", "reference-dllm-rows-released", *ARGS], capsys)
    assert code == 0, out + err
    assert "IDENTICAL, golden agrees" in out


def test_a_stale_context_bug_fails_on_golden(capsys: pytest.CaptureFixture[str]) -> None:
    """Sync and FDFO are corrupted alike: parity holds, golden does not -> exit 1."""
    code, out, _ = _run(["--impl", "reference.seeded_bugs:stale_context", *ARGS], capsys)
    assert code == 1
    assert "IDENTICAL, golden DIFFERS" in out and "differs from its golden output" in out


def test_a_run_that_breaks_a_rule_still_writes_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A seeded leak breaks `terminal_owns_nothing` inside a run, before outputs are compared:
    exit 1 as before, and `--json` now says why (it wrote nothing, so a CI job had no
    artifact)."""
    out_json = tmp_path / "leak.json"
    argv = ["--impl", "reference.seeded_bugs:no_free_on_finish", *ARGS, "--json", str(out_json)]
    code, _, err = _run(argv, capsys)
    assert code == 1 and "violation: [terminal_owns_nothing]" in err, err
    data = json.loads(out_json.read_text())
    assert data["identical"] is False and data["impl"] == "reference.seeded_bugs:no_free_on_finish"
    assert data["violation"]["rule"] == "terminal_owns_nothing", data
    assert "run" in data and "engine" not in data


class StaleUnderFdfo(ReferenceDllmScheduler):
    """The denoiser sees a stale context (without the last committed block) under FDFO only:
    FDFO's outputs differ from sync's."""

    def _oracle_row(self, req: _Req) -> OracleRow:
        row = super()._oracle_row(req)
        if self.config.mode is not Mode.FDFO:
            return row
        stale = row.context[: max(0, len(row.context) - self.config.block_size)]
        return OracleRow(row.request_id, stale, row.block_index, row.tokens, row.state)


def stale_under_fdfo(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    return StaleUnderFdfo(config, sink)


def test_a_mismatched_run_is_named_by_the_batch_size_it_ran_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prompts under `--batch 4`: the batched runs held two rows, so the report names them
    `@2` in `mismatched` as in `seconds` (it used to say `fdfo@4` there and `fdfo@2` here)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    out_json = tmp_path / "stale.json"
    two = ["--prompts", "2", "--batch", "4", *ARGS[2:], "--json", str(out_json)]
    code, out, _ = _run(["--impl", f"{__name__}:stale_under_fdfo", *two], capsys)
    assert code == 1, out
    data = json.loads(out_json.read_text())
    assert data["batch_sizes"] == [1, 2]
    named = {name for case in data["cases"] for name in case["mismatched"]}
    assert named and named <= set(data["seconds"]), (named, data["seconds"])
    assert any(name.endswith("@2") for name in named), named
    assert not any(name.endswith("@4") for name in named), named


class Plain:
    """The reference scheduler behind an adapter without `golden_output` (a foreign adapter)."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        self._inner = ReferenceDllmScheduler(config, sink)

    @property
    def config(self) -> DllmConfig:
        return self._inner.config

    def submit(self, request: RequestSpec) -> None:
        self._inner.submit(request)

    def abort(self, request_id: str) -> None:
        self._inner.abort(request_id)

    def run_round(self) -> None:
        self._inner.run_round()

    def drain(self, max_rounds: int = 100_000) -> None:
        self._inner.drain(max_rounds)

    def snapshot(self) -> Snapshot:
        return self._inner.snapshot()


def make_plain(config: DllmConfig, sink: EventSink) -> Plain:
    return Plain(config, sink)


def test_an_implementation_without_golden_is_checked_on_parity_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert not isinstance(make_plain(DllmConfig(), lambda e: None), GoldenDecoder)
    code, out, _ = _run(["--impl", "tests.test_cli_parity_impl:make_plain", *ARGS], capsys)
    assert code == 0, out
    assert "no golden decoder (golden_output) to compare with" in out


class CrashesInBatches(Plain):
    """Serves alone correctly; with more than one seat, its third submission raises its own
    error (a bug of the implementation, not a rule of the spec)."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        super().__init__(config, sink)
        self.submitted = 0

    def submit(self, request: RequestSpec) -> None:
        self.submitted += 1
        if self.config.max_running_requests > 1 and self.submitted == 3:
            raise IndexError("row table overflow")
        super().submit(request)


def make_crashing(config: DllmConfig, sink: EventSink) -> CrashesInBatches:
    return CrashesInBatches(config, sink)


def test_an_implementation_that_raises_is_a_violation_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its own exception is exit status 1 (the implementation failed), in one line naming the
    implementation, the run and the line that raised."""
    impl = "tests.test_cli_parity_impl:make_crashing"
    code, out, err = _run(["--impl", impl, *ARGS], capsys)
    assert code == 1, out + err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert (
        "[implementation_error]" in err and f"{impl} raised IndexError: row table overflow" in err
    )
    assert "during the sync@4 run" in err and "test_cli_parity_impl.py:" in err, err


class ExitsInBatches(CrashesInBatches):
    """As `CrashesInBatches`, but its third submission calls `sys.exit(0)`."""

    def submit(self, request: RequestSpec) -> None:
        self.submitted += 1
        if self.config.max_running_requests > 1 and self.submitted == 3:
            sys.exit(0)
        Plain.submit(self, request)


def make_exiting(config: DllmConfig, sink: EventSink) -> ExitsInBatches:
    return ExitsInBatches(config, sink)


def test_an_implementation_that_exits_fails_instead_of_passing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sys.exit(0)` inside the implementation would have ended the check with exit status 0
    and no verdict: it is an `implementation_error` like any exception of its own."""
    impl = "tests.test_cli_parity_impl:make_exiting"
    code, out, err = _run(["--impl", impl, *ARGS], capsys)
    assert code == 1, out + err
    assert f"[implementation_error] {impl} raised SystemExit: 0" in err, err
    assert "during the sync@4 run" in err, err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (
            ["--impl", "vllm-v1"],
            "impl='vllm-v1': an implementation of the dllm family here; built-in vllm-v1 is of "
            "the ar family",
        ),
        (["--impl", "no-such-impl"], "impl"),
        (["--impl", "reference-dllm", "--device", "cuda"], "--device"),
        (["--impl", "reference-dllm", "--algorithm", "LowConfidence"], "--algorithm"),
        (["--impl", "reference-dllm", "--batch", "1"], "--batch"),
        (["--impl", "reference-dllm", "--block-size", "4", "--page-size", "6"], "--page-size"),
    ],
)
def test_usage_errors_are_one_line(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(argv, capsys)
    assert code == 2 and flag in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_help_names_impl_and_batch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["parity", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--impl" in text and "--batch" in text and "golden" in text
