"""A KV connector for vLLM 0.33.0's scheduler, and the remote KV store and worker behind it.

vLLM's scheduler serves disaggregated prefill and KV offloading through a KV connector
(`vllm.distributed.kv_transfer.kv_connector.v1.base.KVConnectorBase_V1`): its scheduler side
says how many of a waiting request's tokens a remote store holds (`get_num_new_matched_tokens`),
learns the blocks allocated to load them into (`update_state_after_alloc`), hands the worker
each step's transfers (`build_connector_meta`) and, when a request finishes, may keep its blocks
while they are sent (`request_finished` returning True); the worker reports, in a later
step's `ModelRunnerOutput.kv_connector_output`, the loads done (`finished_recving`), those that
failed (`failed_recving`, or `invalid_block_ids` for single blocks) and the sends done
(`finished_sending`). Meanwhile the scheduler parks a loading request in
`WAITING_FOR_REMOTE_KVS`, frees an aborted one's blocks only once its load is reported, and
frees a sent one's only once its send is.

`SchedspecKvConnector` is a real connector class, loaded by vLLM's own `KVConnectorFactory`
from `kv_connector_module_path` (this module); every decision it makes is `RemoteKv`'s:

- the store holds, for each request, none, half or all of its prompt (a hash of the request id
  and the store's seed), and offers what lies beyond the request's computed tokens at every
  lookup (an offloading store, read again after a preemption or a failed load); two requests in
  three load it asynchronously, between steps, and one in three synchronously, in the forward of
  the step that schedules it (whose hit then leaves a token to compute);
- with `pending_lookups`, one request in four has its first one or two lookups answered
  "ask again later" (`None`), as the offloading connector answers while its lookup job runs:
  vLLM skips such a request in that `schedule()` call, so later ones may pass it;
- every other request is a producer: when it finishes (not aborted) its blocks are sent, and
  vLLM must keep them until the send is reported;
- the worker starts a step's transfers when the step's batch runs (`execute`) and reports each
  asynchronous one 0 to 2 batches later; a load fails with probability 1/6 as a whole
  (`failed_recving`; a synchronous one in its first block) and 1/6 in one block
  (`invalid_block_ids`).

Without `loads` (vLLM's `kv_role="kv_producer"`, a P/D prefill instance) the store holds
nothing and the connector only sends.

The connector declares vLLM's `SupportsHMA`, so on a hybrid cache (a sliding-window group beside
full attention: `RemoteKv.serve_groups`) vLLM keeps the groups apart and hands it every group's
blocks: a load moves the blocks holding its tokens in each group (`Transfer.groups`, the null
block left out), a send keeps every group's (`request_finished_all_groups`). There vLLM refuses
`invalid_block_ids` ("not supported for models with multiple KV cache groups") and asks for
`failed_recving`, so a load drawn to fail in one block fails as a whole, and a synchronous
load's failure is reported in `failed_recving` too (`Transfer.lost`: the loop forgets what it
wrote).

What `RemoteKv` checks (`integrations.vllm.engine_core` calls it): `transfer_blocks_held`
(while a transfer is in flight its blocks are not free, and an asynchronous load's are held by
its request alone), `load_before_compute` (a request is scheduled no tokens while its
asynchronous load is in flight), `kv_delivered` (a request whose KV is sent is handed over with
blocks covering its prompt) and, once drained, `progress` (every transfer was reported).
It also says which blocks a load wrote, for `cache_hit_written` and `kv_written`.
Depends on `spec` and the adapter's helpers; vLLM is imported only when vLLM asks this module
for the connector class.
"""

from __future__ import annotations

import importlib
import random
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.adapter import KV_CONNECTOR_NAME
from integrations.vllm.core_loop import EngineCoreViolation


