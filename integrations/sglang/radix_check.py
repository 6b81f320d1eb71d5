"""SGLang 0.5.23's dLLM path with its block-level radix cache on, checked by outcome and by the
dLLM spec on its event log.

SGLang serves dLLMs with the radix cache on by default since its PR #18724: whole committed
blocks of a finished (or running) request stay in the tree, and a later request whose prompt
starts with the same tokens reuses their KV (`Req.init_next_round_input` -> `match_kv_cache`,
bounded to whole committed blocks: "Appended masks and a partial prompt/output block are not
reusable KV"). `RadixLoop` runs SGLang's real path with it on (`engine.build(radix_cache=True)`,
the same scripted step) over programs whose requests share prompts and continue each other's
outputs, and checks what must hold whatever the cache does (the conformance suite checks the
same path under the spec's prefix cache, with generated requests):

- `output_content`: every finished request's output is exactly its scripted tokens (the script
  fixes a token per request and position), the length `max_new_tokens`;
- `cache_hit_clean`: every block a newly admitted request takes from the cache was last
  written by one forward, whole, with exactly the request's own tokens at those positions: a
  block's KV depends on the whole block (bidirectional attention inside it), so a block whose
  slots were last written with masks, or in different forwards, holds KV the request would
  not compute itself;
- `pool_accounting`, after every round: no slot is both free in the allocator and held, by a
  live request's row or by the tree;
- `no_leak`, once drained: no request row is held, nothing in the tree is locked, and every
  usable slot is free or evictable in the tree;
- `progress`: the loop drains within a bound; SGLang raising is `implementation_error`;
- `spec:<rule>` (with `spec`, the default): the run's event log, written by `SglangEventLog`
  attached as on a server, breaks that rule of the dLLM spec with its prefix cache
  (`DllmConfig.prefix_cache`: `KvCached`, `CacheHit`, `CacheReleased`, `CacheEvicted`). The log
  is checked up to where the run stopped, and its violation is reported before an outcome
  rule's (it is the earlier symptom).

Writes are read where the worker runs a batch: each forward writes the KV of its input ids at
the batch's `out_cache_loc`. Depends on `integrations.sglang.engine` (SGLang imported there).
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from integrations.sglang.adapter import engine_request_id
from integrations.sglang.engine import (
    Engine,
    build,
    import_engine,
    new_request,
    queue_request,
    run_worker,
    scripted_token,
)
from integrations.sglang.event_log import SglangEventLog
from spec.config import DllmConfig, Mode, RequestSpec, validate_request
from spec.errors import RequestError, SpecViolation
from spec.events import CacheEvicted, CacheHit, KvCached
from spec.machine import SpecMachine
from spec.profile import DllmPolicy
from spec.trace import iter_trace

RULES = (
    "output_content",
    "cache_hit_clean",
    "pool_accounting",
    "no_leak",
    "progress",
    "implementation_error",
    "spec:<rule>",
)


class RadixViolation(Exception):
    """A rule the radix-cache loop broke: `rule` and what was seen."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"[{rule}] {detail}")
        self.rule = rule
        self.detail = detail


@dataclass(frozen=True, slots=True)
class RadixRequest:
    """A request: its prompt, how many tokens it generates at most (no EOS), and the token ids
    that stop it (SGLang's `stop_token_ids`: the first one generated ends it, kept)."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RadixProgram:
    """A configuration and, per round, the ids aborted and then the requests that arrive before
    it (then the loop drains). `aborts` is empty, or one tuple per round."""

    config: DllmConfig
    arrivals: tuple[tuple[RadixRequest, ...], ...]
    aborts: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.aborts and len(self.aborts) != len(self.arrivals):
            raise ValueError(
                f"RadixProgram: {len(self.arrivals)} rounds of arrivals but {len(self.aborts)} "
                "of aborts; give one tuple of aborts per round, or none"
            )


@dataclass
class RadixCounts:
    """How often the cache's paths were taken over a run."""

    rounds: int = 0
    forwards: int = 0
    aborts: int = 0  # live requests aborted
    stops: int = 0  # requests that ended at a stop token before max_new_tokens
    hits: int = 0  # admissions that took at least one block from the cache
    hit_blocks: int = 0  # blocks taken from the cache, over those admissions
    evictions: int = 0  # rounds after which the tree held fewer slots than before
    log_cached: int = 0  # the event log's `KvCached` events (blocks that entered the cache)
    log_hits: int = 0  # its `CacheHit` events (blocks read from the cache)
    log_evicted: int = 0  # its `CacheEvicted` events


