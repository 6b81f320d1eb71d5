"""The dLLM spec's prefix cache (`DllmConfig.prefix_cache`, SGLang's radix cache): a cached
run and a hit replay and end idle; each cache rule fires, by its own name, on the event that
breaks it; the events survive a JSON Lines trace."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from schedspec_cli.main import main
from spec import (
    Admitted,
    BlockCommitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    ControlReturned,
    DllmConfig,
    Event,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvCached,
    KvFreed,
    Mode,
    RowReleased,
    Snapshot,
    SpecMachine,
    SpecViolation,
    StepResult,
    Submitted,
)
from spec.prefix_cache import ROOT, chain
from spec.profile import DllmAdmission, DllmPolicy
from spec.trace import config_to_dict, read_trace, write_events

# blocks of 2 in pages of 2: a cached block is a cached page
CACHED = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=8,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=12,
    mode=Mode.FDFO,
    in_place_reuse=True,
    prefix_cache=True,
)


def row(rid: str, block: int, masked: int, reused: bool = False) -> ForwardRow:
    return ForwardRow(rid, block, reused, 2, masked)


def prompt_block(rid: str, k: int, slots: tuple[int, ...], tokens: tuple[int, ...]) -> list[Event]:
    """One round that writes and commits prompt-only block `k`, then caches it."""
    return [
        KvAllocated(rid, k, slots),
        Forward((row(rid, k, 0),)),
        StepResult(rid, k, 2, 0),
        BlockCommitted(rid, k, tokens),
        KvCached(rid, k, slots),
    ]


# r0: prompt (1, 2, 3, 4), 2 new tokens (7, 8): its two prompt blocks are cached as committed
CACHE_R0: list[Event] = [
    Submitted("r0", (1, 2, 3, 4), 2),
    Admitted("r0", 0),
    *prompt_block("r0", 0, (0, 1), (1, 2)),
    ControlReturned(0),
    *prompt_block("r0", 1, (2, 3), (3, 4)),
    ControlReturned(1),
]
FINISH_R0: list[Event] = [
    KvAllocated("r0", 2, (4, 5)),
    Forward((row("r0", 2, 2),)),
    StepResult("r0", 2, 0, 0),
    ControlReturned(2),
    Forward((row("r0", 2, 0, reused=True),)),
    StepResult("r0", 2, 2, 0),
    BlockCommitted("r0", 2, (7, 8)),
    KvFreed("r0", (4, 5)),
    CacheReleased("r0", 0, (0, 1)),
    CacheReleased("r0", 1, (2, 3)),
    RowReleased("r0", 0),
    Finished("r0", FinishReason.LENGTH),
    ControlReturned(3),
]
# r1: prompt (1, 2, 3, 4, 9, 9) reads r0's two cached blocks, computes its own third
HIT_R1: list[Event] = [
    Submitted("r1", (1, 2, 3, 4, 9, 9), 2),
    Admitted("r1", 0),
    CacheHit("r1", 0, (0, 1)),
    CacheHit("r1", 1, (2, 3)),
    KvAllocated("r1", 2, (4, 5)),
    Forward((row("r1", 2, 0),)),
    StepResult("r1", 2, 2, 0),
    BlockCommitted("r1", 2, (9, 9)),
    ControlReturned(4),
    KvAllocated("r1", 3, (6, 7)),
    Forward((row("r1", 3, 2),)),
    StepResult("r1", 3, 0, 0),
    ControlReturned(5),
    Forward((row("r1", 3, 0, reused=True),)),
    StepResult("r1", 3, 2, 0),
    BlockCommitted("r1", 3, (5, 6)),
    KvFreed("r1", (4, 5, 6, 7)),
    CacheReleased("r1", 0, (0, 1)),
    CacheReleased("r1", 1, (2, 3)),
    RowReleased("r1", 0),
    Finished("r1", FinishReason.LENGTH),
    ControlReturned(6),
]
WHOLE_RUN: list[Event] = [*CACHE_R0, *FINISH_R0, *HIT_R1, CacheEvicted((0, 1, 2, 3))]


def replay(events: list[Event], config: DllmConfig = CACHED) -> SpecMachine:
    machine = SpecMachine(config)
    for event in events:
        machine.apply(event)
        machine.check_changed()
    return machine


def test_a_hit_reads_the_cached_prompt_blocks_and_the_run_ends_idle() -> None:
    machine = replay(WHOLE_RUN)
    assert machine.is_idle()
    assert machine.outputs() == {"r0": (7, 8), "r1": (5, 6)}
    machine.check_invariants()
    machine.check_snapshot(
        Snapshot(frozenset(range(16)), {}, {}, frozenset(), cached_slots=frozenset())
    )


def test_the_state_shows_the_cache_and_who_reads_it() -> None:
    machine = replay([*CACHE_R0, *FINISH_R0, *HIT_R1[:5]])
    state = machine.state()
    assert state.cached_slots == frozenset({0, 1, 2, 3})
    keys = [(c.slots, c.block_index, c.tokens) for c in state.cache]
    assert keys == [((0, 1), 0, (1, 2)), ((2, 3), 1, (3, 4))]
    # the key's digest is chained over the whole prefix, block by block
    assert state.cache[1].digest == chain(chain(ROOT, (1, 2)), (3, 4)).hex()
    assert state.cache[1].readers == frozenset({("r1", 1)})
    assert state.requests["r1"].cache_reads == {0: (0, 1), 1: (2, 3)}
    assert state.requests["r1"].committed_blocks == 2  # the hits committed the prompt blocks
    assert state.free_slots == frozenset(range(6, 16))
    text = machine.render()
    assert "cache (2 blocks): 0-1 b0 [1, 2] read by r1:b0; 2-3 b1 [3, 4] read by r1:b1" in text
    assert "reads=[b0:0-1 b1:2-3]" in text
    machine.check_invariants()
    with pytest.raises(SpecViolation, match="cached slots differ") as caught:
        machine.check_snapshot(
            Snapshot(
                state.free_slots,
                dict(state.slot_owners),
                dict(state.rows),
                state.running,
                state.carrying,
                cached_slots=frozenset({0, 1}),
            )
        )
    assert caught.value.rule == "snapshot_matches"


def test_a_duplicate_insert_swaps_the_own_copy_for_the_cached_one() -> None:
    """SGLang's insert of a block the tree already holds: the request reads the cached copy
    and frees its own (the tree's `checkpoint` rewrites the row)."""
    events: list[Event] = [
        *CACHE_R0,
        Submitted("r2", (1, 2, 5, 5), 2),
        Admitted("r2", 1),
        KvAllocated("r2", 0, (6, 7)),  # computes its own block 0, same content as r0's
        KvAllocated("r0", 2, (4, 5)),
        Forward((row("r0", 2, 2), row("r2", 0, 0))),
        StepResult("r0", 2, 0, 0),
        StepResult("r2", 0, 2, 0),
        BlockCommitted("r2", 0, (1, 2)),
        CacheHit("r2", 0, (0, 1)),
        KvFreed("r2", (6, 7)),
        ControlReturned(2),
    ]
    machine = replay(events)
    assert machine.state().requests["r2"].cache_reads == {0: (0, 1)}
    assert machine.state().cache[0].readers == frozenset({("r0", 0), ("r2", 0)})


def test_the_header_names_the_cache_only_when_on_and_the_events_round_trip() -> None:
    assert "prefix_cache" not in config_to_dict(dataclasses.replace(CACHED, prefix_cache=False))
    out = io.StringIO()
    out.write(json.dumps(config_to_dict(CACHED)) + "\n")
    write_events(WHOLE_RUN, out)
    config, numbered = read_trace(io.StringIO(out.getvalue()))
    assert config == CACHED
    assert [event for _, event in numbered] == WHOLE_RUN


def fires(events: list[Event], rule: str, config: DllmConfig = CACHED) -> str:
    """Everything but the last event conforms; the last breaks `rule`, by its name."""
    machine = replay(events[:-1], config)
    with pytest.raises(SpecViolation) as caught:
        machine.apply(events[-1])
    assert caught.value.rule == rule, str(caught.value)
    assert "state:" in str(caught.value)
    return str(caught.value)


def test_cache_events_need_a_cache_prefix_cache_on() -> None:
    off = dataclasses.replace(CACHED, prefix_cache=False)
    text = fires(CACHE_R0[:7], "prefix_cache_on", off)
    assert "set prefix_cache=True" in text


def test_only_a_committed_block_owned_whole_is_cached_cache_committed_only() -> None:
    early = [*CACHE_R0[:3], KvCached("r0", 0, (0, 1))]  # allocated, not yet committed
    assert "which it has not committed" in fires(early, "cache_committed_only")
    wrong = [*CACHE_R0[:6], KvCached("r0", 0, (0, 2))]
    assert "owns [0, 1] for it" in fires(wrong, "cache_committed_only")


def test_a_hit_reads_only_its_own_content_cache_hit_content() -> None:
    other = [*CACHE_R0, *FINISH_R0, Submitted("r1", (1, 2, 3, 5), 2), Admitted("r1", 0)]
    text = fires(
        [*other, CacheHit("r1", 0, (0, 1)), CacheHit("r1", 1, (2, 3))], "cache_hit_content"
    )
    assert "position 3 holds 4 in the cache and 5 in the request" in text
    # a block past the prompt: its tokens are not known before they are generated
    short = [*CACHE_R0, *FINISH_R0, Submitted("r1", (1, 2, 3), 2), Admitted("r1", 0)]
    text = fires(
        [*short, CacheHit("r1", 0, (0, 1)), CacheHit("r1", 1, (2, 3))], "cache_hit_content"
    )
    assert "not wholly inside its prompt" in text
    # the block's own tokens agree, the prefix before it does not (a swap after a commit)
    same_block: list[Event] = [
        *CACHE_R0,
        *FINISH_R0,
        Submitted("r1", (9, 9, 3, 4), 2),
        Admitted("r1", 0),
        *prompt_block("r1", 0, (4, 5), (9, 9))[:4],
        ControlReturned(4),
        *prompt_block("r1", 1, (6, 7), (3, 4))[:4],
        CacheHit("r1", 1, (2, 3)),
    ]
    text = fires(same_block, "cache_hit_content")
    assert "block 1 holds the same tokens [3, 4], but the tokens before it differ" in text
    # slots that are not one cached block
    text = fires([*other, CacheHit("r1", 0, (1, 2))], "cache_hit_content")
    assert "are not one cached block" in text


def test_a_hit_for_the_next_block_comes_before_the_first_forward_scheduler_phase() -> None:
    events: list[Event] = [
        *CACHE_R0,
        Submitted("r2", (1, 2, 3, 4), 1),
        Admitted("r2", 1),
        KvAllocated("r0", 2, (4, 5)),
        Forward((row("r0", 2, 2),)),
        CacheHit("r2", 0, (0, 1)),
    ]
    fires(events, "scheduler_phase")


def test_only_unread_whole_blocks_are_evicted_evict_unread_only() -> None:
    assert "still reads" in fires([*CACHE_R0, CacheEvicted((0, 1))], "evict_unread_only")
    done = [*CACHE_R0, *FINISH_R0]
    assert "blocks leave the cache whole" in fires([*done, CacheEvicted((0,))], "evict_unread_only")
    assert "which is not cached (free)" in fires([*done, CacheEvicted((8, 9))], "evict_unread_only")


def test_cached_slots_are_neither_free_nor_owned_kv_exclusive() -> None:
    done = [*CACHE_R0, *FINISH_R0, Submitted("r1", (6,), 1), Admitted("r1", 0)]
    assert "prefix cache" in fires([*done, KvAllocated("r1", 0, (2, 3))], "kv_exclusive")
    text = fires([*done, KvFreed("r0", (2, 3))], "free_owned_only")
    assert "held by the prefix cache (block [2, 3])" in text


def test_a_reader_releases_only_what_it_reads_free_owned_only() -> None:
    text = fires([*CACHE_R0, CacheReleased("r0", 0, (2, 3))], "free_owned_only")
    assert "reads cached slots [0, 1] for it" in text


def test_a_finished_request_reads_nothing_terminal_owns_nothing() -> None:
    unreleased = [
        *CACHE_R0,
        *FINISH_R0[:8],
        RowReleased("r0", 0),
        Finished("r0", FinishReason.LENGTH),
    ]
    assert "still reading cached blocks [0, 1]" in fires(unreleased, "terminal_owns_nothing")


def test_a_released_prefix_block_must_still_be_held_committed_prefix_kept() -> None:
    events: list[Event] = [
        *CACHE_R0,
        CacheReleased("r0", 0, (0, 1)),  # r0 stops reading its committed block 0, keeps running
        KvAllocated("r0", 2, (4, 5)),
        Forward((row("r0", 2, 2),)),
    ]
    fires(events, "committed_prefix_kept")


PREFILL_FIRST = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST)
# r1's whole prompt (two blocks) is r0's cached prompt: its first computed block is all masks
HIT_WHOLE_PROMPT: list[Event] = [
    *CACHE_R0,
    *FINISH_R0,
    Submitted("r1", (1, 2, 3, 4), 2),
    Submitted("r2", (5, 6, 7, 8), 2),
    Admitted("r1", 0),
    CacheHit("r1", 0, (0, 1)),
    CacheHit("r1", 1, (2, 3)),
    Admitted("r2", 1),
    KvAllocated("r1", 2, (4, 5)),
    KvAllocated("r2", 0, (6, 7)),
]


