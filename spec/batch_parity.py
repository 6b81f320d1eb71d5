"""Batch parity and golden agreement of any dLLM implementation (`schedspec parity --impl`).

The same requests are run by fresh instances of the implementation in every mode (sync, fdfo,
fdfo+reuse, fdfo+reuse+reloop) at batch size 1 and at a batch size > 1. Every run's events are
replayed into a `SpecMachine` (a violation stops the run) and after its drain the
implementation's own pools must hold nothing. A case (one request) is at parity when its output
and finish reason are the same in every run as in the reference run (sync at batch size 1), and
agrees with golden when that output equals the implementation's golden decoding
(`spec.golden.GoldenDecoder`), if it provides one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spec.adapter import SchedulerAdapter
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, SpecViolation
from spec.events import Event, Finished
from spec.golden import (
    GoldenDecoder,
    explained_by_ties,
    golden_mismatch,
    golden_tie_note,
    tie_agreement_note,
)
from spec.machine import SpecMachine
from spec.profile import DllmPolicy
from spec.snapshot import FinishedOutput, wrong_output

Factory = Callable[[DllmConfig, Callable[[Event], None]], SchedulerAdapter]


@dataclass(frozen=True, slots=True)
class ModeVariant:
    """One scheduling mode of the parity run."""

    name: str
    mode: Mode
    in_place_reuse: bool
    reloop: bool


MODE_VARIANTS: tuple[ModeVariant, ...] = (
    ModeVariant("sync", Mode.SYNC, False, False),
    ModeVariant("fdfo", Mode.FDFO, False, False),
    ModeVariant("fdfo+reuse", Mode.FDFO, True, False),
    ModeVariant("fdfo+reuse+reloop", Mode.FDFO, True, True),
)


def variant_config(base: DllmConfig, variant: ModeVariant, batch: int) -> DllmConfig:
    """`base` in `variant`'s mode with `batch` seats and rows and a pool for `batch` requests
    of the full context each (so admission never waits on pages)."""
    if batch < 1:
        raise ConfigError("batch", batch, "an integer >= 1")
    per_request = -(-base.max_context // base.page_size)
    return base.replace(
        mode=variant.mode,
        in_place_reuse=variant.in_place_reuse,
        reloop=variant.reloop,
        max_running_requests=batch,
        req_pool_rows=batch,
        kv_pages=per_request * batch,
    )


@dataclass(slots=True)
class VariantRun:
    """One run: every request's output and finish reason, leaks after the drain, the adapter
    itself (an engine's forward log is read from it) and the largest batch a forward ran."""

    name: str  # e.g. "fdfo+reuse@4"
    batch: int
    outputs: dict[str, FinishedOutput]
    leaked_slots: int
    leaked_rows: int
    widest_forward: int
    adapter: SchedulerAdapter


def run_variant(
    factory: Factory,
    config: DllmConfig,
    requests: Sequence[RequestSpec],
    name: str,
    policy: DllmPolicy | None = None,
) -> VariantRun:
    """Submit every request to a fresh instance, drain, check its events and snapshot with a
    `SpecMachine` under `policy` (the implementation's declared options; None: the idealised
    spec); raises the `SpecViolation` of the first broken rule."""
    machine = SpecMachine(config, policy)
    reasons: dict[str, Finished] = {}
    widest = 0

    def sink(event: Event) -> None:
        nonlocal widest
        machine.apply(event)
        if isinstance(event, Finished):
            reasons[event.request_id] = event
        rows = getattr(event, "rows", None)
        if event.kind == "forward" and isinstance(rows, tuple):
            widest = max(widest, len(rows))

    impl = factory(config, sink)
    for request in requests:
        impl.submit(request)
    impl.drain()
    snap = impl.snapshot()
    machine.check_snapshot(snap)
    outputs = {
        rid: FinishedOutput(tokens, reasons[rid].reason)
        for rid, tokens in machine.outputs().items()
    }
    return VariantRun(
        name,
        config.max_running_requests,
        outputs,
        snap.leaked_slots(),
        snap.held_rows(),
        widest,
        impl,
    )


@dataclass(frozen=True, slots=True)
class CaseVerdict:
    """One request across the runs.

    identical_outputs: its output and finish reason are the same in every run.
    mismatched: the runs whose output differs from the reference run's (the first run).
    golden: True/False when the implementation has a golden decoder, else None;
    golden_detail: how the reference output differs from the golden output, or how it agrees
        past near-ties taken the other way (`spec.golden.tie_agreement_note`); "" when it
        equals the golden output.
    golden_ties: how many near-ties the golden decoding took the other way to agree (0 when
        it agrees as it is, or does not).
    """

    request: RequestSpec
    output: FinishedOutput | None  # the reference run's
    identical_outputs: bool
    mismatched: tuple[str, ...]
    golden: bool | None
    golden_detail: str
    golden_ties: int = 0


def compare_variants(
    requests: Sequence[RequestSpec],
    runs: Sequence[VariantRun],
    golden: Mapping[str, FinishedOutput] | None,
) -> list[CaseVerdict]:
    """One verdict per request: every run against the first (the reference run), and the
    reference output against `golden` (request id -> golden output) when given."""
    ref = runs[0]
    verdicts: list[CaseVerdict] = []
    for request in requests:
        rid = request.request_id
        want = ref.outputs.get(rid)
        bad = tuple(r.name for r in runs[1:] if r.outputs.get(rid) != want)
        agrees: bool | None = None
        detail = ""
        ties = 0
        if golden is not None:
            if want is None:
                agrees, detail = False, f"{rid!r} did not finish in the reference run"
            else:
                detail = golden_mismatch(request, want, golden[rid]) or ""
                branch = explained_by_ties(ref.adapter, request, want) if detail else None
                if branch is not None:  # a correct decoding: a tie broken the other way
                    agrees, detail, ties = True, tie_agreement_note(branch), len(branch.ties)
                else:
                    if detail:
                        detail += golden_tie_note(
                            ref.adapter, request, want, golden[rid], followed=True
                        )
                    agrees = not detail
        verdicts.append(
            CaseVerdict(request, want, want is not None and not bad, bad, agrees, detail, ties)
        )
    return verdicts


def golden_outputs(
    adapter: SchedulerAdapter, requests: Sequence[RequestSpec]
) -> dict[str, FinishedOutput] | None:
    """Every request's golden output when the adapter is a `GoldenDecoder`, else None. A
    `golden_output` that returns no `FinishedOutput` breaks `golden_output`, saying what it
    returned (`spec.snapshot.wrong_output`), rather than failing later in the comparison."""
    if not isinstance(adapter, GoldenDecoder):
        return None
    goldens: dict[str, FinishedOutput] = {}
    for r in requests:
        output: object = adapter.golden_output(r)
        problem = wrong_output(output, f"golden_output(request {r.request_id!r}) returned")
        if problem is not None or not isinstance(output, FinishedOutput):
            raise SpecViolation("golden_output", problem or "not a spec.FinishedOutput")
        goldens[r.request_id] = output
    return goldens


def context_for(requests: Sequence[RequestSpec], block_size: int, page_size: int) -> int:
    """The smallest page-aligned max_context that fits every request (prompt blocks, then the
    new tokens in whole blocks)."""
    need = max(-(-(len(r.prompt) + r.max_new_tokens) // block_size) for r in requests)
    return -(-need * block_size // page_size) * page_size


def timing_key(mode: str, size: int, widest: int) -> str:
    """A parity report's `seconds` key of a run of `mode` at the batch-size setting `size` (1 or
    `--batch`), named by the batch size it ran at: `widest` (the report's `batch_sizes[1]`)
    for the batched setting, whose forwards held at most as many rows as there are prompts;
    where that is 1 too, `--batch` is added so that no key collides with batch size 1's."""
    if size == 1:
        return f"{mode}@1"
    return f"{mode}@{widest}" if widest > 1 else f"{mode}@1 (--batch {size})"


def batch_sizes_clause(batch_sizes: Sequence[int]) -> str:
    """The parity summary's words for the batch sizes its runs reached (a report's
    `batch_sizes`: 1, then the widest forward of the batched runs). When no batched run held
    two rows at once (one prompt, or an implementation that seats one request), it says that
    batch parity was not exercised, rather than list a batch size of 1 twice."""
    if any(size > 1 for size in batch_sizes):
        return (
            f"every mode at batch sizes {', '.join(map(str, batch_sizes))} vs sync at batch size 1"
        )
    return (
        "every mode at batch size 1 vs sync at batch size 1; batch parity not exercised: no "
        "batched run held two rows at once, which takes two prompts or more"
    )


def golden_column(golden: bool | None, ties: int) -> str:
    """A case's golden verdict in a report's table: same, tie (same once near-ties are taken
    the other way), DIFF, or - (not checked)."""
    if golden is True and ties:
        return "tie"
    return {True: "same", False: "DIFF", None: "-"}[golden]


def golden_verdict(golden: bool, ties: Sequence[int]) -> str:
    """The golden part of a report's summary line; it counts the cases that agree only once
    near-ties are taken the other way."""
    if not golden:
        return "golden DIFFERS"
    through = sum(1 for n in ties if n)
    if not through:
        return "golden agrees"
    return f"golden agrees ({through} case(s) once float ties are taken the other way: 'tie')"
