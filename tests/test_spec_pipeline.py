"""`spec.ar.pipeline`: the rules of a pipelined replica, each broken by a hand-made snapshot."""

from __future__ import annotations

import dataclasses

import pytest

from spec.ar.pipeline import (
    PIPELINE_RULES,
    BatchInFlight,
    PipelineRule,
    PipelineSnapshot,
    check_pipeline,
)
from spec.errors import SpecViolation

# tick 5 of 3 stages: batch 4 (formed at 5) runs stage 0, batch 3 (formed at 4) stage 1
GOOD = PipelineSnapshot(
    tick=5,
    num_stages=3,
    batches=(BatchInFlight(4, 5, 0, ("a",)), BatchInFlight(3, 4, 1, ("b", "c"))),
    waiting=("d",),
    pending=("e",),
    finished=("f",),
    aborted=("g",),
    submitted=frozenset("abcdefg"),
    held_blocks={"a": 2, "b": 1, "c": 1, "e": 3, "d": 0},
    free_blocks=3,
    usable_blocks=10,
)


def broken(snapshot: PipelineSnapshot) -> SpecViolation:
    with pytest.raises(SpecViolation) as err:
        check_pipeline(snapshot)
    return err.value


def test_a_pipeline_that_keeps_every_rule_passes() -> None:
    check_pipeline(GOOD)
    assert set(PIPELINE_RULES) == set(PipelineRule)


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        # formed 3 ticks ago with 3 stages: it should have left
        (
            (BatchInFlight(1, 2, 2, ("a",)),),
            "in stage 2 at tick 5 (expected it gone after stage 2)",
        ),
        # formed at tick 4 but still in stage 0 (it waited in a stage queue)
        ((BatchInFlight(3, 4, 0, ("a",)),), "is in stage 0 at tick 5 (expected stage 1)"),
        # formed in the future
        ((BatchInFlight(5, 6, 0, ("a",)),), "(formed after the tick it is seen in)"),
    ],
)
def test_stage_cadence(batches: tuple[BatchInFlight, ...], message: str) -> None:
    err = broken(dataclasses.replace(GOOD, batches=batches, submitted=frozenset("adefg")))
    assert err.rule == PipelineRule.STAGE_CADENCE and message in str(err), err
    assert "tick 5, 3 stages" in str(err)  # the snapshot comes with the message


def test_one_batch_per_stage() -> None:
    two = (BatchInFlight(4, 5, 0, ("a",)), BatchInFlight(5, 5, 0, ("b", "c")))
    err = broken(dataclasses.replace(GOOD, batches=two))
    assert err.rule == PipelineRule.ONE_BATCH_PER_STAGE
    assert "batches 4 and 5 both run stage 0" in str(err)


def test_one_batch_per_request() -> None:
    twice = (BatchInFlight(4, 5, 0, ("a", "b")), BatchInFlight(3, 4, 1, ("b", "c")))
    err = broken(dataclasses.replace(GOOD, batches=twice))
    assert err.rule == PipelineRule.ONE_BATCH_PER_REQUEST
    assert "'b' is in batch 4 and in batch 3" in str(err)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pending": ("e", "a")}, "'a' is both batch 4 and pending"),
        ({"waiting": ("d", "f")}, "'f' is both waiting and finished"),
        ({"pending": ()}, "lost ['e']"),
        ({"aborted": ("g", "h")}, "unknown ['h']"),
    ],
)
def test_requests_conserved(change: dict[str, object], message: str) -> None:
    err = broken(dataclasses.replace(GOOD, **change))  # type: ignore[arg-type]
    assert err.rule == PipelineRule.REQUESTS_CONSERVED and message in str(err), err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"free_blocks": 4}, "free 4 + held 7 != usable 10"),
        ({"held_blocks": {**GOOD.held_blocks, "f": 1}, "free_blocks": 2}, "'f' (finished)"),
        ({"held_blocks": {**GOOD.held_blocks, "d": 1}, "free_blocks": 2}, "'d' (waiting)"),
        ({"held_blocks": {**GOOD.held_blocks, "x": 1}, "free_blocks": 2}, "'x' (unknown)"),
    ],
)
def test_pipeline_blocks_conserved(change: dict[str, object], message: str) -> None:
    err = broken(dataclasses.replace(GOOD, **change))  # type: ignore[arg-type]
    assert err.rule == PipelineRule.PIPELINE_BLOCKS_CONSERVED and message in str(err), err


# sequence pipeline parallelism: 'b' has a prefill chunk in each of batches 4 and 3 and is
# pending for its next one; 'c' is decoded by batch 3
PARALLEL = dataclasses.replace(
    GOOD,
    batches=(
        BatchInFlight(4, 5, 0, ("a", "b")),
        BatchInFlight(3, 4, 1, ("b", "c"), decodes=frozenset("c")),
    ),
    pending=("e", "b"),
    sequence_parallel=True,
)


