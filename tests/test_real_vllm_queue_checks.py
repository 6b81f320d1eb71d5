"""vLLM's own queues checked before the adapter rebuilds events from them: a scheduler class of
the user's own (`SCHEDSPEC_VLLM_SCHEDULER_CLS`) that corrupts `running` is reported under the
rule it breaks, with vLLM's queues in the message, never as an event vLLM did not decide nor as
a crash of the adapter's own reading; and an abort that vLLM does not end as aborted is a
finding.

- `RunningTwice` puts the request it scheduled on `running` a second time: before, the
  adapter (and the live `VllmEventLog`) rebuilt a second allocation of the request's blocks,
  which the spec then reported as `kv_exclusive`; now `seat_cap` (more entries than
  `max_num_seqs`) or `snapshot_matches` (a request listed twice).
- `AbortKeepsRunning` puts back on `running` the request `finish_requests` aborted (and
  freed, and dropped from `requests`): before, the adapter's `pool_view` raised `KeyError`,
  reported as the implementation's `implementation_error`; now `snapshot_matches`.
- `AbortStops` ends an abort as `FINISHED_STOPPED`: before, the adapter emitted `ArAborted`
  whatever vLLM set, and the suite passed; now `finish_condition`.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.custom_scheduler import SCHEDULER_VARIABLE
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent
from spec.errors import SpecViolation
from tests.engine_gate import require_engine
from tests.user_module import verify_run, write_user_module

USER_MODULE = '''
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus


class RunningTwice(Scheduler):
    """The first request a schedule() call scheduled is put on running a second time."""

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        for rid in out.num_scheduled_tokens:
            req = self.requests[rid]
            if sum(r is req for r in self.running) == 1:
                self.running.append(req)
            break
        return out


class AbortKeepsRunning(Scheduler):
    """A running request that finish_requests aborted is put back on running."""

    def finish_requests(self, request_ids, finished_status):
        running = list(self.running)
        ended = super().finish_requests(request_ids, finished_status)
        if finished_status == RequestStatus.FINISHED_ABORTED:
            self.running.extend(r for r in ended if any(r is s for s in running))
        return ended


class AbortStops(Scheduler):
    """An abort ends the request as stopped (a finish reason "stop" to its client)."""

    def finish_requests(self, request_ids, finished_status):
        if finished_status == RequestStatus.FINISHED_ABORTED:
            finished_status = RequestStatus.FINISHED_STOPPED
        return super().finish_requests(request_ids, finished_status)
'''

CONFIG = ArConfig(block_size=2, num_blocks=8, max_num_seqs=2, max_num_batched_tokens=8)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's module, importable as `queue_sched` (a fresh name per test directory)."""
    return write_user_module(tmp_path, monkeypatch, "queue_sched", USER_MODULE)


def _adapter(
    monkeypatch: pytest.MonkeyPatch, cls: str, config: ArConfig = CONFIG
) -> tuple[RealVllmScheduler, list[ArEvent]]:
    monkeypatch.setenv(SCHEDULER_VARIABLE, f"queue_sched.{cls}")
    events: list[ArEvent] = []
    return RealVllmScheduler(config, events.append), events


@pytest.mark.parametrize(
    ("max_num_seqs", "rule", "says"),
    [
        (
            1,
            "seat_cap",
            "vLLM's running queue has 2 entries ['r0', 'r0'] (r0 twice); max_num_seqs=1",
        ),
        (2, "snapshot_matches", "vLLM's running queue lists r0 twice: ['r0', 'r0']"),
    ],
)
def test_a_request_running_twice_is_named_not_rebuilt(
    max_num_seqs: int,
    rule: str,
    says: str,
    user_module: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = ArConfig(block_size=2, num_blocks=8, max_num_seqs=max_num_seqs)
    adapter, events = _adapter(monkeypatch, "RunningTwice", config)
    adapter.submit(ArRequest("r0", 3, 2))
    with pytest.raises(SpecViolation) as caught:
        adapter.step()
    assert caught.value.rule == rule, caught.value
    assert says in caught.value.detail and "after schedule() in step 0" in caught.value.detail
    assert [e.kind for e in events] == ["ar_submitted"]  # nothing rebuilt from the queues


def test_the_live_log_writes_no_event_rebuilt_from_a_corrupt_queue(
    user_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the log wrote the allocation vLLM never made (`ar_blocks_allocated` twice)."""
    from integrations.vllm.event_log import VllmEventLog

    adapter, _ = _adapter(monkeypatch, "RunningTwice")
    lines: list[str] = []
    VllmEventLog(adapter.sched, lines.append)
    adapter.submit(ArRequest("r0", 3, 2))
    with pytest.raises(SpecViolation, match=r"\[snapshot_matches\] after schedule\(\) in step 0"):
        adapter.step()
    assert [json.loads(line)["kind"] for line in lines] == ["config", "ar_submitted"]


def test_a_request_kept_running_after_its_abort_is_snapshot_matches_not_a_key_error(
    user_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter, _ = _adapter(monkeypatch, "AbortKeepsRunning")
    adapter.submit(ArRequest("r0", 3, 4))
    adapter.step()
    with pytest.raises(SpecViolation) as caught:
        adapter.abort("r0")
    assert caught.value.rule == "snapshot_matches", caught.value
    assert caught.value.detail.startswith(
        "after finish_requests(['r0'], FINISHED_ABORTED): vLLM's running queue holds r0, "
        "which its requests map no longer holds"
    ), caught.value.detail


def test_an_abort_vllm_ends_as_stopped_breaks_finish_condition(
    user_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter, events = _adapter(monkeypatch, "AbortStops")
    adapter.submit(ArRequest("r0", 3, 4))
    adapter.step()
    with pytest.raises(SpecViolation) as caught:
        adapter.abort("r0")
    assert caught.value.rule == "finish_condition", caught.value
    assert "left its status FINISHED_STOPPED, not FINISHED_ABORTED" in caught.value.detail
    assert "ar_aborted" not in [e.kind for e in events]


@pytest.mark.parametrize(
    ("cls", "rules"),
    [
        ("RunningTwice", {"seat_cap", "snapshot_matches"}),
        ("AbortKeepsRunning", {"snapshot_matches"}),
        ("AbortStops", {"finish_condition"}),
    ],
)
def test_verify_names_the_rule_the_class_breaks(
    cls: str,
    rules: set[str],
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SCHEDULER_VARIABLE, f"queue_sched.{cls}")
    code, out, _, data = verify_run(capsys, tmp_path, "real-vllm", 100)
    assert code == 1, out[-3000:]
    assert set(data["rules"]) <= rules, out[-3000:]
    assert "implementation_error" not in out and "KeyError" not in out, out[-3000:]
    assert "kv_exclusive" not in out, out[-3000:]
