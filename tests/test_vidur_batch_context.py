"""What Vidur's real replica schedulers put in a batch's attention context (`Batch.num_kv_tokens`,
which Vidur's execution-time predictor reads beside `num_q_tokens`). No rule of the AR spec
states a batch's context yet, so these tests record the release's behaviour
(docs/engines/vidur.md, "What the built-ins cannot see of a change"):

- Sarathi, vLLM, FasterTransformer and LightLLM give each request the tokens Vidur counts as
  processed before the batch plus the batch's tokens for it (Vidur counts a request's first
  output as processed when its prefill ends, so a decode's context is one above the spec's
  computed tokens plus one);
- Mnemosyne gives the tokens processed before the batch (a first chunk's context is 0);
- Orca gives NONE for a request it admits: its `_get_next_batch` computes the context of a new
  request and never appends it, so `num_kv_tokens` is shorter than `requests`, and the
  predictor, pairing the two lists with `zip`, leaves that request's prefill out of the batch's
  attention time.

Needs `schedspec install-engines vidur` (as tests/test_real_vidur.py).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from integrations.vidur import MANIFEST, build
from integrations.vidur.fixes import vidur_fixed
from spec.ar.config import ArConfig, ArRequest


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    if not MANIFEST.installed():
        if os.environ.get("SCHEDSPEC_SKIP_ENGINES") == "1":
            pytest.skip("SCHEDSPEC_SKIP_ENGINES=1: real engines are not checked")
        pytest.fail(
            f"Vidur is not installed: run `schedspec install-engines vidur` ({MANIFEST.directory})"
        )
    MANIFEST.activate()


Row = tuple[int, int, int]  # (tokens processed before the batch, q tokens, kv tokens)


def batches(kind: str, chunked: bool) -> list[list[Row] | str]:
    """Each batch Vidur's `kind` forms for one request of an 8-token prompt and 3 outputs: per
    request, (processed before, q tokens, kv tokens), a KV-parallel batch's groups summed; a
    batch whose `num_kv_tokens` does not list every request is the string naming the counts."""
    config = ArConfig(
        reserve_null_block=False,
        enable_chunked_prefill=chunked,
        max_num_seqs=2,
        block_size=1 if kind == "lightllm" else 4,
        num_blocks=64,
        max_num_batched_tokens=4 if chunked else 32,
    )
    adapter: Any = build(kind, config, lambda event: None)
    scheduler = adapter.scheduler
    formed: list[list[Row] | str] = []
    on_schedule = scheduler.on_schedule

    def recording(time: float) -> Any:
        batch = on_schedule(time)
        if batch is None:
            return batch
        mapping = getattr(batch, "batch_mapping", None)
        groups = list(mapping.values()) if mapping is not None else [batch]
        rows: dict[int, list[int]] = {}
        for group in groups:
            if len(group.num_kv_tokens) != len(group.requests):
                formed.append(
                    f"{len(group.requests)} requests, {len(group.num_q_tokens)} q entries, "
                    f"{len(group.num_kv_tokens)} kv entries"
                )
                return batch
            for request, q, kv in zip(
                group.requests, group.num_q_tokens, group.num_kv_tokens, strict=True
            ):
                row = rows.setdefault(request.id, [request.num_processed_tokens, q, 0])
                row[2] += kv
        formed.append([(p, q, kv) for p, q, kv in rows.values()])
        return batch

    scheduler.on_schedule = recording
    adapter.submit(ArRequest("r0", prompt_len=8, max_tokens=3))
    for _ in range(8):
        if adapter.is_idle():
            break
        adapter.step()
    return formed


@pytest.mark.parametrize(
    ("kind", "chunked"), [("sarathi", True), ("vllm", False), ("ft", False), ("lightllm", False)]
)
def test_the_context_counts_the_batch_tokens(kind: str, chunked: bool) -> None:
    formed = batches(kind, chunked)
    assert formed and all(isinstance(b, list) for b in formed), formed
    for batch in formed:
        assert isinstance(batch, list)
        for processed, q, kv in batch:
            assert kv == processed + q, (kind, formed)
    decodes = [row for b in formed if isinstance(b, list) for row in b if row[1] == 1]
    # the first decode after an 8-token prefill: Vidur counts 9 processed (the prefill's output)
    assert decodes and decodes[0] == (9, 1, 10), (kind, formed)


def test_mnemosyne_counts_the_context_before_the_batch() -> None:
    with vidur_fixed(["mnemosyne-prefill-assert"]):  # 0.0.25 asserts at each prefill's end
        formed = batches("mnemosyne", chunked=True)
    prefill = [b for b in formed if isinstance(b, list) and b[0][1] > 1]
    assert [b[0] for b in prefill] == [(0, 4, 0), (4, 4, 4)], formed


def test_orca_leaves_an_admitted_request_out_of_the_context() -> None:
    """The finding: the batch that admits the request lists no context for it; the decodes,
    formed from Orca's preempted list, do."""
    formed = batches("orca", chunked=False)
    assert formed[0] == "1 requests, 1 q entries, 0 kv entries", formed
    decodes = formed[1:]
    assert decodes and all(isinstance(b, list) and b[0][2] == b[0][0] + 1 for b in decodes), formed
