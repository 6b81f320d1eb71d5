"""What holds for a replica split into pipeline stages (Vidur's `num_pipeline_stages`).

The AR spec models one batch per step. With `S` stages a replica runs up to `S` micro-batches at
once, one per stage, and a request computes its tokens `S` ticks (stage times) after it was
scheduled, so `ArSpecMachine` does not apply. What holds instead is stated here, on a snapshot
of the pipeline between ticks (`PipelineSnapshot`), and checked by `check_pipeline`, which
raises `SpecViolation` naming one of `PipelineRule`:

- `stage_cadence`: a batch in flight was formed fewer than `S` ticks ago, and runs the stage
  that its age names (formed at tick f, it runs stage k during tick f + k, then leaves);
- `one_batch_per_stage`: no two batches in flight run the same stage (so at most `S`);
- `one_batch_per_request`: a request is in at most one batch in flight;
- `requests_conserved`: every submitted request is in exactly one of waiting, pending
  (admitted, between batches), in flight, finished or aborted, and nothing else appears;
- `pipeline_blocks_conserved`: free + held blocks = usable blocks, and only pending or in-flight
  requests hold blocks (waiting, finished and aborted ones hold none);
- `blocks_cover_tokens`: a request holds blocks for every token whose KV it has written or is
  writing (`PipelineSnapshot.kv_tokens`, at `block_size` tokens a block).

One declared option relaxes two of them: sequence pipeline parallelism
(`PipelineSnapshot.sequence_parallel`; Vidur's `enable_sequence_pipeline_parallel`, from
Mnemosyne) schedules a request's next prefill chunk as soon as its previous one has left stage 0,
so several batches in flight may hold prefill chunks of one request, which is meanwhile pending
for its next chunk. A decode still overlaps nothing: a request that a batch in flight decodes
(`BatchInFlight.decodes`) is in no other batch and not pending.

Another relaxes `pipeline_blocks_conserved`: a batch-end free (`PipelineSnapshot.batch_end_free`;
`ArRules.free_at_batch_end`, FasterTransformer's static batches) lets a finished request keep
its blocks while a request of its static batch (`PipelineSnapshot.static_batch_of`: the batch
that first scheduled it) is still pending or in flight.

Both the project's stage scheduler (`reference.ar.stages`) and a real engine's pipeline (Vidur's
replica with several stages, `integrations.vidur.pipeline`) report these snapshots. A snapshot
that is no `PipelineSnapshot`, or whose field is not of its declared container type (a list
where a frozenset or a mapping is declared), breaks the rule that field would have misled,
naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from spec.errors import SpecViolation
from spec.snapshot import container_fields, wrong_container


class PipelineRule(StrEnum):
    """The rules of a pipelined replica. A member equals (and hashes like) its string."""

    STAGE_CADENCE = "stage_cadence"
    ONE_BATCH_PER_STAGE = "one_batch_per_stage"
    ONE_BATCH_PER_REQUEST = "one_batch_per_request"
    REQUESTS_CONSERVED = "requests_conserved"
    PIPELINE_BLOCKS_CONSERVED = "pipeline_blocks_conserved"
    BLOCKS_COVER_TOKENS = "blocks_cover_tokens"


PIPELINE_RULES: Mapping[PipelineRule, str] = MappingProxyType(
    {
        PipelineRule.STAGE_CADENCE: "A batch formed at tick f runs stage k during tick f + k "
        "and leaves after stage S - 1: in flight, it is younger than S ticks and runs the stage "
        "its age names.",
        PipelineRule.ONE_BATCH_PER_STAGE: "No two batches in flight run the same stage.",
        PipelineRule.ONE_BATCH_PER_REQUEST: "A request is in at most one batch in flight: it is "
        "not scheduled again before its batch leaves the last stage. With sequence pipeline "
        "parallelism declared, several batches in flight may hold prefill chunks of one "
        "request, but none of them may decode it.",
        PipelineRule.REQUESTS_CONSERVED: "Every submitted request is in exactly one of waiting, "
        "pending (admitted, between batches), in flight, finished or aborted. With sequence "
        "pipeline parallelism declared, a request with only prefill chunks in flight may also "
        "be pending, for its next chunk.",
        PipelineRule.PIPELINE_BLOCKS_CONSERVED: "Free + held blocks = usable blocks, and only "
        "pending or in-flight requests hold blocks. With a batch-end free declared "
        "(FasterTransformer's static batches), a finished request may too while a request of "
        "its static batch is pending or in flight.",
        PipelineRule.BLOCKS_COVER_TOKENS: "A request holds blocks for every token whose KV it "
        "has written or is writing: its computed tokens and those its batches in flight "
        "compute, at block_size tokens a block.",
    }
)


@dataclass(frozen=True, slots=True)
class BatchInFlight:
    """One micro-batch between formation and leaving the last stage.

    batch_id: the pipeline's own number for it (distinct per batch).
    formed_at: the tick it was formed in (it runs stage 0 during that tick).
    stage: the stage it runs, or runs next when the snapshot falls between two of its stages.
    request_ids: its requests, in batch order.
    decodes: those of its requests it decodes (their prefill was complete when it formed); it
        computes a prefill chunk of each other one.
    """

    batch_id: int
    formed_at: int
    stage: int
    request_ids: tuple[str, ...]
    decodes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PipelineSnapshot:
    """A pipelined replica between ticks, read from its own queues and ledgers.

    tick: the tick the stages run now (or next): a batch formed at `formed_at` is in stage
        `tick - formed_at`.
    num_stages: S.
    batches: the batches in flight.
    waiting: submitted, not admitted (or restarted since): hold no blocks.
    pending: admitted and not finished, in no batch in flight (between two batches).
    finished, aborted: terminal requests.
    submitted: every request id submitted so far.
    held_blocks: request id -> the number of blocks it holds (zero counts may be left out).
    free_blocks: the number of blocks the allocator considers free.
    usable_blocks: the pool's usable blocks (the null block excluded).
    sequence_parallel: the replica declares sequence pipeline parallelism (module docstring).
    block_size: tokens a block holds (0: `blocks_cover_tokens` is not checked).
    kv_tokens: request id -> the tokens whose KV it has written or is writing (its computed
        tokens, and those its batches in flight compute), for the requests holding blocks.
    batch_end_free: the replica declares a batch-end free (module docstring).
    static_batch_of: request id -> the id of its static batch (the batch that first scheduled
        it), for the requests scheduled so far; read only with `batch_end_free`.
    """

    tick: int
    num_stages: int
    batches: tuple[BatchInFlight, ...]
    waiting: tuple[str, ...]
    pending: tuple[str, ...]
    finished: tuple[str, ...]
    aborted: tuple[str, ...]
    submitted: frozenset[str]
    held_blocks: Mapping[str, int]
    free_blocks: int
    usable_blocks: int
    sequence_parallel: bool = False
    block_size: int = 0
    kv_tokens: Mapping[str, int] = field(default_factory=dict)
    batch_end_free: bool = False
    static_batch_of: Mapping[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """The snapshot in a few lines, for a violation's message."""
        parallel = ", sequence-parallel prefills" if self.sequence_parallel else ""
        parallel += ", batch-end free" if self.batch_end_free else ""
        lines = [f"tick {self.tick}, {self.num_stages} stages{parallel}"]
        for b in sorted(self.batches, key=lambda b: b.stage):
            decodes = f", decodes {sorted(b.decodes)}" if b.decodes else ""
            lines.append(
                f"stage {b.stage}: batch {b.batch_id} (formed at tick {b.formed_at}) "
                f"{list(b.request_ids)}{decodes}"
            )
        lines.append(f"waiting {list(self.waiting)}, pending {list(self.pending)}")
        lines.append(f"finished {list(self.finished)}, aborted {list(self.aborted)}")
        held = {rid: n for rid, n in sorted(self.held_blocks.items()) if n}
        lines.append(f"held {held}, free {self.free_blocks} of {self.usable_blocks}")
        return "\n".join(lines)


