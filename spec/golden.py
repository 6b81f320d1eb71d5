"""The optional golden part of the adapter contract: an oracle for output correctness.

An implementation may say what each request's output *should* be, independently of its own
scheduling: `golden_output(request)` decodes the request alone, with the same model (or
denoising oracle) and algorithm, but without the paged KV pool, the batch or the carries —
the engine with a dense unbatched forward over the whole sequence, the reference with its
oracle one block at a time. Scheduling must not change outputs, so every finished request's
output and finish reason must equal its golden output at every batch size and in every mode
(rule `golden_output`). This catches what FDFO-vs-sync parity cannot: a bug that corrupts sync
and FDFO alike (a stale context, wrong positions).

The harness checks every finished request against it after every round when the adapter has
`golden_output` (`GoldenDecoder`); an adapter without it is not checked this way. An adapter
whose golden path computes in other floats than its serving path (the engine: dense against
paged) may also say where a golden decoding took a decision within float noise of flipping
(`ReportsGoldenTies`); a mismatch report then names it (`golden_tie_note`). One that can also
decode the request again with such decisions taken the other way (`DecodesPastGoldenTies`)
lets a check accept an output that equals one of those decodings: both sides of a decision
within float noise are correct decodings (`explained_by_ties`), and the agreement says which
ties it took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from spec.config import RequestSpec
from spec.errors import SpecViolation
from spec.snapshot import FinishedOutput, wrong_output


@runtime_checkable
class GoldenDecoder(Protocol):
    """An adapter that can decode one request alone (see the module docstring).

    `golden_output(request)` returns the request's output (generated tokens cut at
    max_new_tokens and after the first EOS, as `spec.machine.request_output`) and its finish
    reason when decoded alone under the adapter's configuration. It must not change the
    adapter's state (no events, no allocation) and must be deterministic.
    """

    def golden_output(self, request: RequestSpec) -> FinishedOutput:
        """`request` decoded alone under the adapter's configuration: its output and finish
        reason, with no event and no change to the adapter's state."""
        ...


def golden_mismatch(
    request: RequestSpec, actual: FinishedOutput, golden: FinishedOutput
) -> str | None:
    """None when `actual` equals `golden`; else a one-line account of the first difference."""
    if actual == golden:
        return None
    rid = request.request_id
    if actual.tokens != golden.tokens:
        first = first_difference(actual, golden)
        return (
            f"{rid!r} output {list(actual.tokens)} ({actual.reason.value}) differs from its "
            f"golden output {list(golden.tokens)} ({golden.reason.value}) at token {first} "
            f"(prompt {list(request.prompt)}, max_new_tokens={request.max_new_tokens})"
        )
    return (
        f"{rid!r} finished with {actual.reason.value}; decoded alone it finishes with "
        f"{golden.reason.value} (output {list(golden.tokens)})"
    )


def sampled_stop_mismatch(
    request: RequestSpec, longest: FinishedOutput, lengths: range, golden: FinishedOutput
) -> str | None:
    """`golden_mismatch` for a request with `stop_sampled` that finished with STOP, whose output
    is one of `longest.tokens`' prefixes of `lengths` (`spec.machine.stop_output_lengths`): the
    engine found a stop in its last block that the spec cannot see, or a stop token id there
    (which the golden decoding, seeing no sampled stop, finds too). None when the golden
    output agrees with `longest` on their common prefix and does not end before that block;
    else a one-line account."""
    tokens, want = longest.tokens, golden.tokens
    shorter = min(len(tokens), len(want))
    if tokens[:shorter] == want[:shorter] and len(want) >= lengths.start:
        return None
    first = first_difference(longest, golden)
    return (
        f"{request.request_id!r} stopped (a stop the spec cannot see) with output {list(tokens)} "
        f"cut to {lengths.start}..{lengths.stop - 1} tokens, but its golden output is "
        f"{list(want)} ({golden.reason.value}): they part at token {first} (prompt "
        f"{list(request.prompt)}, max_new_tokens={request.max_new_tokens})"
    )


@dataclass(frozen=True, slots=True)
class GoldenTie:
    """Where a golden decoding took a decision within float noise of flipping.

    token: the first output token (index into the generated tokens) that decision can change:
        the first generated position of its block; where: one line naming the block, the
        forward and the two sides (e.g. "block 2, forward 8: at position 3 the logits of
        tokens 11 and 4 lie 0.0e+00 apart, within the float noise 5.1e-05").
    """

    token: int
    where: str


@runtime_checkable
class ReportsGoldenTies(Protocol):
    """A `GoldenDecoder` that can tell where its golden decoding of a request took a decision
    within float noise of flipping (two candidates, or a confidence and a threshold, closer
    than the implementation's numerical tolerance between its golden and serving paths). Past
    such a decision the two paths may part with neither wrong: a mismatch report then says so.
    """

    def golden_near_tie(self, request: RequestSpec) -> GoldenTie | None:
        """The first such decision of the golden decoding of `request`, or None."""
        ...


