"""`ArPolicy.hash_lookahead_tokens`: prefix-cache keys that also cover the tokens after a block.

With an EAGLE drafter and prefix caching, vLLM hashes each block with the token after it
(`num_hash_lookahead_tokens` = 1), since the drafter's KV at the block's last position depends
on it. A block is then cached only once that token is known (for a request's last prompt
block: once its first output is sampled, when vLLM publishes it as it takes the output), a
hit takes a block only where the request's own token after it matches too, and vLLM 0.34's
cache-aware window ranks hits so. Without the option the spec's keys are the blocks' own
prefixes, and the window's order it checked was not vLLM's (`fcfs_admission` on live logs).
"""

from __future__ import annotations

import pytest

from spec.ar.config import ArConfig
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.profile import ProfileError
from tests.test_ar_free_keeps_computed import verdict

CONFIG = ArConfig(
    block_size=4, num_blocks=9, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=32
).replace(enable_prefix_caching=True)
AHEAD = ArPolicy(hash_lookahead_tokens=1)
BLOCKS = tuple(range(1, 9))  # two full blocks of a's prompt


def a_caches(after: int) -> list[ArEvent]:
    """a, prompt BLOCKS then `after`, computes its 9 tokens in step 0 and finishes: its two
    full blocks (1, 2) stay cached, the second's key covering `after` when keys look ahead."""
    return [
        ArSubmitted("a", 9, 1, prompt=(*BLOCKS, after)),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 9),
        ArStepEnd(0),
        ArBlocksFreed("a", (1, 2, 3)),
        ArFinished("a", ArFinishReason.LENGTH),
    ]


def b_hits(after: int) -> list[ArEvent]:
    """b, prompt BLOCKS then `after` and one more token, hits blocks 1 and 2 in step 1."""
    return [
        ArSubmitted("b", 10, 1, prompt=(*BLOCKS, after, 50)),
        ArCacheHit("b", (1, 2)),
        ArBlocksAllocated("b", (4,)),
        ArScheduled("b", 2),
        ArStepEnd(1),
    ]


def test_a_hit_needs_the_token_after_each_block_to_match() -> None:
    """b's prompt shares a's two blocks but not the token after them: without lookahead keys
    the hit conforms; with them block 2 caches other content. With the same token after them
    it conforms either way."""
    other = [*a_caches(9), *b_hits(7)]
    assert verdict(other, CONFIG) == ("", "")
    found, message = verdict(other, CONFIG, AHEAD)
    assert found == "cache_hit_cached", message
    assert "block 2 caches other content (or other tokens after it: hash_lookahead_tokens=1)" in (
        message
    )
    same = [*a_caches(9), *b_hits(9)]
    assert verdict(same, CONFIG, AHEAD) == ("", "")


def test_a_hit_stops_where_the_tokens_after_a_block_are_unknown() -> None:
    """With keys that look 2 tokens ahead, b (9 known tokens) has one block with a key: its
    second block's key would need tokens 8 and 9, and 9 is not known yet."""
    events = [
        *a_caches(9),
        ArSubmitted("b", 9, 1, prompt=(*BLOCKS, 9)),
        ArCacheHit("b", (1, 2)),
    ]
    assert verdict(events, CONFIG) == ("", "")
    found, message = verdict(events, CONFIG, ArPolicy(hash_lookahead_tokens=2))
    assert found == "cache_hit_bounded", message
    assert "hash_lookahead_tokens=2): at most 1 blocks" in message, message


def test_a_last_prompt_block_is_cached_once_its_first_output_is_sampled() -> None:
    """a's prompt is one block, so its key covers a's first output. vLLM caches it when the
    step end samples that output (it publishes a running request's blocks as it takes its
    output): a, preempted in step 1 by its own need for a block, takes it back as a hit in
    step 2. Without that publication the spec would find the block never cached."""
    config = CONFIG.replace(num_blocks=4)  # 3 usable blocks
    events: list[ArEvent] = [
        ArSubmitted("c", 7, 2, prompt=tuple(range(20, 27))),
        ArSubmitted("a", 4, 4, prompt=(1, 2, 3, 4)),
        ArBlocksAllocated("c", (1, 2)),
        ArScheduled("c", 7),
        ArBlocksAllocated("a", (3,)),
        ArScheduled("a", 4),
        ArStepEnd(0),
        # c's token fits its blocks; a needs a fourth block, so the tail of running, a, goes
        ArScheduled("c", 1),
        ArPreempted("a", (3,)),
        ArStepEnd(1),
        ArBlocksFreed("c", (1, 2)),
        ArFinished("c", ArFinishReason.LENGTH),
        ArCacheHit("a", (3,)),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 1),
        ArStepEnd(2),
    ]
    assert verdict(events, config) == ("", "")
    assert verdict(events, config, AHEAD) == ("", "")


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_a_bad_lookahead_is_a_profile_error(bad: object) -> None:
    with pytest.raises(ProfileError, match="hash_lookahead_tokens"):
        ArPolicy(hash_lookahead_tokens=bad)  # type: ignore[arg-type]