_SNAPSHOT_FIELDS = container_fields(PipelineSnapshot)
_BATCH_FIELDS = container_fields(BatchInFlight)
# the rule a field of the wrong container type would break unseen (a list compares unequal to
# every set: `requests_conserved` would report every request lost)
_RULE_OF_FIELD: Mapping[str, PipelineRule] = {
    "submitted": PipelineRule.REQUESTS_CONSERVED,
    "held_blocks": PipelineRule.PIPELINE_BLOCKS_CONSERVED,
    "static_batch_of": PipelineRule.PIPELINE_BLOCKS_CONSERVED,
    "kv_tokens": PipelineRule.BLOCKS_COVER_TOKENS,
}


def _wrong_container(s: object) -> tuple[PipelineRule, str] | None:
    """The rule and the one-line reason when `s` is no `PipelineSnapshot`, or a field of it
    (or of one of its batches) is not of its declared container type (`wrong_container`)."""
    if not isinstance(s, PipelineSnapshot):
        return (
            PipelineRule.REQUESTS_CONSERVED,
            f"the pipeline snapshot is a {type(s).__name__}, not a spec.ar.pipeline."
            "PipelineSnapshot",
        )
    for name, declared in _SNAPSHOT_FIELDS.items():
        wrong = wrong_container(s, {name: declared}, "the pipeline snapshot")
        if wrong is not None:
            return _RULE_OF_FIELD.get(name, PipelineRule.REQUESTS_CONSERVED), wrong
    for b in s.batches:
        if not isinstance(b, BatchInFlight):
            return PipelineRule.STAGE_CADENCE, (
                f"the pipeline snapshot lists a {type(b).__name__} among its batches, not a "
                "BatchInFlight"
            )
        wrong = wrong_container(b, _BATCH_FIELDS, f"batch {b.batch_id} of the pipeline snapshot")
        if wrong is not None:
            return PipelineRule.ONE_BATCH_PER_REQUEST, wrong
    return None