@dataclass
class Transfer:
    """One load into, or send from, request `rid`'s blocks `blocks` (`first`: the index of
    the first in the request's block table); `started` and `due` are the batches (counted by
    `RemoteKv.execute`) in which the worker starts it and reports it."""

    kind: str  # "load" or "send"
    rid: str
    request: Any  # vLLM's Request
    blocks: tuple[int, ...]
    first: int
    started: int | None = None
    due: int | None = None
    sync: bool = False  # a load done in the forward of the batch that schedules it
    bad: int | None = None  # once reported: the index in `blocks` of the block that failed
    lost: bool = False  # once reported: a synchronous load that failed as a whole (hybrid)
    #: The writes the loop had recorded before the batch that runs a synchronous load was
    #: scheduled (`CacheWrites.puts_before_schedule`), set by the loop.
    writes_from: int = 0
    #: On a hybrid cache, the same tokens' blocks in each further KV cache group.
    groups: tuple[GroupBlocks, ...] = ()

    def firsts(self) -> dict[int, int]:
        """KV cache group -> the index in the request's table there of the transfer's first
        block (group 0's is `first`)."""
        return {0: self.first, **{g.group: g.first for g in self.groups}}

    def all_blocks(self) -> tuple[int, ...]:
        """Every block the transfer reads or writes, in every group (null blocks left out)."""
        return self.blocks + tuple(b for g in self.groups for b in g.blocks if b is not None)


@dataclass(frozen=True)
class GroupBlocks:
    """A transfer's blocks in KV cache group `group` (1 or more) of a hybrid cache: `blocks`
    from index `first` of the request's table in that group, None where vLLM put the null
    block (a sliding window's blocks that the transfer's tokens have left: nothing moves)."""

    group: int
    first: int
    blocks: tuple[int | None, ...]


@dataclass
class TransferCounts:
    """How often the connector's paths were taken."""

    loads: int = 0
    sync_loads: int = 0  # of those, done in the forward of the batch that scheduled them
    loads_failed: int = 0  # the whole load failed (failed_recving)
    blocks_invalid: int = 0  # one block of the load failed (invalid_block_ids)
    sends: int = 0
    session_loads: int = 0  # loads into a streaming-input session's later turn
    session_sends: int = 0  # sends of a session that took more than one turn
    aborted_loading: int = 0  # aborts of a request whose load was in flight
    lookups_put_off: int = 0  # lookups answered "ask again later" (None)
    stores_refused: int = 0  # sends a store with no room for them refused (offload store)
    blocks_evicted: int = 0  # blocks a store evicted to make room (offload store)


@dataclass
class _Metadata:
    """What `build_connector_meta` hands the worker: the transfers started since the last
    step."""

    transfers: list[Transfer] = field(default_factory=list)