def test_sequence_parallelism_overlaps_prefill_chunks_of_a_request() -> None:
    check_pipeline(PARALLEL)
    assert "sequence-parallel prefills" in PARALLEL.describe()
    assert "decodes ['c']" in PARALLEL.describe()
    # the same pipeline without the option is what the rules forbid
    err = broken(dataclasses.replace(PARALLEL, sequence_parallel=False))
    assert err.rule == PipelineRule.ONE_BATCH_PER_REQUEST
    assert "'b' is in batch 4 and in batch 3" in str(err)


@pytest.mark.parametrize(
    ("change", "rule", "message"),
    [
        # a request decoded in flight is scheduled again
        (
            {
                "batches": (
                    BatchInFlight(4, 5, 0, ("a", "c")),
                    BatchInFlight(3, 4, 1, ("b", "c"), decodes=frozenset("c")),
                )
            },
            PipelineRule.ONE_BATCH_PER_REQUEST,
            "'c' is in batch 4 and in batch 3 (batch 3 decodes it)",
        ),
        # ... or pending while its decode runs
        (
            {"pending": ("e", "b", "c")},
            PipelineRule.REQUESTS_CONSERVED,
            "'c' is both batch 3 and pending",
        ),
        # a request between chunks is pending once
        (
            {"pending": ("e", "b", "b")},
            PipelineRule.REQUESTS_CONSERVED,
            "'b' is both batch 4 and pending and pending",
        ),
        # a restarted request with a chunk still in flight
        (
            {"pending": ("e",), "waiting": ("d", "b")},
            PipelineRule.REQUESTS_CONSERVED,
            "'b' is both batch 4 and waiting",
        ),
    ],
)
def test_sequence_parallelism_still_keeps_a_decode_alone(
    change: dict[str, object], rule: PipelineRule, message: str
) -> None:
    err = broken(dataclasses.replace(PARALLEL, **change))  # type: ignore[arg-type]
    assert err.rule == rule and message in str(err), err


def test_blocks_cover_tokens() -> None:
    """'b' holds 1 block of 4 tokens: 4 tokens of KV pass, 5 do not; unchecked without a block
    size."""
    covered = dataclasses.replace(GOOD, block_size=4, kv_tokens={"a": 8, "b": 4, "e": 12})
    check_pipeline(covered)
    short = dataclasses.replace(covered, kv_tokens={**covered.kv_tokens, "b": 5})
    err = broken(short)
    assert err.rule == PipelineRule.BLOCKS_COVER_TOKENS
    assert "'b' (batch 3) holds 1 blocks of 4 tokens for 5 tokens of KV: it needs 2" in str(err)
    check_pipeline(dataclasses.replace(short, block_size=0))


@pytest.mark.parametrize(
    ("change", "rule", "text"),
    [
        (
            {"submitted": ["a"]},
            "requests_conserved",
            "the pipeline snapshot returned submitted as list, not frozenset",
        ),
        (
            {"held_blocks": [("a", 1)]},
            "pipeline_blocks_conserved",
            "returned held_blocks as list, not Mapping",
        ),
        ({"kv_tokens": None}, "blocks_cover_tokens", "returned kv_tokens as NoneType"),
        (
            {"batches": (BatchInFlight(0, 0, 0, ("a",), decodes=["a"]),)},  # type: ignore[arg-type]
            "one_batch_per_request",
            "batch 0 of the pipeline snapshot returned decodes as list, not frozenset",
        ),
        ({"batches": ("a",)}, "stage_cadence", "lists a str among its batches"),
    ],
    ids=["submitted", "held", "kv-tokens", "decodes", "batch"],
)
def test_a_field_of_the_wrong_container_type_is_named(
    change: dict[str, object], rule: str, text: str
) -> None:
    """A list where a frozenset is declared compares unequal to every set: without the check,
    `requests_conserved` would call every request lost."""
    good = PipelineSnapshot(
        tick=0,
        num_stages=2,
        batches=(),
        waiting=("a",),
        pending=(),
        finished=(),
        aborted=(),
        submitted=frozenset({"a"}),
        held_blocks={},
        free_blocks=4,
        usable_blocks=4,
    )
    check_pipeline(good)
    bad = dataclasses.replace(good, **change)  # type: ignore[arg-type]
    with pytest.raises(SpecViolation) as caught:
        check_pipeline(bad)
    assert caught.value.rule == rule and text in str(caught.value), caught.value
    with pytest.raises(
        SpecViolation, match=r"is a dict, not a spec\.ar\.pipeline\.PipelineSnapshot"
    ):
        check_pipeline({})  # type: ignore[arg-type]
