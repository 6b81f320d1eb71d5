"""A Vidur maintainer's replica scheduler subclasses the adapter and the pipeline script met
badly before, each checked against a control:

- a class keeping pending requests outside `_request_queue` (a staging list) is refused at an
  abort (`CannotDrive`, exit 2 in `verify`), not reported as a waiting queue that differs;
- an `allocate` that hands out more blocks than the pool has free is `kv_exclusive` naming
  the numbers, not an IndexError inside the adapter (`implementation_error`);
- `scripts/vidur_pipeline_check.py` names the class it ran (header, JSON, the rerun command,
  which then fails as printed), tells which `--kinds` a class of one kind runs as, imports a
  module from the current directory, and refuses a negative `--seed`.

Needs Vidur installed (`schedspec install-engines vidur`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from integrations.vidur import MANIFEST, REAL_VIDUR_SARATHI, REAL_VIDUR_VLLM
from integrations.vidur.custom_scheduler import SCHEDULER_VARIABLE
from properties.ar.harness import ArHarness
from spec.ar.config import ArConfig, ArRequest
from spec.errors import CannotDrive, SpecViolation
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.user_module import verify_run, write_user_module

check = load_script("vidur_pipeline_check")

MODULE = "rv_vidur_user"

#: The user's module: one correct subclass per kind driven here and the reviewer's classes.
USER_MODULE = """
from vidur.scheduler.replica_scheduler.base_replica_scheduler import BaseReplicaScheduler
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler
from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler


class PlainSarathi(SarathiReplicaScheduler):
    pass


class PlainVLLM(VLLMReplicaScheduler):
    pass


class StagedSarathi(SarathiReplicaScheduler):
    \"\"\"Correct scheduling, but new requests sit in a staging list until the next schedule.\"\"\"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._staging = []

    def add_request(self, request):
        self._staging.append(request)

    def get_pending_requests(self):
        return self._request_queue + self._staging

    @property
    def num_pending_requests(self):
        return len(self._request_queue) + len(self._staging)

    def _get_next_batch(self, time):
        self._request_queue.extend(self._staging)
        self._staging = []
        return super()._get_next_batch(time)


class BeyondPoolVLLM(VLLMReplicaScheduler):
    \"\"\"Admission ignores the pool and allocate() lost its assertion.\"\"\"

    def _can_allocate_request(self, request):
        return True

    def allocate(self, request_id, num_blocks):
        self._num_allocated_blocks += num_blocks
        self._allocation_map[request_id] = self._allocation_map.get(request_id, 0) + num_blocks


class NeverFreesOnFinish(VLLMReplicaScheduler):
    \"\"\"Completed requests keep their blocks.\"\"\"

    def on_batch_end(self, batch):
        BaseReplicaScheduler.on_batch_end(self, batch)
        for request in batch.requests:
            if not request.completed:
                self._preempted_requests.append(request)
"""


@pytest.fixture(autouse=True, scope="module")
def _vidur_installed() -> None:
    require_engine(MANIFEST, "vidur", "Vidur")


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's module, importable as `rv_vidur_user` (fresh in each test)."""
    return write_user_module(tmp_path, monkeypatch, MODULE, USER_MODULE)


def _use(monkeypatch: pytest.MonkeyPatch, cls: str) -> None:
    monkeypatch.setenv(SCHEDULER_VARIABLE, f"{MODULE}.{cls}")