class RemoteKv:
    """The remote KV store and the connector's worker, seeded by `seed`."""

    def __init__(
        self,
        seed: int,
        block_size: int,
        *,
        sync_loads: bool = True,
        pending_lookups: bool = False,
        loads: bool = True,
    ) -> None:
        self.seed: int = seed
        #: Whether the store holds anything to load (False: a producer-only connector, a P/D
        #: prefill instance, which only sends).
        self.loads: bool = loads
        #: Whether one request in three loads its hit synchronously (else every load is
        #: asynchronous).
        self.sync_loads: bool = sync_loads
        #: Whether one request in four has its first one or two lookups answered "ask again
        #: later" (`None`), as vLLM's offloading connector answers while its lookup job runs.
        self.pending_lookups: bool = pending_lookups
        #: Whether a load may fail (`outcome`); False: every load succeeds, to tell what loads
        #: do from what their failures do.
        self.failures: bool = True
        #: The requests whose latest lookup was answered "ask again later" (vLLM skips them).
        self.asked_later: set[str] = set()
        #: each request's latest `may_load_async` answer: whether vLLM queues it apart
        self.queued_async: dict[str, bool] = {}
        self._lookups_left: dict[str, int] = {}  # request -> lookups still to answer None
        self.block_size: int = block_size
        #: Each KV cache group's block size, group 0 first (`block_size` is group 0's); more
        #: than one on a hybrid cache (`serve_groups`).
        self.group_block_sizes: tuple[int, ...] = (block_size,)
        self.rng: random.Random = random.Random(seed)
        self.pending: list[Transfer] = []  # registered, not yet handed to the worker
        self.in_flight: dict[tuple[str, str], Transfer] = {}  # (kind, rid) -> transfer
        self.batches: int = 0  # batches the worker ran
        self.failed: set[str] = set()  # requests with a failed load
        self.counts: TransferCounts = TransferCounts()
        self._local: dict[str, int] = {}  # request -> its computed tokens when last matched
        #: Where the store says what it does, a line per event (None: nowhere; the loop's
        #: trace, `integrations.vllm.trace`).
        self.log: Callable[[str], None] | None = None
        self._told: dict[str, tuple[int, int]] = {}  # request -> the lookup last logged
        #: A streaming-input session's current turn, by request id (the loop's; counted only).
        self.turn_of: Mapping[str, int] = {}

    @property
    def hybrid(self) -> bool:
        """Whether the pool serves several KV cache groups (a hybrid cache)."""
        return len(self.group_block_sizes) > 1

    def serve_groups(self, block_sizes: Sequence[int]) -> None:
        """Serve a pool of these KV cache groups' block sizes (group 0 first): every transfer
        then moves the same tokens' blocks in each group, as a connector that declares vLLM's
        `SupportsHMA` does."""
        self.group_block_sizes = tuple(block_sizes)
        self.block_size = self.group_block_sizes[0]

    def say(self, line: str) -> None:
        """`line` to `log`, if set."""
        if self.log is not None:
            self.log(line)

    # ------------------------------------------------------------ what the store holds
    def _hash(self, rid: str, salt: str) -> int:
        return zlib.crc32(f"{self.seed}:{salt}:{rid}".encode())

    def remote_tokens(self, request: Any) -> int:
        """How many of `request`'s prompt tokens the store holds: none, half or all; never a
        one-token prompt whole (see `matched`); none without `loads`."""
        share = self._hash(request.request_id, "load") % 3
        prompt = request.num_prompt_tokens
        return 0 if prompt == 1 or not self.loads else (prompt * share) // 2

    def loads_async(self, request: Any) -> bool:
        """Whether `request`'s hit is loaded between steps (two requests in three, or all
        without `sync_loads`) or in the forward of the batch that schedules it (a synchronous
        load)."""
        return not self.sync_loads or self._hash(request.request_id, "sync") % 3 != 0

    def may_load_async(self, request: Any) -> bool:
        """`KVConnectorBase_V1.may_load_async` (vLLM 0.34.0 asks, with
        `max_num_inflight_kv_loads`, each time the request enters its waiting queues): the store
        holds some of the request's prompt now and loads it asynchronously. It may be a false
        positive (a local hit covering the store's), which vLLM allows: the request then only
        waits its turn among such requests. The latest answer is kept (`queued_async`): it is
        the queue vLLM keeps the request in."""
        answer = self.remote_tokens(request) > 0 and self.loads_async(request)
        self.queued_async[request.request_id] = answer
        return answer

    def produces(self, rid: str) -> bool:
        """Whether request `rid`'s KV is sent when it finishes (every other request)."""
        return self._hash(rid, "send") % 2 == 0

    def lookups_put_off(self, rid: str) -> int:
        """How many of request `rid`'s first lookups are answered "ask again later": one or
        two for one request in four with `pending_lookups`, else none."""
        draw = self._hash(rid, "pending")
        if not self.pending_lookups or draw % 4:
            return 0
        return 1 + (draw >> 2) % 2

    # ------------------------------------------------------------ the scheduler side
    def lookup(self, request: Any, num_computed_tokens: int) -> int | None:
        """`get_num_new_matched_tokens`'s count: None ("ask again later") for the first
        `lookups_put_off` lookups of the request, then `matched`."""
        rid = request.request_id
        left = self._lookups_left.setdefault(rid, self.lookups_put_off(rid))
        if left:
            self._lookups_left[rid] = left - 1
            self.asked_later.add(rid)
            self.counts.lookups_put_off += 1
            self.say(f"connector: lookup of {rid} answered ask again later")
            return None
        self.asked_later.discard(rid)
        return self.matched(request, num_computed_tokens)

    def matched(self, request: Any, num_computed_tokens: int) -> int:
        """`get_num_new_matched_tokens`: the remote tokens beyond the computed ones (vLLM's
        local prefix-cache hit included), offered again at every lookup (after a preemption or
        a failed load), as vLLM's offloading connector does. A hit of a whole prompt makes vLLM
        recompute its last token; for a one-token prompt that leaves nothing computed, so vLLM
        looks it up again and loads it again, for ever. A store of whole blocks never holds a
        one-token prompt at the block sizes engines use, so this store does not either."""
        rid = request.request_id
        self._local[rid] = num_computed_tokens
        remote = self.remote_tokens(request)
        if not self.loads_async(request):
            # a synchronous hit leaves a token to compute (vLLM asserts one; its offloading
            # connector loads a whole-prompt hit asynchronously instead)
            remote = min(remote, request.num_tokens - 1)
        hit = max(0, remote - num_computed_tokens)
        if self._told.get(rid) != (num_computed_tokens, hit):
            self._told[rid] = (num_computed_tokens, hit)
            self.say(f"connector: lookup of {rid} hits {hit} tokens past its {num_computed_tokens}")
        return hit

    def allocated(
        self,
        request: Any,
        block_ids: Iterable[int],
        num_external: int,
        *,
        groups: Sequence[Sequence[int | None]] = (),
    ) -> None:
        """`update_state_after_alloc`: load `num_external` tokens after the request's computed
        ones into its blocks (`block_ids`: group 0's; `groups`: each further group's table on a
        hybrid cache, None for the null block)."""
        if num_external <= 0:
            return
        start = self._local.get(request.request_id, 0)
        end_token = start + num_external
        first, blocks = _span(tuple(block_ids), self.block_size, start, end_token)
        others = []
        for group, table in enumerate(groups, start=1):
            g_first, g_blocks = _span(tuple(table), self.group_block_sizes[group], start, end_token)
            others.append(GroupBlocks(group, g_first, g_blocks))
        sync = not self.loads_async(request)
        load = Transfer(
            "load", request.request_id, request, blocks, first, sync=sync, groups=tuple(others)
        )
        self._register(load)
        self.counts.loads += 1
        self.counts.sync_loads += sync
        self.counts.session_loads += self.turn_of.get(request.request_id, 1) > 1
        kind = "synchronous" if sync else "asynchronous"
        self.say(
            f"connector: {kind} load of {request.request_id}'s tokens {start}.."
            f"{start + num_external - 1} into blocks {_blocks_text(load)}"
        )

    def finished(
        self, request: Any, block_ids: Iterable[int], *, groups: Sequence[Sequence[int]] = ()
    ) -> bool:
        """`request_finished`: send a producer's computed blocks if it finished by stopping or
        at its length (not aborted, nor ended with an error), as vLLM's connectors send or store
        only what a request computed; True (vLLM keeps the blocks until the send is reported)
        if there is anything to send. On a hybrid cache (`request_finished_all_groups`)
        `groups` are each further group's block ids, vLLM's null block (id 0) where a sliding
        window's blocks have left it: the send keeps every group's other blocks."""
        blocks = tuple(block_ids)
        if not self.produces(request.request_id):
            return False
        if request.status.name not in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"):
            return False
        self.check_delivered(request, blocks)
        if not blocks:
            return False
        others = tuple(
            GroupBlocks(group, 0, tuple(b or None for b in table))
            for group, table in enumerate(groups, start=1)
        )
        send = Transfer("send", request.request_id, request, blocks, 0, groups=others)
        self._register(send)
        self.counts.sends += 1
        self.counts.session_sends += self.turn_of.get(request.request_id, 1) > 1
        self.say(f"connector: send of {request.request_id}'s blocks {_blocks_text(send)}")
        return True

    def _register(self, transfer: Transfer) -> None:
        key = (transfer.kind, transfer.rid)
        if key in self.in_flight:
            raise EngineCoreViolation(
                "implementation_error",
                f"a second {transfer.kind} of {transfer.rid!r} while one is in flight",
            )
        self.in_flight[key] = transfer
        self.pending.append(transfer)

    def metadata(self) -> _Metadata:
        """`build_connector_meta`: the transfers registered since the last call."""
        meta = _Metadata(self.pending)
        self.pending = []
        return meta

    # ------------------------------------------------------------ the worker
    def execute(self, meta: Any, outputs: Any) -> tuple[Any, list[Transfer]]:
        """Run one batch's worker side: start `meta`'s transfers (a synchronous load is done
        in this batch), then report those due (vLLM's `KVConnectorOutput` from `outputs`, or
        None: `finished_recving` and `failed_recving` for asynchronous loads, the failed block
        of either kind in `invalid_block_ids`, `finished_sending`), and return the loads done,
        a load that failed in one block with its index as `bad` (a load that failed as a whole
        not at all), for `cache_hit_written`."""
        self.batches += 1
        now = self.batches
        for t in getattr(meta, "transfers", ()):
            t.started, t.due = now, now if t.sync else now + self.delay(t)
        recving: set[str] = set()
        failed: set[str] = set()
        invalid: set[int] = set()
        sending: set[str] = set()
        loaded: list[Transfer] = []
        for key, t in list(self.in_flight.items()):
            if t.due is None or t.due > now:
                continue
            del self.in_flight[key]
            if t.kind == "send":
                sending.add(t.rid)
                self.say(f"connector: send of {t.rid} reported done")
                continue
            outcome = self.outcome(t)
            if self.hybrid and isinstance(outcome, int):
                # vLLM refuses `invalid_block_ids` on several KV cache groups (a block id is
                # not mapped back to its group there) and asks for `failed_recving` instead
                outcome = "failed"
            if not t.sync:
                recving.add(t.rid)
            elif outcome == "failed" and not self.hybrid:
                # a synchronous load reports only its failed blocks (a whole failure: its first)
                outcome = 0
            if outcome == "failed":
                failed.add(t.rid)
                self.failed.add(t.rid)
                self.counts.loads_failed += 1
                if t.sync:
                    # its blocks were read as written in its batch; the loop forgets them
                    t.lost = True
                    loaded.append(t)
                self.say(f"connector: load of {t.rid} reported failed as a whole")
            elif isinstance(outcome, int):
                invalid.add(t.blocks[outcome])
                self.failed.add(t.rid)
                self.counts.blocks_invalid += 1
                t.bad = outcome
                loaded.append(t)
                self.say(f"connector: load of {t.rid} reported failed in block {t.blocks[outcome]}")
            else:
                loaded.append(t)
                self.say(f"connector: load of {t.rid} reported done")
        if not (recving or sending or invalid or failed):
            return None, loaded
        output = outputs.KVConnectorOutput(
            finished_sending=sending or None,
            finished_recving=recving or None,
            invalid_block_ids=invalid,
            failed_recving=failed,
        )
        return output, loaded

    def delay(self, transfer: Transfer) -> int:
        """In how many batches after the one that starts it `transfer` is reported: 0 to 2."""
        return self.rng.randrange(3)

    def outcome(self, load: Transfer) -> str | int:
        """How `load` ends: "ok", "failed" (as a whole, 1 in 6) or the index in `load.blocks`
        of the one block that failed (1 in 6); always "ok" without `failures` (the same draws
        taken, so the rest of the program's draws stay as they were)."""
        draw = self.rng.randrange(6)
        if not self.failures:
            return "ok"
        if draw == 0:
            return "failed"
        if draw == 1 and load.blocks:
            return self.rng.randrange(len(load.blocks))
        return "ok"

    # ------------------------------------------------------------ checks
    def check_scheduled(self, scheduled: Iterable[str], where: str) -> None:
        """`load_before_compute`: no request with an asynchronous load in flight is
        scheduled (a synchronous load is done in the forward of the batch that schedules it)."""
        for rid in scheduled:
            load = self.in_flight.get(("load", rid))
            if load is not None and not load.sync:
                raise EngineCoreViolation(
                    "load_before_compute",
                    f"{where} scheduled {rid!r}, whose KV load is still in flight",
                )

    def check_held(self, free: set[int], tables: Mapping[str, tuple[int, ...]], where: str) -> None:
        """`transfer_blocks_held`: no block of a transfer in flight is free; an asynchronous
        load's blocks are held by its request alone (`tables`: each request's blocks, in every
        group on a hybrid cache)."""
        holders: dict[int, list[str]] = {}
        for rid, table in tables.items():
            for b in table:
                holders.setdefault(b, []).append(rid)
        for t in self.in_flight.values():
            for b in t.all_blocks():
                state = "unstarted" if t.started is None else "in flight"
                if b in free:
                    raise EngineCoreViolation(
                        "transfer_blocks_held",
                        f"{where}: block {b} is free, but the {t.kind} of {t.rid!r} "
                        f"({state}) still uses it",
                    )
                others = [r for r in holders.get(b, ()) if r != t.rid]
                # a synchronous load's blocks may be shared in its own step (vLLM caches them
                # at once; the load is done before attention reads them)
                if t.kind == "load" and not t.sync and others:
                    raise EngineCoreViolation(
                        "transfer_blocks_held",
                        f"{where}: block {b} is held by {others}, but the load of {t.rid!r} "
                        f"({state}) is writing it",
                    )

    def check_delivered(self, request: Any, blocks: tuple[int, ...]) -> None:
        """`kv_delivered`: a producer's request that finished by stopping or at its length is
        handed to the connector with blocks covering at least its prompt (what a P/D decode
        instance needs from it). vLLM keeps that so by recomputing a request preempted with a
        step in flight rather than letting that step's output finish it with its blocks freed
        (`requires_kv_delivery`)."""
        covered = len(blocks) * self.block_size
        if covered < request.num_prompt_tokens:
            raise EngineCoreViolation(
                "kv_delivered",
                f"{request.request_id!r} finished ({request.status.name}) and its KV is to be "
                f"sent, but the connector was handed {len(blocks)} blocks of {self.block_size} "
                f"for its {request.num_prompt_tokens}-token prompt",
            )

    def check_done(self) -> None:
        """`progress` once drained: every transfer was reported."""
        if self.in_flight:
            left = sorted(f"{kind} of {rid!r}" for kind, rid in self.in_flight)
            raise EngineCoreViolation(
                "progress", f"drained, but transfers were never reported: {', '.join(left)}"
            )


