"""Shrinking a failing engine-core program to a small one that fails the same way.

A generated program that breaks a rule (`integrations.vllm.engine_core.core_program(seed)`, and
the narrowed generators) has a dozen requests, aborts and a configuration drawn at random; what
an upstream report needs is the few of them that matter. `shrink(program, fails)` removes and
reduces, greedily, while `fails` still holds of the result:

1. whole requests (an aborted request's aborts go with it), then single aborts, then steps with
   no arrival and no abort (and, last of all changes, two whole requests at once);
2. each request's sizes: `max_tokens` and `prompt_len` to 1, else down by one (a shared prompt
   is cut with it), its stop token, priority and shared prompt dropped;
3. the configuration: seats, the token budget, the long-prefill threshold, the pool and the
   model length down by one, prefix caching and chunked prefill off (a change that makes the
   configuration or a request invalid is skipped).

It starts again from the first kind after every change it keeps, and stops when no change is
kept (the result is then 1-minimal for these changes, and no pair of its requests can go) or
after `budget` runs.

The connector's store and the speculative model draw from a hash of the program's text
(`engine_core.program_seed`); a candidate would draw anew, and a failure that needs one draw (a
load that fails) would seldom survive a change. `fails_like(options, async_scheduling, rule,
draw_seed)` holds the draws at `draw_seed` (give the original program's `program_seed`): the
program, run in one loop with `options` and those draws, breaks `rule` there (a configuration
vLLM refuses does not fail). The smaller program then reproduces with `LoopOptions(...,
draw_seed=...)`; the store's per-request draws hash the request ids, which a change never
renames. The failure kept is the same rule in the same loop, not always the same interleaving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.encoder_inputs import EncoderOptions
from integrations.vllm.engine_core import CoreProgram, LoopOptions, run_loop
from integrations.vllm.source_text import dataclass_source, program_text
from spec.ar.config import ArRequest, validate_ar_request
from spec.errors import ConfigError, RequestError

#: Runs `shrink` makes at most, by default.
SHRINK_BUDGET = 3000


class Stepped(Protocol):
    """A program of steps: per engine step, the requests that arrive (each with a
    `request_id`) and the ids aborted before it. `CoreProgram` and the diffusion loop's
    `DllmProgram` are both; `step_removals` and `greedy_shrink` serve both."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a dataclass: `replace` makes candidates

    @property
    def arrivals(self) -> tuple[tuple[Any, ...], ...]:
        """Per step, the requests that arrive (each with `request_id`, `prompt_len` and
        `max_tokens`)."""
        ...

    @property
    def aborts(self) -> tuple[tuple[str, ...], ...]:
        """Per step, the ids of the requests aborted before it."""
        ...


ProgramT = TypeVar("ProgramT", bound=Stepped)
#: A program of any kind a run takes (`breaking`, `passing_too`).
RunT = TypeVar("RunT")


@dataclass(frozen=True, slots=True)
class Shrunk(Generic[ProgramT]):
    """The smallest program found, the runs it took, and whether the budget ran out first."""

    program: ProgramT
    runs: int
    exhausted: bool


def fails_like(
    options: LoopOptions, async_scheduling: bool, rule: str, draw_seed: int | None = None
) -> Callable[[CoreProgram], EngineCoreViolation | None]:
    """A `fails` for `shrink`: the violation of `rule` a program's run in the one loop raises,
    with `options` and draws seeded by `draw_seed` (None: the program's own), else None
    (another rule, a pass, or a configuration vLLM refuses)."""
    held = replace(options, draw_seed=draw_seed) if draw_seed is not None else options
    return breaking(
        lambda program: run_loop(program, async_scheduling=async_scheduling, options=held), rule
    )


def lifted_by(
    fails: Callable[[CoreProgram], EngineCoreViolation | None],
    fixed: LoopOptions,
    async_scheduling: bool,
    draw_seed: int | None = None,
) -> Callable[[CoreProgram], EngineCoreViolation | None]:
    """`fails`, kept only where the same program passes the one loop with `fixed` (the same
    options with a finding's fix made, draws seeded by `draw_seed`): a shrink under it keeps
    the failure that fix lifts, and cannot drift to another bug that breaks the same rule."""
    held = replace(fixed, draw_seed=draw_seed) if draw_seed is not None else fixed
    return passing_too(
        fails, lambda program: run_loop(program, async_scheduling=async_scheduling, options=held)
    )


def breaking(
    run: Callable[[RunT], object], rule: str
) -> Callable[[RunT], EngineCoreViolation | None]:
    """A `fails` for any kind of program: the violation of `rule` that `run(program)` raises,
    else None (another rule, a pass, or a configuration or request vLLM refuses)."""

    def fails(program: RunT) -> EngineCoreViolation | None:
        try:
            run(program)
        except EngineCoreViolation as err:
            return err if err.rule == rule else None
        except (ConfigError, RequestError):
            return None
        return None

    return fails


