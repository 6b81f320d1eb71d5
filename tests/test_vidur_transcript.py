"""The Vidur adapter's transcript (`VidurAdapter.native_calls`, `integrations.vidur.transcript`):
a failing example of `verify --impl real-vidur-<kind>` ends with the example in Vidur's own
calls; a passing run says each request once and each step's `on_schedule` / `on_batch_end`;
a field it cannot read is a line, never an exception.

Needs Vidur installed (`schedspec install-engines vidur`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vidur import MANIFEST, build
from integrations.vidur.custom_scheduler import SCHEDULER_VARIABLE
from integrations.vidur.fixes import FIXES_OF, vidur_fixed
from integrations.vidur.manifest import KINDS_OF
from integrations.vidur.transcript import VidurTranscript
from properties.conformance_base import CALLS_NOTE, NATIVE_NOTE
from schedspec_cli.main import main
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent, ArFinished, ArScheduled, ArStepEnd
from tests.engine_gate import require_engine
from tests.tier import full_tier

#: A Sarathi subclass with a planted leak: `free` keeps one block of each freed request in the
#: allocated count (`snapshot_matches` fails at the first request that ends).
USER_MODULE = """
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler


class LeaksOnFree(SarathiReplicaScheduler):
    def free(self, *request_ids):
        for request_id in request_ids:
            self._num_allocated_blocks -= self._allocation_map.pop(request_id) - 1
"""


@pytest.fixture(autouse=True, scope="module")
def _vidur_installed() -> None:
    require_engine(MANIFEST, "vidur", "Vidur")


@pytest.fixture
def leaks_on_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`my_vidur.LeaksOnFree` importable and named in SCHEDSPEC_VIDUR_SCHEDULER_CLS."""
    (tmp_path / "my_vidur.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_vidur", raising=False)
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_vidur.LeaksOnFree")


def _verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str
) -> tuple[int, str, list[str], list[str]]:
    """`verify --impl impl --examples 100`: exit code, stdout, rules violated, and the lines
    printed after `NATIVE_NOTE` (the adapter's transcript) up to the next blank line or the
    known fixes' verdict."""
    out_json = tmp_path / "verify.json"
    code = main(["verify", "--impl", impl, "--examples", "100", "--json", str(out_json)])
    out = capsys.readouterr().out
    rules = json.loads(out_json.read_text())["rules"] if out_json.exists() else []
    assert NATIVE_NOTE in out, out[-3000:]
    assert out.index(CALLS_NOTE) < out.index(NATIVE_NOTE), out[-3000:]
    native = out.split(NATIVE_NOTE, 1)[1].lstrip("\n").split("\n\n", 1)[0]
    # the known fixes' verdict, when tried, follows the program under its own header
    return code, out, rules, native.split("\n--- known fixes ---", 1)[0].splitlines()


def _line(native: list[str], start: str) -> str:
    """The first transcript line starting with `start`."""
    found = [line for line in native if line.startswith(start)]
    assert found, (start, native)
    return found[0]