def _span(
    table: tuple[int | None, ...], block_size: int, start: int, end: int
) -> tuple[int, tuple[Any, ...]]:
    """The index of the block holding token `start`, and the blocks of `table` from it to the
    one holding token `end - 1`, in blocks of `block_size` tokens."""
    first = start // block_size
    return first, table[first : -(-end // block_size)]


def _blocks_text(transfer: Transfer) -> str:
    """`transfer`'s blocks for a trace line: group 0's, then each further group's."""
    text = str(list(transfer.blocks))
    for g in transfer.groups:
        text += f", group {g.group}: {['null' if b is None else b for b in g.blocks]}"
    return text


def _connector_class() -> type:
    """`SchedspecKvConnector`, a subclass of vLLM's `KVConnectorBase_V1` (imported now)."""
    base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")

    class Metadata(base.KVConnectorMetadata):  # type: ignore[misc, name-defined]
        def __init__(self, meta: _Metadata) -> None:
            self.transfers = meta.transfers

    class SchedspecKvConnector(
        base.KVConnectorBase_V1,  # type: ignore[name-defined, misc]
        base.SupportsHMA,  # type: ignore[name-defined, misc]
    ):
        """The scheduler side of a KV connector whose every decision is `remote`'s (set by the
        loop once vLLM has built it). The worker-side methods are never called: the loop runs
        the worker (`RemoteKv.execute`). It supports vLLM's hybrid memory allocator (HMA):
        vLLM keeps a hybrid cache's groups apart beside it and hands it every group's
        blocks."""

        remote: RemoteKv

        def get_num_new_matched_tokens(
            self, request: Any, num_computed_tokens: int
        ) -> tuple[int | None, bool]:
            n = self.remote.lookup(request, num_computed_tokens)
            if n is None:
                return None, False
            return n, n > 0 and self.remote.loads_async(request)

        def may_load_async(self, request: Any) -> bool:
            # vLLM 0.34.0 asks, with max_num_inflight_kv_loads, whether a request may start
            # an asynchronous load while the running batch is full (0.33.0 never asks)
            remote: RemoteKv | None = getattr(self, "remote", None)
            if remote is None:  # asked before the loop hands the connector its store
                return False
            return remote.may_load_async(request)

        def update_state_after_alloc(
            self, request: Any, blocks: Any, num_external_tokens: int
        ) -> None:
            ids = blocks.get_block_ids()
            others = [
                [None if b.is_null else b.block_id for b in group] for group in blocks.blocks[1:]
            ]
            self.remote.allocated(request, ids[0], num_external_tokens, groups=others)

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            return Metadata(self.remote.metadata())

        def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
            return self.remote.finished(request, block_ids), None

        def request_finished_all_groups(
            self, request: Any, block_ids: tuple[list[int], ...]
        ) -> tuple[bool, None]:
            # vLLM calls this one (the connector supports HMA), one block list per group
            return self.remote.finished(request, block_ids[0], groups=block_ids[1:]), None

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            raise NotImplementedError("the loop runs the worker side")

        def wait_for_layer_load(self, layer_name: str) -> None:
            raise NotImplementedError("the loop runs the worker side")

        def save_kv_layer(
            self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
        ) -> None:
            raise NotImplementedError("the loop runs the worker side")

        def wait_for_save(self) -> None:
            raise NotImplementedError("the loop runs the worker side")

    return SchedspecKvConnector


def __getattr__(name: str) -> Any:
    """vLLM's factory reads `SchedspecKvConnector` here; it is built on first read, so that
    importing this module does not import vLLM."""
    if name == KV_CONNECTOR_NAME:
        cls = _connector_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GroupBlocks", "RemoteKv", "Transfer", "TransferCounts"]