def passing_too(
    fails: Callable[[RunT], EngineCoreViolation | None], fixed: Callable[[RunT], object]
) -> Callable[[RunT], EngineCoreViolation | None]:
    """`fails`, kept only where `fixed(program)` (the same run with a finding's fix made)
    breaks no rule and is not refused: a shrink under it keeps the failure that fix lifts."""

    def still(program: RunT) -> EngineCoreViolation | None:
        err = fails(program)
        if err is None:
            return None
        try:
            fixed(program)
        except (EngineCoreViolation, ConfigError, RequestError):
            return None
        return err

    return still


def shrink(
    program: CoreProgram,
    fails: Callable[[CoreProgram], object],
    *,
    budget: int = SHRINK_BUDGET,
) -> Shrunk[CoreProgram]:
    """The smallest program reached from `program` by the changes above, each kept only if
    `fails` (truthy) holds of its result. `program` itself must fail (`ValueError` if not)."""
    return greedy_shrink(program, fails, reductions, budget=budget)


def greedy_shrink(
    program: ProgramT,
    fails: Callable[[ProgramT], object],
    reduce: Callable[[ProgramT], Iterable[ProgramT]],
    *,
    budget: int = SHRINK_BUDGET,
) -> Shrunk[ProgramT]:
    """The shrinking loop, for any kind of program: try `reduce(current)`'s candidates in
    order, keep the first that `fails`, start again from it; stop when none is kept (the result
    is then 1-minimal for `reduce`) or after `budget` runs of `fails`. `ValueError` if
    `program` itself does not fail."""
    if not fails(program):
        raise ValueError("the program to shrink does not fail")
    runs = 1
    current = program
    changed = True
    while changed:
        changed = False
        for candidate in reduce(current):
            if runs >= budget:
                return Shrunk(current, runs, exhausted=True)
            runs += 1
            if fails(candidate):
                current, changed = candidate, True
                break
    return Shrunk(current, runs, exhausted=False)


def size(program: Stepped) -> tuple[int, int, int]:
    """Requests, aborts and tokens (prompt and output, at most) of `program` (either kind)."""
    requests = [r for batch in program.arrivals for r in batch]
    tokens = sum(r.prompt_len + r.max_tokens for r in requests)
    return len(requests), sum(len(a) for a in program.aborts), tokens


def program_source(program: CoreProgram) -> str:
    """`program` as Python that builds it (`CoreProgram` from `integrations.vllm.engine_core`,
    `ArConfig`, `ArRequest` and `Policy` from `spec.ar.config`): the configuration's sizes and
    each other field that differs from its default, a request's id and sizes by position."""
    return program_text(program, dataclass_source(program.config, always=_CONFIG_SIZES))


#: The configuration's sizes, printed even where they are the defaults.
_CONFIG_SIZES = (
    "block_size",
    "num_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
)


def reductions(program: CoreProgram) -> Iterator[CoreProgram]:
    """Every one-change reduction of `program`, in the order `shrink` tries them, valid ones
    only."""
    for candidate in (
        *step_removals(program),
        *request_reductions(program, _smaller_requests),
        *input_reductions(program),
        *_config(program),
        *pair_removals(program),
    ):
        if _valid(candidate):
            yield candidate


def step_removals(program: ProgramT) -> Iterator[ProgramT]:
    """`program` less one request (its aborts and session inputs go with it), less one abort,
    less one session input, or less one step with neither an arrival, an abort nor an input,
    in that order."""
    inputs: tuple[tuple[Any, ...], ...] = getattr(program, "inputs", ())
    ids = [r.request_id for batch in program.arrivals for r in batch]
    for rid in ids:
        yield _without_requests(program, {rid})
    for step, aborted in enumerate(program.aborts):
        for rid in aborted:
            aborts = list(program.aborts)
            aborts[step] = tuple(a for a in aborted if a != rid)
            yield replace(program, aborts=tuple(aborts))
    for step, sent in enumerate(inputs):
        for index in range(len(sent)):
            fewer = list(inputs)
            fewer[step] = sent[:index] + sent[index + 1 :]
            yield replace(program, inputs=tuple(fewer))
    for step in range(len(program.arrivals)):
        if (
            len(program.arrivals) > 1
            and not program.arrivals[step]
            and not program.aborts[step]
            and not (inputs and inputs[step])
        ):
            shorter = {
                "arrivals": program.arrivals[:step] + program.arrivals[step + 1 :],
                "aborts": program.aborts[:step] + program.aborts[step + 1 :],
            }
            if inputs:
                shorter["inputs"] = inputs[:step] + inputs[step + 1 :]
            yield replace(program, **shorter)


def pair_removals(program: ProgramT) -> Iterator[ProgramT]:
    """`program` less two requests at once (their aborts and session inputs go with them),
    pair by pair in arrival order. Tried last, so only where no single change is kept: a
    failure that needs the requests' parity (every other request guided, say) survives no
    single removal and may survive a pair's."""
    ids = [r.request_id for batch in program.arrivals for r in batch]
    for i, first in enumerate(ids):
        for second in ids[i + 1 :]:
            yield _without_requests(program, {first, second})