def expected_output(request: RadixRequest, mask: int) -> tuple[int, ...]:
    """The scripted output of `request`: its token at each generated position, up to and with
    the first of its stop tokens."""
    n = len(request.prompt)
    out: list[int] = []
    for i in range(request.max_new_tokens):
        out.append(scripted_token(request.request_id, n + i, mask))
        if out[-1] in request.stop_token_ids:
            break
    return tuple(out)


@dataclass
class RadixLoop:
    """SGLang's dLLM scheduler and worker with the radix cache on, driven round by round as its
    event loop does (`get_next_batch_to_run`, the worker, `process_batch_result_dllm`), with
    the checks of the module. `mutate`, if given, is applied to the engine once built (seeded
    bugs). With `spec`, an `SglangEventLog` writes the run's events to `log` (attached after
    `mutate`, as on a server whose code has the bug)."""

    config: DllmConfig
    mutate: Callable[[Engine], None] | None = None
    radix_cache: bool = True
    spec: bool = True
    schedule_policy: str | None = None  # SGLang's `--schedule-policy` (None: fcfs)
    log: list[str] = field(default_factory=list)
    engine: Engine = field(init=False)
    counts: RadixCounts = field(default_factory=RadixCounts)
    written: dict[int, tuple[int, int]] = field(default_factory=dict)  # slot -> (token, forward)
    requests: dict[str, RadixRequest] = field(default_factory=dict)
    reqs: dict[str, Any] = field(default_factory=dict)  # request id -> SGLang Req
    admitted: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    _spec_id: dict[int, str] = field(default_factory=dict)
    _batch: Any = None

    def __post_init__(self) -> None:
        self.engine = build(
            self.config,
            self._spec_id,
            radix_cache=self.radix_cache,
            schedule_policy=self.schedule_policy,
        )
        runner = self.engine.worker._model_runner
        forward = runner.forward

        def recorded(forward_batch: Any, pp_proxy_tensors: Any = None) -> Any:
            self.counts.forwards += 1
            slots = self._batch.out_cache_loc.tolist()
            for slot, token in zip(slots, forward_batch.input_ids.tolist(), strict=True):
                self.written[int(slot)] = (int(token), self.counts.forwards)
            return forward(forward_batch, pp_proxy_tensors)

        runner.forward = recorded
        if self.mutate is not None:
            self.mutate(self.engine)
        if self.spec:
            SglangEventLog(self.engine.scheduler, self.log.append, worker=self.engine.worker)

    # ------------------------------------------------------------------ driving
    def submit(self, request: RadixRequest) -> None:
        """Queue `request` as `handle_generate_request` does."""
        rid = engine_request_id(request.request_id)
        req = new_request(
            self.engine,
            rid,
            request.prompt,
            request.max_new_tokens,
            stop_token_ids=request.stop_token_ids,
        )
        self._spec_id[id(req)] = request.request_id
        self.requests[request.request_id] = request
        self.reqs[request.request_id] = req
        queue_request(self.engine, req)

    def round(self) -> None:
        """One round of SGLang's event loop, checked."""
        s = self.engine.scheduler
        before = self._tree_size()
        plan = _call(
            "get_next_batch_to_run", lambda: s.get_next_batch_to_run(s.running_batch, s.last_batch)
        )
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch is not None:
            self._check_hits(batch)
            self._batch = batch
            result = _call("the worker", lambda: run_worker(self.engine, batch))
            _call("process_batch_result_dllm", lambda: s.process_batch_result_dllm(batch, result))
        s.last_batch = batch
        self.counts.rounds += 1
        if self._tree_size() < before:
            self.counts.evictions += 1
        self._check_pool(f"after round {self.counts.rounds}")

    def abort(self, request_id: str) -> None:
        """Abort `request_id` as SGLang's `abort_request` does (by its engine id, which no other
        id starts with); nothing for one finished or never submitted."""
        if request_id not in self.live():
            return
        self.counts.aborts += 1
        self.aborted.add(request_id)
        s = self.engine.scheduler
        abort = import_engine()["AbortReq"](rid=engine_request_id(request_id))
        _call("abort_request", lambda: s.abort_request(abort))
        self._check_pool(f"after aborting {request_id!r}")

    def live(self) -> list[str]:
        """Requests submitted and not finished: an aborted one while SGLang still holds it
        somewhere (its queues, the dLLM manager's, the running batch)."""
        s = self.engine.scheduler
        manager = s.dllm_manager
        present = {
            id(r)
            for queue in (s.waiting_queue, manager.waiting_queue, manager.staging_queue)
            for r in queue
        }
        present |= {id(r) for r in s.running_batch.reqs}
        return [
            rid
            for rid, req in self.reqs.items()
            if not req.finished() and (rid not in self.aborted or id(req) in present)
        ]

    def run(self, program: RadixProgram, *, max_rounds: int = 5_000) -> RadixCounts:
        """Each round's aborts and arrivals, then the round; then drain; the end checks."""
        aborts = program.aborts or tuple(() for _ in program.arrivals)
        for arrivals, ended in zip(program.arrivals, aborts, strict=True):
            for rid in ended:
                self.abort(rid)
            for request in arrivals:
                self.submit(request)
            self.round()
        for _ in range(max_rounds):
            if not self.live():
                break
            self.round()
        else:
            raise RadixViolation(
                "progress", f"not drained after {max_rounds} rounds: {self.live()} still live"
            )
        self._check_drained()
        self._check_outputs()
        return self.counts

    # ------------------------------------------------------------------ checks
    def _check_hits(self, batch: Any) -> None:
        """`cache_hit_clean` for each request of `batch` admitted for the first time."""
        b = self.config.block_size
        table = self.engine.req_to_token_pool.req_to_token
        for req in batch.reqs:
            rid = self._spec_id[id(req)]
            if rid in self.admitted:
                continue
            self.admitted.add(rid)
            n = int(getattr(req, "prefix_len", 0) or 0)
            if n == 0:
                continue
            self.counts.hits += 1
            self.counts.hit_blocks += n // b
            slots = [int(x) for x in table[req.kv.req_pool_idx, :n].tolist()]
            tokens = list(req.origin_input_ids) + list(req.output_ids)
            for k in range(n // b):
                block = slots[k * b : (k + 1) * b]
                want = [int(t) for t in tokens[k * b : (k + 1) * b]]
                seen = [self.written.get(slot) for slot in block]
                forwards = {w[1] for w in seen if w is not None}
                got = [w[0] if w is not None else None for w in seen]
                if None in got or got != want or len(forwards) != 1:
                    how = (
                        "never written"
                        if None in got
                        else f"last written with {got} by forwards {sorted(forwards)}"
                    )
                    raise RadixViolation(
                        "cache_hit_clean",
                        f"{rid!r} is admitted with block {k} (slots {block}) from the cache, "
                        f"{how}; its tokens there are {want}, written whole by one forward",
                    )

    def _free(self) -> set[int]:
        p = self.config.page_size
        pages = self.engine.allocator.get_all_free_pages()
        return {
            int(page) * p + off
            for page in ([] if pages is None else pages.tolist())
            for off in range(p)
        }

    def _tree_slots(self) -> set[int]:
        values = self.engine.tree_cache.all_values_flatten()
        return {int(v) for v in values.tolist()}

    def _tree_size(self) -> int:
        return len(self._tree_slots())

    def _check_pool(self, where: str) -> None:
        """`pool_accounting`: no slot both free and held (by a live request's row or the
        tree)."""
        free = self._free()
        table = self.engine.req_to_token_pool.req_to_token
        for rid in self.live():
            req = self.reqs[rid]
            idx = req.kv.req_pool_idx
            if idx is None:
                continue
            held = {int(x) for x in table[idx, : int(req.kv.kv_allocated_len)].tolist()}
            both = sorted(held & free)
            if both:
                raise RadixViolation(
                    "pool_accounting", f"{where}: {rid!r} holds slots {both[:8]} that are free"
                )
        both = sorted(self._tree_slots() & free)
        if both:
            raise RadixViolation(
                "pool_accounting", f"{where}: the tree holds slots {both[:8]} that are free"
            )

    def _check_drained(self) -> None:
        """`no_leak`: no row held, nothing locked in the tree, every usable slot free or
        evictable."""
        tree = self.engine.tree_cache
        rows = self.engine.req_to_token_pool.available_size()
        usable = self.config.kv_pages * self.config.page_size
        free = len(self._free())
        evictable = int(tree.evictable_size())
        problems = []
        if rows != self.config.req_pool_rows:
            problems.append(f"{self.config.req_pool_rows - rows} request rows still held")
        if int(tree.protected_size()):
            problems.append(f"{int(tree.protected_size())} slots still locked in the tree")
        if free + evictable != usable:
            problems.append(f"{free} free + {evictable} evictable of {usable} slots")
        if problems:
            raise RadixViolation("no_leak", "drained, but " + "; ".join(problems))

    def _check_outputs(self) -> None:
        """`output_content`: each request's output is its scripted tokens (an aborted one's, a
        prefix of them)."""
        mask = self.config.mask_token_id
        for rid, request in self.requests.items():
            req = self.reqs[rid]
            n = req.finished_len if req.finished_len is not None else len(req.output_ids)
            got = tuple(int(t) for t in req.output_ids[:n])
            want = expected_output(request, mask)
            self.counts.stops += rid not in self.aborted and len(want) < request.max_new_tokens
            if rid in self.aborted:
                want = want[: len(got)]
            if got != want:
                at = next(
                    (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                    min(len(got), len(want)),
                )
                raise RadixViolation(
                    "output_content",
                    f"{rid!r} produced {len(got)} tokens, expected {len(want)}; they first "
                    f"differ at output {at + 1}",
                )


def _call(what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except RadixViolation:
        raise
    except Exception as err:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raise RadixViolation(
            "implementation_error",
            f"SGLang raised in {what}: {type(err).__name__}: {err} "
            f"({frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno})",
        ) from err


def radix_program(seed: int, *, pressure: bool = False) -> RadixProgram:
    """A random program where the cache matters: a few shared prompt stems, and requests that
    continue an earlier request's output (its prompt plus some of its scripted tokens, so they
    hit blocks written by denoising); FDFO or sync; aborts of earlier requests before some
    rounds; a stop token for some requests. With `pressure` the pool is redrawn between one
    request's whole context and every running request's (SGLang's known KV-pressure findings
    then bind, unless fixed). The pool holds every running request's
    whole context (so SGLang's known KV-pressure findings stay out of the way) plus a little:
    the tree's cached blocks fill the rest and are evicted on demand; rows >= seats."""
    rnd = random.Random(seed)
    b = rnd.choice((2, 4))
    seats = rnd.randint(1, 4)
    max_context = b * rnd.randint(6, 10)
    mode = rnd.choice((Mode.FDFO, Mode.SYNC))
    config = DllmConfig(
        block_size=b,
        page_size=b,
        kv_pages=seats * (max_context // b + 1) + rnd.randint(0, max_context // b),
        req_pool_rows=seats + rnd.randint(0, 2),
        max_running_requests=seats,
        max_context=max_context,
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
        mask_token_id=0,
        eos_token_id=None,
    )
    stems = [tuple(rnd.randint(1, 50) for _ in range(rnd.randint(b, 3 * b))) for _ in range(2)]
    made: list[RadixRequest] = []
    for i in range(rnd.randint(3, 8)):
        if made and rnd.random() < 0.4:
            base = rnd.choice(made)
            out = expected_output(base, config.mask_token_id)
            prompt = base.prompt + out[: rnd.randint(1, len(out))]
        else:
            stem = rnd.choice(stems)
            prompt = stem + tuple(rnd.randint(1, 50) for _ in range(rnd.randint(0, b)))
        prompt = prompt[: max_context - 3 * b]
        made.append(RadixRequest(f"r{i}", prompt, _fitting(config, len(prompt), rnd)))
    # a stop token for some: one of the request's own scripted tokens, drawn apart
    stopper = random.Random(seed * 7919 + 5)
    for i, request in enumerate(made):
        if stopper.random() < 0.3:
            at = stopper.randrange(request.max_new_tokens)
            stop = scripted_token(
                request.request_id, len(request.prompt) + at, config.mask_token_id
            )
            made[i] = RadixRequest(
                request.request_id, request.prompt, request.max_new_tokens, (stop,)
            )
    arrivals: list[tuple[RadixRequest, ...]] = []
    step: list[RadixRequest] = []
    for request in made:
        step.append(request)
        if rnd.random() < 0.5:
            arrivals.append(tuple(step))
            step = []
            arrivals.extend(() for _ in range(rnd.randint(0, 6)))
    arrivals.append(tuple(step))
    # aborts of earlier requests before some rounds, drawn apart (the rest of the program is
    # the same with or without them)
    cut = random.Random(seed * 7919 + 3)
    seen: list[str] = []
    aborts: list[tuple[str, ...]] = []
    for batch in arrivals:
        aborts.append(tuple(rid for rid in seen if cut.random() < 0.03))
        seen.extend(r.request_id for r in batch)
    if pressure:
        per = max_context // b + 1
        squeeze = random.Random(seed + 99)
        config = replace(config, kv_pages=squeeze.randint(per, max(per, seats * per)))
    return RadixProgram(config, tuple(arrivals), tuple(aborts))


def _fitting(config: DllmConfig, prompt_len: int, rnd: random.Random) -> int:
    """A `max_new_tokens` the spec accepts for a prompt of `prompt_len` (`validate_request`)."""
    for _ in range(100):
        n = rnd.randint(1, config.max_context - prompt_len)
        try:
            validate_request(config, RequestSpec("probe", (1,) * prompt_len, n))
        except RequestError:
            continue
        return n
    return 1


def check_program(
    program: RadixProgram,
    mutate: Callable[[Engine], None] | None = None,
    *,
    radix_cache: bool = True,
    spec: bool = True,
    schedule_policy: str | None = None,
) -> RadixCounts:
    """Run `program` through a fresh `RadixLoop` (with the cache off: the control; with
    `schedule_policy`, under that `--schedule-policy`, whose order a log declares free when
    it is SGLang's own), raising `RadixViolation` on a broken rule; with `spec`, its event log
    is checked against the dLLM spec too (`spec:<rule>`, reported first: see the module)."""
    loop = RadixLoop(program.config, mutate, radix_cache, spec, schedule_policy)
    try:
        counts = loop.run(program)
    except RadixViolation:
        if spec:
            check_log(loop.log, loop.counts)
        raise
    if spec:
        check_log(loop.log, counts)
    return counts


def check_log(lines: list[str], counts: RadixCounts) -> None:
    """Replay an `SglangEventLog`'s lines into a `SpecMachine` under the configuration and
    policy its header declares (as `schedspec check-trace` does), counting its cache events
    into `counts`; a `RadixViolation` `spec:<rule>` at the first violation."""
    config: DllmConfig | None = None
    policy: DllmPolicy | None = None
    machine: SpecMachine | None = None
    for line, item in iter_trace(lines):
        if isinstance(item, DllmConfig):
            config = item
            continue
        if isinstance(item, DllmPolicy):
            policy = item
            continue
        if machine is None:
            if config is None:
                raise ValueError("the event log has no config header (SglangEventLog writes one)")
            machine = SpecMachine(config, policy, retain_finished=False)
        try:
            machine.apply(item)
            machine.check_changed()
        except SpecViolation as violation:
            raise RadixViolation(f"spec:{violation.rule}", f"line {line}: {violation}") from None
        counts.log_cached += isinstance(item, KvCached)
        counts.log_hits += isinstance(item, CacheHit)
        counts.log_evicted += isinstance(item, CacheEvicted)


__all__ = [
    "RULES",
    "RadixCounts",
    "RadixLoop",
    "RadixProgram",
    "RadixRequest",
    "RadixViolation",
    "check_log",
    "check_program",
    "expected_output",
    "radix_program",
]