def check_pipeline(snapshot: PipelineSnapshot) -> None:
    """Raise `SpecViolation` (rule: a `PipelineRule`) unless every pipeline rule holds; a
    snapshot of the wrong type, or a field of the wrong container type (a list where a
    frozenset or a mapping is declared), breaks the rule that field would have misled."""
    s = snapshot
    wrong = _wrong_container(s)
    if wrong is not None:
        raise SpecViolation(wrong[0], wrong[1])

    def broken(rule: PipelineRule, detail: str) -> SpecViolation:
        return SpecViolation(rule, detail, state=s.describe())

    stages: dict[int, int] = {}
    for b in s.batches:
        age = s.tick - b.formed_at
        if not 0 <= age < s.num_stages or b.stage != age:
            expected = (
                f"expected stage {age}"
                if 0 <= age < s.num_stages
                else f"expected it gone after stage {s.num_stages - 1}"
                if age >= s.num_stages
                else "formed after the tick it is seen in"
            )
            raise broken(
                PipelineRule.STAGE_CADENCE,
                f"batch {b.batch_id}, formed at tick {b.formed_at}, is in stage {b.stage} at "
                f"tick {s.tick} ({expected})",
            )
        if b.stage in stages:
            raise broken(
                PipelineRule.ONE_BATCH_PER_STAGE,
                f"batches {stages[b.stage]} and {b.batch_id} both run stage {b.stage}",
            )
        stages[b.stage] = b.batch_id
    where: dict[str, str] = {}
    decoded = {rid: b.batch_id for b in s.batches for rid in b.decodes}
    for b in s.batches:
        for rid in b.request_ids:
            if rid in where and (not s.sequence_parallel or rid in decoded):
                how = f" (batch {decoded[rid]} decodes it)" if s.sequence_parallel else ""
                raise broken(
                    PipelineRule.ONE_BATCH_PER_REQUEST,
                    f"{rid!r} is in {where[rid]} and in batch {b.batch_id}{how}",
                )
            where.setdefault(rid, f"batch {b.batch_id}")
    # sequence parallelism: a request whose prefill chunks alone are in flight awaits the next
    next_chunk = {rid for rid in where if rid not in decoded} if s.sequence_parallel else set()
    parts = {
        "waiting": s.waiting,
        "pending": s.pending,
        "finished": s.finished,
        "aborted": s.aborted,
    }
    for name, rids in parts.items():
        for rid in rids:
            if name == "pending" and rid in next_chunk:
                next_chunk.discard(rid)  # once: pending twice is still a duplicate
                where[rid] = f"{where[rid]} and pending"
                continue
            if rid in where:
                raise broken(
                    PipelineRule.REQUESTS_CONSERVED, f"{rid!r} is both {where[rid]} and {name}"
                )
            where[rid] = name
    if where.keys() != s.submitted:
        raise broken(
            PipelineRule.REQUESTS_CONSERVED,
            f"lost {sorted(s.submitted - where.keys())}, "
            f"unknown {sorted(where.keys() - s.submitted)}",
        )
    holders = {rid for rid, n in s.held_blocks.items() if n}
    batch_of = s.static_batch_of
    live = {  # the static batches with a request pending or in flight
        batch_of[rid]
        for rid, state in where.items()
        if state not in ("waiting", "finished", "aborted") and rid in batch_of
    }
    for rid in sorted(holders):
        state = where.get(rid, "unknown")
        if state == "finished" and s.batch_end_free and batch_of.get(rid, -1) in live:
            continue  # declared: it keeps them while its static batch runs
        if state == "finished" and s.batch_end_free:
            raise broken(
                PipelineRule.PIPELINE_BLOCKS_CONSERVED,
                f"{rid!r} (finished) holds {s.held_blocks[rid]} blocks after its static batch "
                f"{batch_of.get(rid, '(none reported)')} ended",
            )
        if state in ("waiting", "finished", "aborted", "unknown"):
            raise broken(
                PipelineRule.PIPELINE_BLOCKS_CONSERVED,
                f"{rid!r} ({state}) holds {s.held_blocks[rid]} blocks",
            )
    held = sum(s.held_blocks.values())
    if s.free_blocks + held != s.usable_blocks or min(s.free_blocks, held) < 0:
        raise broken(
            PipelineRule.PIPELINE_BLOCKS_CONSERVED,
            f"free {s.free_blocks} + held {held} != usable {s.usable_blocks}",
        )
    if s.block_size > 0:
        for rid, tokens in sorted(s.kv_tokens.items()):
            blocks = s.held_blocks.get(rid, 0)
            if blocks * s.block_size < tokens:
                raise broken(
                    PipelineRule.BLOCKS_COVER_TOKENS,
                    f"{rid!r} ({where.get(rid, 'unknown')}) holds {blocks} blocks of "
                    f"{s.block_size} tokens for {tokens} tokens of KV: it needs "
                    f"{-(-tokens // s.block_size)}",
                )


__all__ = [
    "PIPELINE_RULES",
    "BatchInFlight",
    "PipelineRule",
    "PipelineSnapshot",
    "check_pipeline",
]
