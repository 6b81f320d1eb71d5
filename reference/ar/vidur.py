"""Vidur's replica schedulers, decision-faithful at constant batch time (one stage; pipelines of
several stages run through `reference.ar.stages.StageScheduler`).

Each class makes the decisions of the Vidur replica scheduler of the same name (read for facts
in microsoft/vidur `vidur/scheduler/replica_scheduler/*.py`, written anew here) and reports them
as AR events. Mapping of Vidur's token counts onto the spec's: Vidur's `num_processed_tokens` is
our known tokens (prompt + sampled outputs); a restart folds every processed token into the
prefill, i.e. computed tokens drop to zero and the next prefill is all known tokens. Vidur
simulates a trace and knows each request's output length in advance (a stop token that comes
first shortens it: `ArRequest.final_output`); LightLLM's peak-memory admission counts with it.

- `vidur-vllm`: a prefill-only batch of new requests in FCFS order (padded tokens
  len * max <= budget, blocks for the whole prefill, seat cap), or else a decode-only batch of
  the running requests in arrival order; when a decode needs a block and none is free, the
  latest-arrived remaining request is restarted (or the request itself).
- `vidur-sarathi`: decodes first (one token each, same victim rule), then chunks of running
  prefills, then new requests, all within the chunk size (the step's token budget); a restarted
  victim can be re-admitted in the same batch.
- `vidur-orca`: every running request plus new requests that can reserve max_model_len worth of
  blocks; no token budget, no preemption.
- `vidur-lightllm`: block size 1; a prefill batch only when admission keeps the peak memory of
  all requests within the pool (Vidur's `need_max_token_num`), else decode batches; after
  max_waiting_iters decode batches it tries a prefill batch. Never mixes prefill and decode.
- `vidur-ft`: FasterTransformer static batches: a new batch only when the previous one is
  entirely done; blocks for max_model_len reserved per request. A request that finishes before
  its batch mates keeps its blocks until the batch ends, as FasterTransformer does (its rules
  declare `free_at_batch_end`); Vidur's published scheduler never frees such a request (see
  the mutant catalogue).

Mnemosyne (FCFS, fixed chunk) is `reference.ar.mnemosyne`, on `VidurReplicaBase`; vLLM and
Sarathi as Vidur's releases decide, without the deviations below that concern them, are
`reference.ar.vidur_released`.

Deviations, each deliberate: block counts use ceil (Vidur floors max_tokens / block_size, which
under-reserves when max_model_len is not a multiple); LightLLM admits when the peak equals the
pool (Vidur's strict `<` could never admit a request that fits exactly: a stall) and counts a
one-token request's peak as its prompt; the watermark is 0; a running request restarts a victim
only when it needs a block that is not free (Vidur demands one free block even when it needs
none: at an exact-fit pool that restarts a request holding the whole pool and schedules an empty
batch, which stalls its simulator — the `vidur_one_free_block` mutant).
"""

from __future__ import annotations

import dataclasses

from reference.ar.base import ArReq, ArSchedulerBase
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRules, Policy, VictimOrder
from spec.ar.events import ArFinished, ArFinishReason
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile
from spec.errors import ConfigError, SchedSpecError
from spec.implementation import ArImplementation

# Vidur's default `watermark_blocks_fraction` (config.py), which its vLLM, Sarathi and
# Mnemosyne schedulers leave free when they admit a new request
WATERMARK_FRACTION = 0.01


class VidurOutOfMemory(SchedSpecError, RuntimeError):
    """Vidur's LightLLM has no OOM handling; its admission rule makes this unreachable."""