def _config(**kw: object) -> ArConfig:
    base: dict[str, object] = {
        "block_size": 1,
        "num_blocks": 3,
        "reserve_null_block": False,
        "max_num_batched_tokens": 4,
        "max_num_seqs": 2,
        "max_model_len": 4,
        "enable_chunked_prefill": False,
    }
    base.update(kw)
    return ArConfig(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------ pending requests held elsewhere
@pytest.mark.usefixtures("user_module")
def test_an_abort_of_a_request_pending_outside_the_request_queue_cannot_be_driven(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the abort left the request in the class's staging list and the next snapshot
    differed (`snapshot_matches`, waiting ['r0'] against []): a misleading finding."""
    config = _config(enable_chunked_prefill=True)
    _use(monkeypatch, "PlainSarathi")  # the control: Vidur's own queue, aborted cleanly
    plain = ArHarness(REAL_VIDUR_SARATHI.factory, config)
    plain.guarded("submit", plain.submit, ArRequest("r0", 2, 1))
    assert plain.guarded("abort", plain.abort, "r0") is None
    assert plain.impl.snapshot().waiting == () and plain.violation is None

    _use(monkeypatch, "StagedSarathi")
    staged = ArHarness(REAL_VIDUR_SARATHI.factory, config)
    staged.guarded("submit", staged.submit, ArRequest("r0", 2, 1))
    with pytest.raises(CannotDrive) as refused:
        staged.guarded("abort", staged.abort, "r0")
    message = str(refused.value)
    assert "\n" not in message, message
    assert message.startswith(f"{MODULE}.StagedSarathi still lists 'r0' (Vidur request "), message
    assert "in get_pending_requests() after the adapter's abort removed it from _request_queue" in (
        message
    )
    assert "keep pending requests in _request_queue, as Vidur's own replica schedulers do" in (
        message
    )
    assert staged.violation is None  # no rule broken: the adapter's limit


@pytest.mark.usefixtures("user_module")
def test_verify_refuses_such_a_class_in_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use(monkeypatch, "StagedSarathi")
    code, out, err, _ = verify_run(capsys, tmp_path, "real-vidur-sarathi", 100)
    assert code == 2 and not out, out[-3000:]
    assert err.count("\n") == 1, err
    assert f"{MODULE}.StagedSarathi still lists 'r" in err, err
    assert "keep pending requests in _request_queue" in err and "snapshot_matches" not in err


# ------------------------------------------------------------ allocating past the pool
BEYOND = re.compile(
    r"\[kv_exclusive\] '(r\d+)' \(Vidur request \d+\) was given (\d+) more blocks? with only "
    r"(\d+) free of a pool of (\d+) "
)


@pytest.mark.usefixtures("user_module")
def test_allocating_past_the_pool_is_kv_exclusive_naming_the_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool of 3 blocks: r0 takes 1, then r1's 3-token prompt is given 3 with 2 free. Before,
    the adapter's block names ran out: IndexError, reported as `implementation_error`."""
    requests = (ArRequest("r0", 1, 1), ArRequest("r1", 3, 1))
    monkeypatch.delenv(SCHEDULER_VARIABLE, raising=False)  # the control: Vidur's own vLLM
    stock = ArHarness(REAL_VIDUR_VLLM.factory, _config())
    for r in requests:
        stock.guarded("submit", stock.submit, r)
    stock.guarded("drain", stock.drain, 20)
    assert stock.violation is None

    _use(monkeypatch, "BeyondPoolVLLM")
    h = ArHarness(REAL_VIDUR_VLLM.factory, _config())
    for r in requests:
        h.guarded("submit", h.submit, r)
    with pytest.raises(SpecViolation) as found:
        h.guarded("step", h.step)
    assert found.value.rule == "kv_exclusive" and h.violation is found.value
    message = str(found.value)
    assert message.startswith("[kv_exclusive] 'r1' (Vidur request "), message
    numbers = "was given 3 more blocks with only 2 free of a pool of 3 (its _allocation_map"
    assert f"{numbers} entry went from 0 to 3)" in message, message


@pytest.mark.usefixtures("user_module")
def test_verify_reports_the_pool_overrun_as_kv_exclusive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use(monkeypatch, "BeyondPoolVLLM")
    code, out, _, data = verify_run(capsys, tmp_path, "real-vidur-vllm", 100, ["--seed", "0"])
    assert code == 1, out[-3000:]
    assert data["rules"] == ["kv_exclusive"], out[-3000:]
    assert "IndexError" not in out and "implementation_error" not in out, out[-3000:]
    match = BEYOND.search(out)
    assert match is not None, out[-3000:]
    wanted, free, pool = (int(n) for n in match.groups()[1:])
    assert wanted > free and free < pool, match.group(0)


# ------------------------------------------------------------ the pipeline script
def _one_line_refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`check.main(argv)`'s usage error: exit 2 and one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as exited:
        check.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("scripts/vidur_pipeline_check.py: error: "), err
    return err


@pytest.mark.usefixtures("user_module")
def test_the_script_names_the_class_and_its_rerun_line_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the header and the JSON named Vidur alone and the rerun line lacked the
    variable, so running it as printed checked Vidur's own class and passed."""
    _use(monkeypatch, "NeverFreesOnFinish")
    out_json = tmp_path / "pipeline.json"
    argv = ["--kinds", "vllm", "--stages", "2", "--programs", "2", "--json", str(out_json)]
    assert check.main(argv) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        f"Vidur {MANIFEST.version}, with its fixes, scheduler_cls {MODULE}.NeverFreesOnFinish\n"
    ), out
    assert json.loads(out_json.read_text())["scheduler_cls"] == f"{MODULE}.NeverFreesOnFinish"
    again = out.split("  again: ")[1].splitlines()[0].split()
    assert again[:2] == [
        f"{SCHEDULER_VARIABLE}={MODULE}.NeverFreesOnFinish",
        "scripts/vidur_pipeline_check.py",
    ], again
    assert check.main(again[2:]) == 1  # as printed: the class again, the same failure
    assert "vllm       2       1         0" in capsys.readouterr().out
    monkeypatch.delenv(SCHEDULER_VARIABLE)  # what the line ran before: Vidur's own vLLM
    assert check.main(again[2:]) == 0
    out = capsys.readouterr().out
    assert "scheduler_cls" not in out and "again:" not in out, out


@pytest.mark.usefixtures("user_module")
@pytest.mark.parametrize(
    ("kinds", "says"),
    [
        ([], "and without --kinds every kind runs (vllm,sarathi,orca,ft,mnemosyne)"),
        (["--kinds", "vllm,sarathi"], "not a sarathi one"),
    ],
)
def test_a_class_of_one_kind_is_told_which_kinds_to_pass(
    kinds: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `error: invalid SCHEDSPEC_VIDUR_SCHEDULER_CLS=...: a subclass of ..., the class
    real-vidur-sarathi builds`, naming neither `--kinds` nor the class's kind."""
    _use(monkeypatch, "NeverFreesOnFinish")
    err = _one_line_refusal([*kinds, "--stages", "2", "--programs", "1"], capsys)
    assert (
        f"--kinds: {SCHEDULER_VARIABLE}={MODULE}.NeverFreesOnFinish is a vllm replica scheduler, "
        f"{says}: pass --kinds vllm"
    ) in err, err
    assert check.main(["--kinds", "vllm", "--stages", "2", "--programs", "1"]) == 1  # as told


def test_a_module_in_the_current_directory_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `schedspec verify` finds it (its loader puts the current directory on sys.path);
    run as a script, only scripts/ is on the path, and before the module did not import."""
    (tmp_path / f"{MODULE}.py").write_text(USER_MODULE, encoding="utf-8")
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    _use(monkeypatch, "PlainVLLM")
    assert check.main(["--kinds", "vllm", "--stages", "2", "--programs", "2"]) == 0
    assert f"scheduler_cls {MODULE}.PlainVLLM" in capsys.readouterr().out


@pytest.mark.parametrize("seed", ["-1", "-7"])
def test_a_negative_seed_is_refused_in_one_line(
    seed: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(SCHEDULER_VARIABLE, raising=False)
    err = _one_line_refusal(["--kinds", "vllm", "--stages", "2", "--seed", seed], capsys)
    assert f"--seed: a program's number, >= 0 (as a failure names it), not {seed}" in err, err
    assert check.main(["--kinds", "vllm", "--stages", "2", "--seed", "0"]) == 0  # the control