def first_difference(actual: FinishedOutput, golden: FinishedOutput) -> int:
    """The index of the first output token where `actual` and `golden` differ (the shorter
    length when one is a prefix of the other, the length when only the reasons differ)."""
    pairs = zip(actual.tokens, golden.tokens, strict=False)
    shorter = min(len(actual.tokens), len(golden.tokens))
    return next((i for i, (a, g) in enumerate(pairs) if a != g), shorter)


def golden_tie_note(
    adapter: object,
    request: RequestSpec,
    actual: FinishedOutput,
    golden: FinishedOutput,
    followed: bool = False,
) -> str:
    """What to add to the report of `actual` differing from `golden`: '' unless `adapter`
    reports golden ties and the golden decoding took one that can change a token at or before
    the first difference; then '; ' and where, read as a possible cause. `followed`: the
    adapter's branches past its ties were tried (`explained_by_ties`) and none gives `actual`,
    so the tie is named as ruled out, not as a likely cause."""
    if not isinstance(adapter, ReportsGoldenTies):
        return ""
    tie = adapter.golden_near_tie(request)
    if tie is None or tie.token > first_difference(actual, golden):
        return ""
    if followed and isinstance(adapter, DecodesPastGoldenTies):
        return (
            f"; the golden decoding took a decision within float noise of flipping before it "
            f"({tie.where}), but decoded with that decision (and up to the adapter's bound of "
            "later ones) taken the other way it does not give this output either: not float "
            "noise at that tie"
        )
    return (
        f"; the golden decoding took a decision within float noise of flipping before it "
        f"({tie.where}): the golden and serving paths may break such a tie apart, so this "
        "difference can be float noise rather than a scheduling bug"
    )


@dataclass(frozen=True, slots=True)
class GoldenBranch:
    """A golden decoding of one request with some near-ties taken the other way.

    output: what that decoding outputs; ties: the decisions it took the other way, in order
        (each within float noise of flipping in the decoding before it), at least one.
    """

    output: FinishedOutput
    ties: tuple[GoldenTie, ...]


@runtime_checkable
class DecodesPastGoldenTies(Protocol):
    """A `ReportsGoldenTies` decoder that can follow the other side of its near-ties.

    `golden_output_past_ties(request, actual)` decodes `request` alone again, taking the other
    side of each near-tie at or before the point where its decoding parts from `actual` (one
    at a time, a bounded number), and returns the branch whose output equals `actual`, or None
    when no such branch does. Like `golden_output` it changes nothing and is deterministic.
    """

    def golden_output_past_ties(
        self, request: RequestSpec, actual: FinishedOutput
    ) -> GoldenBranch | None:
        """The golden branch (near-ties taken the other way) whose output is `actual`, or None."""
        ...


def explained_by_ties(
    adapter: object, request: RequestSpec, actual: FinishedOutput
) -> GoldenBranch | None:
    """The branch of `adapter`'s golden decoding that outputs `actual` (`DecodesPastGoldenTies`),
    or None when the adapter follows no ties or no branch outputs it. What the adapter returns
    is checked: anything but None or a `GoldenBranch` of at least one tie whose output is a
    `FinishedOutput` equal to `actual` breaks `golden_output`, saying what it returned (an
    implementation cannot excuse a mismatch with a branch that does not match)."""
    if not isinstance(adapter, DecodesPastGoldenTies):
        return None
    branch: object = adapter.golden_output_past_ties(request, actual)
    if branch is None:
        return None
    source = f"golden_output_past_ties(request {request.request_id!r}) returned"
    if not isinstance(branch, GoldenBranch):
        raise SpecViolation(
            "golden_output",
            f"{source} {type(branch).__name__}, not a spec.golden.GoldenBranch or None",
        )
    problem = wrong_output(branch.output, f"{source} a branch whose output is")
    if problem is not None:
        raise SpecViolation("golden_output", problem)
    strays = [type(t).__name__ for t in branch.ties if not isinstance(t, GoldenTie)]
    if strays:
        raise SpecViolation(
            "golden_output",
            f"{source} a branch whose ties hold {', '.join(sorted(set(strays)))}, not only "
            "spec.golden.GoldenTie",
        )
    if branch.output != actual or not branch.ties:
        raise SpecViolation(
            "golden_output",
            f"{source} a branch that does not explain {list(actual.tokens)} "
            f"({actual.reason.value}): its output is {list(branch.output.tokens)} "
            f"({branch.output.reason.value}) past {len(branch.ties)} tie(s); it returns None "
            "when no branch outputs the actual output",
        )
    return branch


def tie_agreement_note(branch: GoldenBranch) -> str:
    """How an output that equals a golden branch agrees, in one line (for a report)."""
    taken = "; ".join(tie.where for tie in branch.ties)
    return (
        f"agrees with its golden decoding once {len(branch.ties)} decision(s) within float "
        f"noise of flipping are taken the other way ({taken})"
    )