def test_under_prefill_first_a_block_right_after_hits_runs_with_prefill_rows() -> None:
    """SGLang classifies an incoming request by its prompt length, before its cache match: r1,
    whose whole prompt was a hit, runs its first (all-mask) block in the prefill batch, beside
    r2's prompt block (`prefill_first`'s allowance for hits in the round)."""
    machine = SpecMachine(CACHED, PREFILL_FIRST)
    for event in [*HIT_WHOLE_PROMPT, Forward((row("r1", 2, 2), row("r2", 0, 0)))]:
        machine.apply(event)
    # the allowance is for the round of the hit: carried into the next round, r1's block is a
    # decode row again, which may not run beside a prompt block
    next_round: list[Event] = [
        StepResult("r1", 2, 0, 1),
        StepResult("r2", 0, 2, 0),
        BlockCommitted("r2", 0, (5, 6)),
        ControlReturned(4),
        KvAllocated("r2", 1, (8, 9)),
    ]
    for next_event in next_round:
        machine.apply(next_event)
    with pytest.raises(SpecViolation) as caught:
        machine.apply(Forward((row("r1", 2, 1, reused=True), row("r2", 1, 0))))
    assert caught.value.rule == "prefill_first"


def test_under_prefill_first_a_block_right_after_hits_is_not_a_decode_row() -> None:
    """The same r1 in a batch with a running request's decode row is a mixed batch."""
    events: list[Event] = [
        *CACHE_R0,
        KvAllocated("r0", 2, (4, 5)),
        Forward((row("r0", 2, 2),)),
        StepResult("r0", 2, 0, 0),
        ControlReturned(2),
        Submitted("r1", (1, 2, 3, 4), 2),
        Admitted("r1", 1),
        CacheHit("r1", 0, (0, 1)),
        CacheHit("r1", 1, (2, 3)),
        KvAllocated("r1", 2, (6, 7)),
        Forward((row("r0", 2, 0, reused=True), row("r1", 2, 2))),
    ]
    machine = SpecMachine(CACHED, PREFILL_FIRST)
    for event in events[:-1]:
        machine.apply(event)
    with pytest.raises(SpecViolation) as caught:
        machine.apply(events[-1])
    assert caught.value.rule == "prefill_first"


def test_check_trace_reads_a_cached_log_and_names_the_violating_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def log(name: str, events: list[Event]) -> str:
        path = tmp_path / name
        with path.open("w") as out:
            out.write(json.dumps(config_to_dict(CACHED)) + "\n")
            write_events(events, out)
        return str(path)

    assert main(["check-trace", log("good.jsonl", WHOLE_RUN)]) == 0
    capsys.readouterr()
    bad = log("bad.jsonl", [*CACHE_R0, CacheEvicted((0, 1))])
    assert main(["check-trace", bad]) == 1
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "evict_unread_only" in text and f"bad.jsonl:{len(CACHE_R0) + 2}:" in text, text