def _without_requests(program: ProgramT, gone: set[str]) -> ProgramT:
    """`program` less the requests `gone`, with their aborts and session inputs; every step
    kept (an emptied one is removed by its own reduction)."""
    without: dict[str, Any] = {
        "arrivals": tuple(
            tuple(r for r in batch if r.request_id not in gone) for batch in program.arrivals
        ),
        "aborts": tuple(tuple(a for a in step if a not in gone) for step in program.aborts),
    }
    inputs: tuple[tuple[Any, ...], ...] = getattr(program, "inputs", ())
    if inputs:
        without["inputs"] = tuple(
            tuple(x for x in step if x.request_id not in gone) for step in inputs
        )
    return replace(program, **without)


def input_reductions(program: CoreProgram) -> Iterator[CoreProgram]:
    """`program` with one session input's `prompt_len` or `max_tokens` lowered (`lower`)."""
    for step, sent in enumerate(program.inputs):
        for index, item in enumerate(sent):
            if item.closes:
                continue
            for smaller in (
                *(replace(item, prompt_len=n) for n in lower(item.prompt_len)),
                *(replace(item, max_tokens=n) for n in lower(item.max_tokens)),
            ):
                inputs = list(program.inputs)
                inputs[step] = (*sent[:index], smaller, *sent[index + 1 :])
                yield replace(program, inputs=tuple(inputs))


def request_reductions(
    program: ProgramT, smaller: Callable[[Any], Iterable[Any]]
) -> Iterator[ProgramT]:
    """`program` with one request replaced by one of `smaller(request)`, request by request."""
    for step, batch in enumerate(program.arrivals):
        for index, request in enumerate(batch):
            for reduced in smaller(request):
                arrivals = list(program.arrivals)
                arrivals[step] = (*batch[:index], reduced, *batch[index + 1 :])
                yield replace(program, arrivals=tuple(arrivals))


def lower(value: int) -> list[int]:
    """The values a size `value` is lowered to, in order: 1, then one less (each >= 1 and
    below `value`)."""
    return [n for n in sorted({1, value - 1}) if 1 <= n < value]


def _smaller_requests(r: ArRequest) -> Iterator[ArRequest]:
    for tokens in lower(r.max_tokens):
        stop = r.stop_after if r.stop_after is None or r.stop_after <= tokens else None
        yield replace(r, max_tokens=tokens, stop_after=stop)
    for length in lower(r.prompt_len):
        prompt = None if r.prompt is None else r.prompt[:length]
        yield replace(r, prompt_len=length, prompt=prompt)
    if r.stop_after is not None:
        yield replace(r, stop_after=None)
    if r.priority:
        yield replace(r, priority=0)
    if r.prompt is not None:
        yield replace(r, prompt=None)


def _config(program: CoreProgram) -> Iterator[CoreProgram]:
    c = program.config
    lowered = {
        "max_num_seqs": c.max_num_seqs - 1,
        "max_num_batched_tokens": c.max_num_batched_tokens - 1,
        "long_prefill_token_threshold": 0 if c.long_prefill_token_threshold else -1,
        "num_blocks": c.num_blocks - 1,
        "max_model_len": c.max_model_len - 1,
        "enable_prefix_caching": False if c.enable_prefix_caching else None,
        "enable_chunked_prefill": False if c.enable_chunked_prefill else None,
    }
    for name, value in lowered.items():
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value < 0):
            continue
        try:
            yield replace(program, config=c.replace(**{name: value}))
        except ConfigError:
            continue


def _valid(program: CoreProgram) -> bool:
    """Every request of `program` fits its configuration (vLLM would refuse it otherwise, and
    the loop would drop it silently)."""
    try:
        for batch in program.arrivals:
            for request in batch:
                validate_ar_request(program.config, request)
    except (ConfigError, RequestError):
        return False
    return any(program.arrivals)


#: The `LoopOptions` fields a shrunk program's record leaves out (code, or the run's own).
UNRECORDED = ("mutate", "fix", "draw_seed", "trace")


def recorded_options(options: LoopOptions) -> dict[str, object]:
    """`options` as a shrunk program's record keeps them (`scripts/vllm_shrink.py --json`):
    every field but `UNRECORDED`, the multimodal options (`encoder`) as their fields."""
    return {
        f.name: asdict(value) if isinstance(value, EncoderOptions) else value
        for f in fields(options)
        if f.name not in UNRECORDED
        for value in (getattr(options, f.name),)
    }


def options_of_record(recorded: dict[str, Any], **more: Any) -> LoopOptions:
    """The `LoopOptions` a record's `options` (`recorded_options`) stand for, with `more`."""
    values = dict(recorded)
    if values.get("encoder") is not None:
        values["encoder"] = EncoderOptions(**values["encoder"])
    return LoopOptions(**values, **more)


__all__ = [
    "SHRINK_BUDGET",
    "UNRECORDED",
    "Shrunk",
    "Stepped",
    "breaking",
    "fails_like",
    "greedy_shrink",
    "lifted_by",
    "lower",
    "options_of_record",
    "passing_too",
    "program_source",
    "recorded_options",
    "reductions",
    "request_reductions",
    "shrink",
    "size",
    "step_removals",
]
