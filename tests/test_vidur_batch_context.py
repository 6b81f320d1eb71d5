"""The AR rule `batch_context` on Vidur's real replica schedulers: the attention context a batch
records for each request it schedules (`Batch.num_kv_tokens`, read by Vidur's execution-time
predictor), counted as the kind declares (`integrations.vidur.batch_context`).

- Sarathi, vLLM, FasterTransformer and LightLLM count the tokens processed before the batch plus
  the batch's tokens; Vidur counts a request's first output processed when its prefill ends, so
  an 8-token prompt's first decode has a context of 10. Mnemosyne counts the tokens processed
  before the batch (a first chunk's context is 0).
- Orca's finding: it records no context for a request it admits (`orca-batch-context` fixes it).
- A subclass that miscounts is caught, naming the count its kind declares.

Needs `schedspec install-engines vidur` (skipped with SCHEDSPEC_SKIP_ENGINES=1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integrations.vidur import (
    MANIFEST,
    REAL_VIDUR_FT,
    REAL_VIDUR_LIGHTLLM,
    REAL_VIDUR_MNEMOSYNE,
    REAL_VIDUR_ORCA,
    REAL_VIDUR_SARATHI,
    REAL_VIDUR_VLLM,
    build,
)
from integrations.vidur.custom_scheduler import SCHEDULER_VARIABLE
from integrations.vidur.fixes import FIXES_OF, vidur_fixed
from spec.ar.config import ArConfig, ArRequest
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from tests.engine_gate import require_engine
from tests.test_real_vidur import harness, violation
from tests.user_module import verify_run, write_user_module


@pytest.fixture(scope="module", autouse=True)
def _vidur_installed() -> None:
    require_engine(MANIFEST, "vidur", "Vidur")
    MANIFEST.activate()


def config(kind: str) -> ArConfig:
    """A pool of 64 blocks; Sarathi and Mnemosyne in chunks of 4 tokens, the others whole."""
    chunked = kind in ("sarathi", "mnemosyne")
    return ArConfig(
        reserve_null_block=False,
        enable_chunked_prefill=chunked,
        max_num_seqs=2,
        block_size=1 if kind == "lightllm" else 4,
        num_blocks=64,
        max_num_batched_tokens=4 if chunked else 32,
    )


IMPL_OF: dict[str, ArImplementation] = {
    "sarathi": REAL_VIDUR_SARATHI,
    "vllm": REAL_VIDUR_VLLM,
    "ft": REAL_VIDUR_FT,
    "lightllm": REAL_VIDUR_LIGHTLLM,
    "orca": REAL_VIDUR_ORCA,
    "mnemosyne": REAL_VIDUR_MNEMOSYNE,
}


def run(kind: str, *requests: ArRequest) -> SpecViolation | None:
    """Submit `requests` to a harness of Vidur's `kind` and drain; the violation, or None."""
    return violation(harness(IMPL_OF[kind], config(kind)), *requests)


TWO = (ArRequest("r0", 8, 3), ArRequest("r1", 5, 2))


@pytest.mark.parametrize("kind", ["sarathi", "vllm", "ft", "lightllm", "mnemosyne"])
def test_each_kind_records_each_context_as_it_counts(kind: str) -> None:
    """batch_context holds with the fixes of the kind's findings (none touches a context:
    FasterTransformer's frees, Mnemosyne's prefill assertion, ...)."""
    with vidur_fixed(FIXES_OF[kind]):
        assert run(kind, *TWO) is None


def contexts(kind: str) -> list[tuple[list[int], list[int]]]:
    """(num_q_tokens, num_kv_tokens) of each batch Vidur's `kind` forms for one request of an
    8-token prompt and 3 outputs."""
    adapter: Any = build(kind, config(kind), lambda event: None)
    formed: list[tuple[list[int], list[int]]] = []
    on_schedule = adapter.scheduler.on_schedule

    def recording(time: float) -> Any:
        batch = on_schedule(time)
        if batch is not None:
            formed.append((list(batch.num_q_tokens), list(batch.num_kv_tokens)))
        return batch

    adapter.scheduler.on_schedule = recording
    adapter.submit(ArRequest("r0", prompt_len=8, max_tokens=3))
    adapter.drain(20)
    return formed


def test_a_decode_context_counts_the_first_output_as_processed() -> None:
    """The two counts, as docs/engines/vidur.md states them: Sarathi's chunks and decodes,
    the decode one above the 9 tokens whose KV it reads and writes."""
    assert contexts("sarathi") == [([4], [4]), ([4], [8]), ([1], [10]), ([1], [11])]


def test_orca_records_no_context_for_a_request_it_admits() -> None:
    """The finding: the batch that admits a request lists no context for it (the decodes,
    formed from Orca's preempted list, do), so Vidur's predictor, pairing the lists with zip,
    leaves its prefill out of the batch's time. `batch_context` fails at that batch; with
    `orca-batch-context` the run conforms."""
    found = run("orca", ArRequest("r0", 8, 3))
    assert found is not None and found.rule == "batch_context", found
    assert (
        "Vidur's batch schedules 1 request (1 q-token entries) but records 0 attention contexts "
        "(Batch.num_kv_tokens); past the last context: 'r0' (Vidur request"
    ) in str(found)
    with vidur_fixed(["orca-batch-context"]):
        assert run("orca", *TWO) is None


#: A Sarathi change that leaves the batch's own tokens out of each context.
MISCOUNTS = """
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler


class ContextWithoutTheBatch(SarathiReplicaScheduler):
    def _get_next_batch(self, time):
        batch = super()._get_next_batch(time)
        if batch is not None:
            batch._num_kv_tokens = [
                kv - q for kv, q in zip(batch.num_kv_tokens, batch.num_q_tokens)
            ]
        return batch
"""


def test_a_subclass_that_miscounts_the_context_fails_batch_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_module(tmp_path, monkeypatch, "my_context", MISCOUNTS)
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_context.ContextWithoutTheBatch")
    code, out, _, data = verify_run(capsys, tmp_path, "real-vidur-sarathi", 30)
    assert code == 1, out
    assert data["rules"] == ["batch_context"], out[-3000:]
    assert "with an attention context of 0 (Batch.num_kv_tokens), where sarathi's count" in out
    assert (
        "the tokens processed before the batch plus the batch's tokens, is 1 (0 processed + 1)"
        in out
    )
