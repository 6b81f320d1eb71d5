"""vLLM 0.33.0's KV connector with speculative decoding: the draft-block margin an
asynchronous load is admitted with (`_spec_decode_step_blocks`) is the same for every request,
so a request whose remote hit fills a pool that holds it whole is never admitted, nor anything
behind it (a minor finding), and the candidate fix `cap-draft-margin`
(`integrations.vllm.draft_margin_fix`), which caps the margin at what the request's first
decode step can need.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.draft_margin_fix import DRAFT_MARGIN_FIXES, apply_draft_margin_fix
from integrations.vllm.draft_margin_fix import fix_as_diff as margin_diff
from integrations.vllm.engine_core import (
    CoreProgram,
    CoreRun,
    EngineCoreLoop,
    EngineCoreViolation,
)
from integrations.vllm.kv_connector import RemoteKv, Transfer
from spec.ar.config import ArConfig, ArRequest
from tests.engine_gate import require_engine

LOOPS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


class _WholePrompts(RemoteKv):
    """Every prompt is in the store (`hit`) or none is; every load is asynchronous and
    succeeds at once, nothing is sent."""

    def __init__(self, *, hit: bool, block_size: int) -> None:
        super().__init__(0, block_size, sync_loads=False)
        self.hit: bool = hit

    def remote_tokens(self, request: Any) -> int:
        return int(request.num_prompt_tokens) if self.hit else 0

    def produces(self, rid: str) -> bool:
        return False

    def delay(self, transfer: Transfer) -> int:
        return 0

    def outcome(self, load: Transfer) -> str | int:
        return "ok"


@dataclass(frozen=True)
class _FillingLoad:
    """A request alone, its prompt all in the store, in a pool of `num_blocks` - 1 usable
    blocks of `block_size` tokens that holds it whole, where the released margin asks for a
    block more."""

    request: ArRequest
    block_size: int
    num_blocks: int
    max_model_len: int

    def run(
        self,
        *,
        async_scheduling: bool,
        extra_blocks: int = 0,
        hit: bool = True,
        fix: Callable[[Any], None] | None = None,
    ) -> CoreRun:
        """The loop over the request, 2 drafts a step, with `extra_blocks` more blocks and
        its prompt in the store (`hit`) or not; the loop's checks raise
        `EngineCoreViolation`."""
        config = ArConfig(
            block_size=self.block_size,
            num_blocks=self.num_blocks + extra_blocks,
            max_num_batched_tokens=12,
            max_num_seqs=2,
            max_model_len=self.max_model_len,
            long_prefill_token_threshold=0,
            enable_chunked_prefill=True,
        )
        loop = EngineCoreLoop(
            config,
            async_scheduling=async_scheduling,
            kv_connector="recompute",
            remote_kv=_WholePrompts(hit=hit, block_size=self.block_size),
            speculative_tokens=2,
            mutate=fix,
        )
        return loop.run(CoreProgram(config, ((self.request,),), ((),)))


FILLING_LOADS = pytest.mark.parametrize(
    "load",
    [
        # the margin (3 one-token blocks) is not capped at max_model_len: 4 + 3 > 6
        _FillingLoad(ArRequest("r0", 4, 2), 1, 7, 6),
        # nor at the request's own need: it samples its one token in its prefill, and never
        # decodes (program 69 of the random programs)
        _FillingLoad(ArRequest("r0", 4, 1), 4, 2, 5),
        # nor at where schedule() stops a decode's inputs: one below max_model_len, so its
        # first decode (from position 2, one token and a draft) stays in the first block
        # (program 126)
        _FillingLoad(ArRequest("r0", 2, 2), 4, 2, 5),
    ],
    ids=["past-max-model-len", "one-new-token", "inputs-stop-short"],
)


@LOOPS
@FILLING_LOADS
def test_finding_with_drafts_a_remote_hit_that_fills_the_pool_never_loads(
    async_scheduling: bool, load: _FillingLoad
) -> None:
    """With 2 drafts a step, an asynchronous load is admitted only if its blocks and one
    decode step's draft blocks (`_spec_decode_step_blocks`) fit in the free pool. In a pool
    that holds the request whole, the request whose prompt is all in the store waits for ever
    (`progress`, nothing running); the same request without the hit runs, and so does the hit
    with one block more."""
    with pytest.raises(EngineCoreViolation) as caught:
        load.run(async_scheduling=async_scheduling)
    assert caught.value.rule == "progress", caught.value
    assert "0 running, 1 waiting" in caught.value.detail, caught.value.detail
    unhit = load.run(async_scheduling=async_scheduling, hit=False)
    assert unhit.reasons["r0"] == "length" and unhit.loads == 0
    assert load.run(async_scheduling=async_scheduling, extra_blocks=1).loads == 1


@LOOPS
@FILLING_LOADS
def test_the_capped_margin_admits_the_load_that_fills_the_pool(
    async_scheduling: bool, load: _FillingLoad
) -> None:
    """With `cap-draft-margin` each of those loads is admitted in the pool that holds its
    request whole, and the request runs to its length under the loop's checks (its drafts
    included)."""
    done = load.run(async_scheduling=async_scheduling, fix=apply_draft_margin_fix)
    assert done.loads == 1 and done.reasons["r0"] == "length", done


def test_the_margin_fix_is_an_edit_of_vllms_scheduler() -> None:
    """Two hunks of vLLM's `scheduler.py`: the reservation an asynchronous load is admitted
    beside, and the method that caps the margin."""
    diff = margin_diff()
    assert diff.startswith("--- a/vllm/v1/core/sched/scheduler.py\n")
    assert diff.count("@@ ") == 2
    assert "-                        + self._spec_decode_step_blocks\n" in diff
    assert "+    def _spec_decode_margin_blocks(\n" in diff
    assert DRAFT_MARGIN_FIXES.names == ("cap-draft-margin",)