def test_a_planted_leak_ends_with_vidurs_own_calls(
    leaks_on_free: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The counterexample of a user's subclass is said in Vidur's calls: the subclass built
    (its own name, the Vidur class it subclasses, its settings), the requests added under
    Vidur's ids, the batch `on_schedule` formed with its allocations, and the `free` inside
    `on_batch_end` where the leak is."""
    code, out, rules, native = _verify(capsys, tmp_path, "real-vidur-sarathi")
    assert code == 1 and rules == ["snapshot_matches"], out[-3000:]
    assert native[0].startswith(
        "sched = LeaksOnFree(...)  # my_vidur.LeaksOnFree, subclassing Vidur's "
        "SarathiReplicaScheduler; block_size="
    ), native
    for setting in ("num_blocks=", "watermark_blocks_fraction=", "batch_size_cap=", "chunk_size="):
        assert setting in native[0], native[0]
    added = _line(native, "sched.add_request(Request(arrived_at=0.0, num_prefill_tokens=")
    assert added.endswith(" (r0)"), added
    scheduled = _line(native, "batch = sched.on_schedule(0.0)  # Batch ")
    assert " (r0) " in scheduled and " q token" in scheduled, scheduled
    assert "during it: allocate(" in scheduled, scheduled
    ended = _line(native, "sched.on_batch_end(batch)  # at t=1.0, ")
    assert "completed: " in ended and "free(" in ended, ended
    assert not any("could not" in line for line in native), native


@full_tier  # a second case / control: per push the other tests cover it
def test_orcas_known_finding_ends_with_vidurs_own_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The built-in Orca's first finding (no attention context recorded for the request its
    first batch admits, batch_context) is said in Vidur's calls, ending with that batch's
    `on_schedule`, and named as known with its fix."""
    code, out, rules, native = _verify(capsys, tmp_path, "real-vidur-orca")
    assert code == 1 and rules == ["batch_context"], out[-3000:]
    assert native[0].startswith("sched = OrcaReplicaScheduler(...)  # block_size="), native
    _line(native, "sched.add_request(Request(arrived_at=0.0, ")
    assert _line(native, "batch = sched.on_schedule(") and "q token" in native[-1], native
    assert "--- known fixes ---\nKNOWN FINDING: this program passes with the engine fix " in out
    assert "`orca-batch-context`" in out.split("--- known fixes ---", 1)[1]


def _config(kind: str) -> ArConfig:
    """A small pool the kind's profile accepts (LightLLM counts tokens: blocks of one; Sarathi
    and Mnemosyne always chunk)."""
    block = 1 if kind == "lightllm" else 2
    return ArConfig(
        block_size=block,
        num_blocks=10 // block,
        reserve_null_block=False,
        enable_chunked_prefill=kind in ("sarathi", "mnemosyne"),
        max_num_seqs=3,
        max_num_batched_tokens=16,
        max_model_len=10,
    )


@pytest.mark.parametrize("kind", KINDS_OF[MANIFEST.version])
def test_a_passing_run_says_each_request_once_and_each_step(kind: str) -> None:
    """Driven directly with the kind's fixes (a run that passes): one `add_request` per
    submitted request under its spec id, one `on_schedule` per step with the batch the
    adapter reported, one `on_batch_end` per batch, each request completed once."""
    events: list[ArEvent] = []
    with vidur_fixed(FIXES_OF[kind]):
        adapter: Any = build(kind, _config(kind), events.append)
        for i in range(3):
            adapter.submit(ArRequest(request_id=f"r{i}", prompt_len=3, max_tokens=3))
        adapter.step()
        adapter.submit(ArRequest(request_id="r3", prompt_len=2, max_tokens=2))
        adapter.drain(200)
    native = adapter.native_calls().splitlines()
    own = type(adapter.scheduler).__name__
    assert native[0].startswith(f"sched = {own}(...)  # block_size="), native[0]
    added = [line for line in native if line.startswith("sched.add_request(Request(")]
    assert [line.rsplit("(", 1)[1] for line in added] == ["r0)", "r1)", "r2)", "r3)"], added
    schedules = [line for line in native if line.startswith("batch = sched.on_schedule(")]
    assert len(schedules) == adapter.step_index, native
    batches = [line for line in schedules if "# Batch " in line]
    scheduled_steps = {
        sum(isinstance(e, ArStepEnd) for e in events[:i])
        for i, e in enumerate(events)
        if isinstance(e, ArScheduled)
    }
    assert len(batches) == len(scheduled_steps), native
    assert sum(line.startswith("sched.on_batch_end(batch)") for line in native) == len(batches)
    completed = " ".join(
        line.split("completed: ", 1)[1] for line in native if "completed: " in line
    )
    for i in range(4):
        assert completed.count(f"(r{i})") == 1, native
    assert sum(isinstance(e, ArFinished) for e in events) == 4
    assert not any("could not" in line or "did not return" in line for line in native), native


def test_a_field_it_cannot_read_is_a_line() -> None:
    """A scheduler without the fields the construction line reads, and a request without the
    fields `add_request`'s line reads, each give a line naming the field, never an exception."""
    sched = SimpleNamespace(_config=SimpleNamespace(num_blocks=4))
    transcript = VidurTranscript(sched, 1.0)
    transcript.added(SimpleNamespace(id=7), "r0").result = ()  # add_request returned

    def missing(vid: int) -> Any:
        raise KeyError(vid)

    transcript.freeing((7,), missing)  # whether it restarted cannot be known: said so
    lines = transcript.text().splitlines()
    assert lines[0].startswith("sched = SimpleNamespace(...)  # types.SimpleNamespace, no Vidur")
    assert "num_blocks=4" in lines[0] and "block_size=?" in lines[0], lines[0]
    for field in (
        "sched._replica_config.block_size",
        "sched._config.batch_size_cap",
        "sched._request_generator_config.max_tokens",
        "sched._max_batch_size",
        "Request.arrived_at",
        "Request.num_decode_tokens",
    ):
        assert any(
            line.startswith(f"# (the transcript could not read {field}: AttributeError")
            for line in lines
        ), (field, lines)
    added = _line(lines, "sched.add_request(Request(arrived_at=?, ")
    assert added.endswith(
        "# Request id 7 (r0); during it: (whether 7 (r0) was restarted: unknown), free(7)"
    ), added
    assert any(
        line.startswith("# (the transcript could not read request 7: KeyError") for line in lines
    )


def test_a_transcript_that_fails_keeps_the_finding(
    leaks_on_free: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A transcript whose reading of the scheduler and whose saying of a call raise still
    reports the planted leak as itself (not an implementation_error), each failure a line."""
    import integrations.vidur.transcript as transcript

    def broken(*_: object) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(transcript, "_construction", broken)
    monkeypatch.setattr(transcript.VidurTranscript, "_schedule_line", broken)
    code, out, rules, native = _verify(capsys, tmp_path, "real-vidur-sarathi")
    assert code == 1 and rules == ["snapshot_matches"], out[-3000:]
    assert native[0] == "sched = <a Vidur replica scheduler>(...)", native
    assert native[1] == "# (the transcript could not read the scheduler: RuntimeError: boom)"
    assert "# (_call_line could not describe this call: RuntimeError: boom)" in native, native
    _line(native, "sched.add_request(Request(arrived_at=0.0, ")