class VidurReplicaBase(ArSchedulerBase):
    """Shared Vidur replica machinery: `pending` is Vidur's `_preempted_requests` (running
    requests not in a batch in flight), in Vidur's list order."""

    name = "vidur"
    chunked: bool | None = False  # what enable_chunked_prefill must be (None: either)
    watermark_fraction: float = 0.0  # the project's deviation; Vidur's is WATERMARK_FRACTION
    # the classes that run with sequence pipeline parallelism (`stage_zero_done`)
    sequence_parallel_capable = False

    def __init__(
        self,
        config: ArConfig,
        sink: ArEventSink,
        *,
        pipelined: bool = False,
        sequence_parallel: bool = False,
    ) -> None:
        self.pipelined = pipelined  # driven by reference.ar.stages.StageScheduler
        self._check_config(config)
        if sequence_parallel and not (pipelined and self.sequence_parallel_capable):
            raise ConfigError(
                "sequence_parallel",
                True,
                f"False for {self.name}: sequence pipeline parallelism runs in a "
                "StageScheduler over vidur-sarathi-released or vidur-mnemosyne(-one-queue)",
            )
        super().__init__(config, sink)
        # Vidur's `enable_sequence_pipeline_parallel`, which it turns off at one stage: a
        # request's next prefill chunk is formed once its previous one has left stage 0
        self.sequence_parallel: bool = sequence_parallel and config.num_stages > 1
        # with it, tokens past stage 0 since the last restart (Vidur's
        # `num_stage_processed_tokens`), by request id
        self.stage_computed: dict[str, int] = {}
        self.pending: list[ArReq] = []
        self.batch: list[ArReq] = []
        # Vidur's pool is the usable blocks (it has no null block)
        self.watermark: int = int(self.watermark_fraction * config.usable_blocks)
        self._setup()

    def _setup(self) -> None:
        """A subclass's own state, set up at the end of `__init__` (none here)."""

    def _check_config(self, config: ArConfig) -> None:
        if config.policy is not Policy.FCFS:
            raise ConfigError("policy", config.policy.value, f"{self.name} is FCFS only")
        if config.num_stages != 1 and not self.pipelined:
            raise ConfigError(
                "num_stages",
                config.num_stages,
                f"{self.name} steps one stage at a time; run pipelines through "
                f"reference.ar.stages.StageScheduler",
            )
        if self.chunked is not None and config.enable_chunked_prefill != self.chunked:
            raise ConfigError(
                "enable_chunked_prefill",
                config.enable_chunked_prefill,
                f"{self.name} {'always' if self.chunked else 'never'} chunks prefills: "
                f"set {self.chunked}",
            )
        if config.long_prefill_token_threshold:
            raise ConfigError(
                "long_prefill_token_threshold",
                config.long_prefill_token_threshold,
                f"{self.name} has no such knob: use 0",
            )
        if config.enable_prefix_caching:
            raise ConfigError(
                "enable_prefix_caching", True, f"{self.name} has no prefix cache: use False"
            )

    @property
    def rules(self) -> ArRules:
        """`ArRules()`: FCFS admission, the tail as victim; subclasses that differ override it."""
        return ArRules()

    @property
    def micro_batch_cap(self) -> int:
        """Requests in one batch: the seat cap split over the stages (Vidur's
        `batch_size_cap // num_stages`); the seat cap itself bounds all running requests."""
        return max(1, self.config.max_num_seqs // self.config.num_stages)

    def between_batches(self) -> list[ArReq]:
        """The running requests in no batch (in a pipeline: not in flight): `pending`."""
        return list(self.pending)

    def kept_until_batch_end(self) -> list[tuple[ArReq, int]]:
        """Finished requests still holding blocks until their static batch ends, each with its
        static batch (none here; FasterTransformer's batch-end free)."""
        return []

    def static_batch(self, request_id: str) -> int | None:
        """The static batch a running request was admitted in (None: no static batches)."""
        return None

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        """The base step, then Vidur's `on_batch_end`: each request of the batch still running waits
        for a next batch (`_requeue`), and the batch empties."""
        super().step()
        for req in self.batch:
            if req in self.running:
                self._requeue(req)
        self.batch = []

    def _requeue(self, req: ArReq) -> None:
        """Vidur's `on_batch_end` for a request of the batch that did not complete: it waits
        for the next batch (`_preempted_requests`), in batch order."""
        self.pending.append(req)

    def abort(self, request_id: str) -> None:
        """As `ArSchedulerBase.abort`, and out of `pending` too."""
        super().abort(request_id)
        self.unqueue(request_id)

    def unqueue(self, request_id: str) -> None:
        """Take the request out of the queues of requests between batches (it is aborting)."""
        self.pending = [r for r in self.pending if r.rid != request_id]

    def _free_all(self, req: ArReq) -> None:
        """As the base; a finished or aborted request's stage count goes too."""
        self.stage_computed.pop(req.rid, None)
        super()._free_all(req)

    # ------------------------------------------------------------------ sequence parallelism
    def decoding(self, req: ArReq) -> bool:
        """Its prefill is complete (Vidur's `is_prefill_complete`): a batch decodes it."""
        return req.prefill_done

    def _chunk_start(self, req: ArReq) -> int:
        """Where its next prefill chunk starts: its computed tokens, or with sequence
        parallelism those past stage 0."""
        return self.stage_computed.get(req.rid, req.num_computed)

    def stage_zero_done(self, req: ArReq, n: int) -> None:
        """Its batch left stage 0 having scheduled it `n` tokens (sequence parallelism only):
        count them, and unless that completed its prefill it waits for its next chunk
        (Vidur's `on_stage_end` for stage 0)."""
        self.stage_computed[req.rid] = self._chunk_start(req) + n
        if not self._prefill_stage_complete(req):
            self._requeue_chunk(req)

    def _prefill_stage_complete(self, req: ArReq) -> bool:
        return self._chunk_start(req) >= self._prefill_of(req)

    def _prefill_of(self, req: ArReq) -> int:
        """Its prefill tokens (Vidur's `num_prefill_tokens`): every known token here."""
        return req.known

    def _requeue_chunk(self, req: ArReq) -> None:
        self.pending.append(req)

    def _add(self, req: ArReq, n: int) -> None:
        self.batch.append(req)
        self._emit_scheduled(req, n)

    def _admit_new(self, req: ArReq, n_blocks: int) -> None:
        self.waiting.remove(req)
        self.running.append(req)
        self._grow(req, n_blocks)

    def _new_blocks(self, req: ArReq) -> int:
        """Vidur allocates a new request's whole prefill at once."""
        return self.config.blocks_for(req.known)

    def _fits_new(self, req: ArReq) -> bool:
        """Vidur's `_can_allocate_request` for a new request: its blocks leave the watermark
        free."""
        return self.pool.num_free - self._new_blocks(req) >= self.watermark

    def _grow_existing(self, req: ArReq) -> None:
        """One more block when the known tokens outgrow the reservation (Vidur: 0 or 1)."""
        self._grow(req, self._blocks_needed(req, req.uncomputed))

    def _restart(self, victim: ArReq) -> None:
        """Vidur's restart: free everything, fold processed tokens into the prefill, back to the
        head of the request queue (the stage counts reset: the adapter's repair of Vidur's)."""
        if victim in self.pending:
            self.pending.remove(victim)
        self.stage_computed.pop(victim.rid, None)
        self._preempt(victim)

    def _decode_or_restart(self, req: ArReq) -> bool:
        """Vidur's `while not _can_allocate_request(request)` loop for a running request, as the
        project decides it: only for the block it needs (False: `req` restarted)."""
        if not self._free_or_restart(req, self._blocks_needed(req, req.uncomputed)):
            return False
        self._grow_existing(req)
        return True

    def _free_block_or_restart(self, req: ArReq) -> bool:
        """Vidur's one-free-block demand for a decode, needed or not (Sarathi's
        `_can_allocate_request`, Mnemosyne's `_ensure_can_append_slot`; False: `req`
        restarted)."""
        return self._free_or_restart(req, 1)

    def _free_or_restart(self, req: ArReq, blocks: int) -> bool:
        """While fewer than `blocks` are free, restart the last remaining pending request, or
        `req` itself when none is left (False: `req` restarted)."""
        while self.pool.num_free < blocks:
            if not self.pending:
                self._restart(req)
                return False
            self._restart(self.pending[-1])
        return True


class VidurVllm(VidurReplicaBase):
    """Vidur's vLLM replica scheduler (`vidur-vllm`, module docstring): prefill-only batches of new
    requests, padded to the longest prompt, else decode batches in arrival order."""

    name = "vidur-vllm"

    def _schedule(self) -> None:
        cfg = self.config
        tokens: list[int] = []
        while self.waiting:
            req = self.waiting[0]
            n = req.uncomputed
            if not self._fits_new(req):
                break
            if self._over_budget(tokens, n):
                break
            if len(self.running) >= cfg.max_num_seqs or len(tokens) >= self.micro_batch_cap:
                break
            self._admit_new(req, self._new_blocks(req))
            self._add(req, n)
            tokens.append(n)
        if tokens:
            return
        self.pending.sort(key=lambda r: r.arrival)
        while self.pending and len(self.batch) < self.micro_batch_cap:
            req = self.pending.pop(0)
            if self._decode_or_restart(req):
                self._add(req, req.uncomputed)

    def _over_budget(self, tokens: list[int], n: int) -> bool:
        """A prefill of `n` tokens would take the batch past `max_num_batched_tokens`: every
        request padded to the longest prompt (microsoft/vidur's main branch)."""
        return (len(tokens) + 1) * max([*tokens, n]) > self.config.max_num_batched_tokens


class VidurSarathi(VidurReplicaBase):
    """Vidur's Sarathi-Serve replica scheduler (`vidur-sarathi`, module docstring): decodes, then
    chunks of running prefills, then new requests, within the chunk size."""

    name = "vidur-sarathi"
    chunked: bool | None = True

    @property
    def rules(self) -> ArRules:
        """As `ArRules()`, but a step that restarted a victim may still admit (it can re-admit the
        victim in the same batch)."""
        return ArRules(admit_after_preemption=True)

    def _schedule(self) -> None:
        cfg = self.config
        chunk = cfg.max_num_batched_tokens
        batch_tokens = 0
        skipped: list[ArReq] = []
        running_prefills: list[ArReq] = []
        while self.pending and len(self.batch) < self.micro_batch_cap:
            req = self.pending.pop(0)
            if not self._prefill_complete(req):
                running_prefills.append(req)
                continue
            if self._decode_or_restart(req):
                self._add(req, 1)
                batch_tokens += 1
        for req in running_prefills:
            n = max(0, min(self._prefill_left(req), chunk - batch_tokens))
            if n == 0:
                skipped.append(req)
                continue
            self._add(req, n)
            batch_tokens += n
        self.pending: list[ArReq] = sorted(skipped + self.pending, key=lambda r: r.arrival)
        while self.waiting:
            if len(self.running) >= cfg.max_num_seqs or self._full_for_new():
                break
            req = self.waiting[0]
            if not self._fits_new(req):
                break
            n = min(self._prefill_left(req), chunk - batch_tokens)
            if n <= 0:
                break
            self._admit_new(req, self._new_blocks(req))
            self._add(req, n)
            batch_tokens += n

    def _full_for_new(self) -> bool:
        """The batch takes no new request: it holds its micro-batch cap (running prefills, which
        the cap does not stop, may have taken it past)."""
        return len(self.batch) >= self.micro_batch_cap

    def _prefill_complete(self, req: ArReq) -> bool:
        """The request decodes (one token a batch) rather than taking a prefill chunk. Counted
        from tokens, so a restarted request one token short of its recompute decodes that
        token (its blocks already hold it; Vidur's flag would give it as the last chunk:
        `vidur-sarathi-released`); `reference/sim/fast_vidur.py` counts alike."""
        return req.prefill_done

    def _prefill_left(self, req: ArReq) -> int:
        """Prefill tokens still to compute: every known token not computed (a restart folds
        the outputs into the prefill)."""
        return req.uncomputed


class _MaxReservation(VidurReplicaBase):
    """Orca and FasterTransformer reserve max_model_len worth of blocks per request."""

    def _check_config(self, config: ArConfig) -> None:
        super()._check_config(config)
        if config.max_blocks_per_request > config.usable_blocks:
            raise ConfigError(
                "num_blocks",
                config.num_blocks,
                f"{self.name} reserves {config.max_blocks_per_request} blocks "
                f"(max_model_len) per request: the pool must hold at least that many",
            )

    @property
    def micro_batch_cap(self) -> int:
        """Requests in one batch: the whole seat cap, per micro-batch (Vidur's Orca and
        FasterTransformer fill each batch up to `_max_batch_size`, `batch_size_cap` here, without
        dividing it over the stages as its vLLM and Sarathi do); the pool bounds the rest."""
        return self.config.max_num_seqs

    def _admit_waiting(self) -> None:
        cfg = self.config
        # with one stage every running request is in the batch, so the batch's cap is the seats'
        while self.waiting and len(self.batch) < self.micro_batch_cap:
            if self.pool.num_free < cfg.max_blocks_per_request:
                break
            req = self.waiting[0]
            self._admit_new(req, cfg.max_blocks_per_request)
            self._add(req, req.uncomputed)


class VidurOrca(_MaxReservation):
    """Vidur's Orca replica scheduler (`vidur-orca`): every running request each step, plus new
    requests while a seat and max_model_len worth of free blocks are left for each."""

    name = "vidur-orca"

    @property
    def rules(self) -> ArRules:
        """No victim (it never preempts) and no token budget."""
        return ArRules(victim=VictimOrder.NONE, token_budget=False)

    def _schedule(self) -> None:
        while self.pending and len(self.batch) < self.micro_batch_cap:
            req = self.pending.pop(0)
            self._add(req, req.uncomputed)
        self._admit_waiting()


# FasterTransformer keeps one KV cache per static batch, freed when the whole batch has ended
FT_RULES = ArRules(
    victim=VictimOrder.NONE, token_budget=False, static_batches=True, free_at_batch_end=True
)


class VidurFasterTransformer(_MaxReservation):
    """Vidur's FasterTransformer replica scheduler (`vidur-ft`): static batches, a new one only when
    the previous one is done, max_model_len worth of blocks reserved per request."""

    name = "vidur-ft"

    @property
    def rules(self) -> ArRules:
        """No victim, no token budget, static batches, whose finished requests keep their blocks
        to the batch's end, as FasterTransformer's do."""
        return FT_RULES

    def _setup(self) -> None:
        # the static batch each request was admitted in, and per batch its finished requests
        # still holding their blocks (FasterTransformer keeps one KV cache per batch)
        self.static_batch_of: dict[str, int] = {}
        self.kept: dict[int, list[ArReq]] = {}
        self.batches_formed: int = 0

    def kept_until_batch_end(self) -> list[tuple[ArReq, int]]:
        """Finished requests still holding blocks, each with its static batch."""
        return [(req, batch) for batch, reqs in self.kept.items() for req in reqs]

    def static_batch(self, request_id: str) -> int | None:
        """The static batch a running request was admitted in."""
        return self.static_batch_of.get(request_id)

    def _schedule(self) -> None:
        if self.pending:  # the static batch in flight continues, less its finished requests
            batch = self.pending
            self.pending: list[ArReq] = []
            for req in batch:
                self._add(req, req.uncomputed)
            return
        self._admit_waiting()
        if self.batch:
            for req in self.batch:
                self.static_batch_of[req.rid] = self.batches_formed
            self.batches_formed += 1

    def _batch_runs(self, batch: int, besides: ArReq | None = None) -> bool:
        """A request of static batch `batch` other than `besides` still runs."""
        return any(
            req is not besides and self.static_batch_of.get(req.rid) == batch
            for req in self.running
        )

    def _finish(self, req: ArReq, reason: ArFinishReason) -> None:
        """Free its blocks with its batch's: kept while a batch mate runs, else freed now and
        every kept one of the batch after its `ArFinished`."""
        batch = self.static_batch_of.pop(req.rid)
        if self._batch_runs(batch, besides=req):
            self.running.remove(req)
            req.completed = self.step_index
            self._retire(req)
            self.kept.setdefault(batch, []).append(req)
            self.sink(ArFinished(req.rid, reason))
            return
        super()._finish(req, reason)
        self._end_batch(batch)

    def abort(self, request_id: str) -> None:
        """As the base; aborting the last running request of a batch ends the batch."""
        batch = self.static_batch_of.pop(request_id, None)
        super().abort(request_id)
        if batch is not None and not self._batch_runs(batch):
            self._end_batch(batch)

    def _end_batch(self, batch: int) -> None:
        for req in self.kept.pop(batch, []):
            self._free_all(req)


class VidurLightLlm(VidurReplicaBase):
    """Vidur's LightLLM replica scheduler (`vidur-lightllm`, block size 1): peak-memory admission,
    prefill and decode batches never mixed, a prefill batch tried again after `max_waiting_iters`
    decode batches."""

    name = "vidur-lightllm"

    def _setup(self) -> None:
        self.num_waiting_iters: int = 0

    def _check_config(self, config: ArConfig) -> None:
        if config.block_size != 1:
            raise ConfigError(
                "block_size", config.block_size, "LightLLM (token-level KV) needs block_size=1"
            )
        if config.num_stages != 1:
            raise ConfigError(
                "num_stages", config.num_stages, "LightLLM does not support pipeline stages: 1"
            )
        super()._check_config(config)

    @property
    def rules(self) -> ArRules:
        """No victim: it never preempts."""
        return ArRules(victim=VictimOrder.NONE)

    def _tuple_tokens(self, req: ArReq, scheduled: bool) -> tuple[int, int]:
        """(tokens held now or at admission, tokens still to grow), as Vidur counts them. Vidur
        simulates a trace, so it knows every request's output length in advance: the peak is
        counted with the length the request will produce (`final_output`: a stop token that
        comes first shortens it), not with max_tokens."""
        d = req.spec.final_output
        if scheduled:
            return req.known, max(0, d - req.num_output - 1)
        return req.known + min(1, d - 1), max(0, d - 2)

    def _peak_fits(self, candidate: ArReq, admitted: list[ArReq]) -> bool:
        items = [self._tuple_tokens(r, True) for r in self.running if r not in admitted]
        items += [self._tuple_tokens(r, False) for r in [*admitted, candidate]]
        items.sort(key=lambda x: -x[1])
        need, held = 0, 0
        for i, (has_run, left) in enumerate(items):
            held += has_run
            need = max(need, left * (i + 1) + held)
        return need <= self.config.usable_blocks

    def _prefill_batch(self) -> bool:
        cfg = self.config
        admitted: list[ArReq] = []
        tokens = 0
        while self.waiting:
            req = self.waiting[0]
            n = req.uncomputed
            if tokens + n > cfg.max_num_batched_tokens:
                break
            if len(self.running) >= cfg.max_num_seqs or len(admitted) >= self.micro_batch_cap:
                break
            if not self._peak_fits(req, admitted):
                break
            self._admit_new(req, self._new_blocks(req))
            self._add(req, n)
            admitted.append(req)
            tokens += n
        return bool(admitted)

    def _schedule(self) -> None:
        if not self.pending:
            if self._prefill_batch():
                self.num_waiting_iters = 0
            return
        if self.num_waiting_iters >= self.config.max_waiting_iters:
            self.num_waiting_iters = 0
            if self._prefill_batch():
                return
        if self.pool.num_free < len(self.pending):
            raise VidurOutOfMemory("LightLLM decode batch does not fit (OOM handling)")
        self.num_waiting_iters += 1
        batch = self.pending
        self.pending: list[ArReq] = []
        for req in batch:
            self._grow_existing(req)
            self._add(req, req.uncomputed)


def make_vidur_vllm(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurVllm`; `ConfigError` unless FCFS, one stage, chunked prefill off, no
    long-prefill threshold and no prefix caching."""
    return VidurVllm(config, sink)


def make_vidur_sarathi(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurSarathi`; `ConfigError` unless FCFS, one stage, chunked prefill on, no
    long-prefill threshold and no prefix caching."""
    return VidurSarathi(config, sink)


def make_vidur_orca(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurOrca`; `ConfigError` unless FCFS, one stage, chunked prefill off, no
    long-prefill threshold, no prefix caching and usable blocks for max_model_len tokens."""
    return VidurOrca(config, sink)


def make_vidur_lightllm(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurLightLlm`; `ConfigError` unless block size 1, FCFS, one stage, chunked prefill
    off, no long-prefill threshold and no prefix caching."""
    return VidurLightLlm(config, sink)


def make_vidur_ft(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """Factory: `VidurFasterTransformer`; `ConfigError` unless FCFS, one stage, chunked prefill off,
    no long-prefill threshold, no prefix caching and usable blocks for max_model_len tokens."""
    return VidurFasterTransformer(config, sink)


# --- declared implementations (profiles) -----------------------------------------------------
# Vidur's replica schedulers are FCFS, have no long-prefill threshold and no prefix cache, and
# step one pipeline stage at a time here (pipelines: reference.ar.stages).
VIDUR_SPACE = ArConfigSpace(
    policies=frozenset({Policy.FCFS}),
    chunked_prefill=frozenset({False}),
    prefix_caching=frozenset({False}),
    long_prefill_threshold=False,
)

VIDUR_VLLM = ArImplementation(
    make_vidur_vllm,
    ArProfile(space=VIDUR_SPACE, policy=ArPolicy(rules=ArRules())),
    "Vidur's vLLM replica scheduler: prefill-only batches of new requests, else decode batches; "
    "restarts the latest-arrived request when a decode needs a block (watermark 0)",
)

VIDUR_SARATHI = ArImplementation(
    make_vidur_sarathi,
    ArProfile(
        space=dataclasses.replace(VIDUR_SPACE, chunked_prefill=frozenset({True})),
        # Vidur's Sarathi restarts a victim to the head of the queue and admits from there in
        # the same batch (`SarathiReplicaScheduler._get_next_batch`)
        policy=ArPolicy(rules=ArRules(), admit_after_preemption=True),
    ),
    "Vidur's Sarathi-Serve replica scheduler: decodes, then chunked prefills, within the chunk",
)

VIDUR_ORCA = ArImplementation(
    make_vidur_orca,
    ArProfile(
        space=dataclasses.replace(VIDUR_SPACE, pool_holds_max_model_len=True),
        policy=ArPolicy(rules=ArRules(victim=VictimOrder.NONE, token_budget=False)),
    ),
    "Vidur's Orca replica scheduler: every running request each step, max_model_len reserved",
)

VIDUR_LIGHTLLM = ArImplementation(
    make_vidur_lightllm,
    ArProfile(
        space=dataclasses.replace(VIDUR_SPACE, block_sizes=frozenset({1})),
        policy=ArPolicy(rules=ArRules(victim=VictimOrder.NONE)),
    ),
    "Vidur's LightLLM replica scheduler: token-level KV, peak-memory admission, no mixing",
)

VIDUR_FT = ArImplementation(
    make_vidur_ft,
    ArProfile(
        space=dataclasses.replace(VIDUR_SPACE, pool_holds_max_model_len=True),
        policy=ArPolicy(rules=FT_RULES),
    ),
    "Vidur's FasterTransformer replica scheduler: static batches, max_model_len reserved",
)
