"""The Vidur adapter's calls on Vidur's replica scheduler, one line each, in Vidur's terms.

A failing example of the AR suite prints the spec's calls (`submit(ArRequest(...))`, `step()`);
a Vidur developer reads the same example as the replica scheduler saw it: the scheduler built
for some settings, `add_request(Request(...))` under Vidur's own request ids, and per step
`batch = sched.on_schedule(t)` (the batch it formed, each request with its q tokens, and the
`allocate` / `restart()` / `free` calls made inside) and `sched.on_batch_end(batch)` (what
completed, what it freed), with the adapter's own edits for an abort (Vidur has none).

`VidurTranscript` records small tuples while the adapter runs (it runs on every example) and
builds the lines only when asked (`text`, which `VidurAdapter.native_calls` returns). Neither
recording nor `text` raises: a field it cannot read is recorded as `Unread` and said in a
line of its own, a line it cannot build is replaced by one saying why (a transcript that
raised would turn the finding it describes into an implementation_error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Unread:
    """A field the transcript could not read: what it is and the error reading it raised.
    Shown as `?` where the value would be, and in a line of its own after that line."""

    what: str
    error: str

    def __str__(self) -> str:
        return "?"


def read(what: str, get: Callable[..., Any], *args: Any) -> Any:
    """`get(*args)`, or an `Unread` naming `what` when it raises (never raises itself)."""
    try:
        return get(*args)
    except Exception as err:  # a Vidur release or subclass without the field: said, never raised
        return Unread(what, f"{type(err).__name__}: {err}")


def described(line: Callable[..., str], *args: Any) -> str:
    """`line(*args)`, or a line saying it could not be built (never raises)."""
    try:
        return line(*args)
    except Exception as err:  # the transcript is a courtesy; the finding is what is reported
        return f"# ({line.__name__} could not describe this call: {type(err).__name__}: {err})"


#: One thing that happened inside a call, in the order it happened: ("allocate", id, blocks,
#: group or None), ("free", ids), ("restart", id, prefill, decode), ("restarted?", id, the
#: `Unread` that hid whether it was), ("reset", id),
#: ("unqueued", id, where), ("dropped", batch id, ids).
Op = tuple[Any, ...]


@dataclass(slots=True)
class _Call:
    """One call the adapter made: `what` ("add", "schedule", "batch_end", "abort", "other"),
    its arguments, what happened inside it and, once it returned, its result (None: it did not
    return)."""

    what: str
    args: tuple[Any, ...]
    ops: list[Op] = field(default_factory=list)
    result: tuple[Any, ...] | None = None


#: The scheduler config fields shown when the config has them (the kinds differ).
_OPTIONAL_FIELDS = ("chunk_size", "max_tokens_in_batch", "max_waiting_iters")


def _construction(scheduler: Any) -> tuple[Any, ...]:
    """What the construction line says, read from the built scheduler: its class, the Vidur
    class it is or subclasses, and its settings as (name, value) pairs. The pool is in the
    scheduler's config and the block size in `ReplicaConfig` in vidur 0.0.25, both in a
    `CacheConfig` in 0.0.26."""
    cls = type(scheduler)
    own = next((c for c in cls.__mro__ if c.__module__.startswith("vidur.")), None)
    config = read("sched._config", lambda: scheduler._config)
    cache = getattr(scheduler, "_cache_config", None)
    if cache is not None:
        block_size = read("sched._cache_config.block_size", lambda: cache.block_size)
        pool = cache
        pool_name = "sched._cache_config"
    else:
        block_size = read(
            "sched._replica_config.block_size", lambda: scheduler._replica_config.block_size
        )
        pool = config
        pool_name = "sched._config"
    settings: list[tuple[str, Any]] = [
        ("block_size", block_size),
        ("num_blocks", read(f"{pool_name}.num_blocks", lambda: pool.num_blocks)),
        (
            "watermark_blocks_fraction",
            read(f"{pool_name}.watermark_blocks_fraction", lambda: pool.watermark_blocks_fraction),
        ),
        ("batch_size_cap", read("sched._config.batch_size_cap", lambda: config.batch_size_cap)),
    ]
    settings += [
        (name, read(f"sched._config.{name}", getattr, config, name))
        for name in _OPTIONAL_FIELDS
        if hasattr(config, name)
    ]
    settings.append(
        (
            "max_tokens",
            read(
                "sched._request_generator_config.max_tokens",
                lambda: scheduler._request_generator_config.max_tokens,
            ),
        )
    )
    max_batch = read("sched._max_batch_size", lambda: scheduler._max_batch_size)
    return (cls.__module__, cls.__qualname__, own, tuple(settings), max_batch)


class VidurTranscript:
    """The calls an adapter made on one Vidur replica scheduler, recorded as small tuples and
    said, one line a call, by `text`. Recording reads only what it is given, each read of a
    Vidur field guarded (`read`); nothing here raises."""

    def __init__(self, scheduler: Any, batch_time: float) -> None:
        self._construction = read("the scheduler", lambda: _construction(scheduler))
        self._batch_time = batch_time
        self._calls: list[_Call] = []
        self._names: dict[int, str] = {}  # Vidur request id -> the spec's id
        self._restarts: dict[int, int] = {}  # Vidur request id -> restarts already said

    # ------------------------------------------------------------------ recording
    def _call(self, what: str, *args: Any) -> _Call:
        call = _Call(what, args)
        self._calls.append(call)
        return call

    def added(self, vreq: Any, request_id: str) -> _Call:
        """Before `add_request(vreq)`: the request as Vidur holds it, under the spec's id (the
        adapter sets `call.result = ()` once it returned)."""
        vid = read("Request.id", lambda: vreq.id)
        if isinstance(vid, int):
            self._names[vid] = request_id
        return self._call(
            "add",
            vid,
            request_id,
            read("Request.arrived_at", lambda: vreq.arrived_at),
            read("Request.num_prefill_tokens", lambda: vreq.num_prefill_tokens),
            read("Request.num_decode_tokens", lambda: vreq.num_decode_tokens),
        )

    def scheduling(self, time: float) -> _Call:
        """Before `on_schedule(time)`; its result is set by `formed`."""
        return self._call("schedule", time)

    @staticmethod
    def formed(call: _Call, batch: Any, scheduled: Iterable[tuple[Any, int]]) -> None:
        """`on_schedule` returned `batch` (None: no batch) with `scheduled`, (request, q tokens)
        in the batch's order."""
        if batch is None:
            call.result = (None, ())
            return
        batch_id = read("Batch.id", lambda: batch.id)
        items = tuple((read("Request.id", getattr, r, "id"), n) for r, n in scheduled)
        call.result = (batch_id, items)

    def ending(self, time: float) -> _Call:
        """Before the batch's stage events and `on_batch_end`, which end at `time`; its result
        is the completed request ids (`call.result = (ids,)`)."""
        return self._call("batch_end", time)

    def aborting(self, request_id: str, vid: Any) -> _Call:
        """Before the adapter's edits for an abort of `request_id` (Vidur's `vid`); the adapter
        sets `call.result = ()` once they are done."""
        return self._call("abort", request_id, vid)

    def op(self, *op: Any) -> None:
        """Something that happened inside the current (latest) call."""
        if not self._calls:
            self._call("other")
        self._calls[-1].ops.append(op)

    def allocating(self, vid: int, num_blocks: int, group: tuple[int, ...]) -> None:
        """Before the real `allocate(vid, num_blocks, *group)`."""
        self.op("allocate", vid, num_blocks, group)

    def freeing(self, vids: tuple[int, ...], request_of: Callable[[int], Any]) -> None:
        """Before the real `free(*vids)`: any `restart()` of a freed request not yet said (Vidur
        restarts a request, then frees it), then the free."""
        for vid in vids:
            vreq = read(f"request {vid}", request_of, vid)
            restarts = read("Request.num_restarts", getattr, vreq, "num_restarts")
            if isinstance(restarts, Unread):
                self.op("restarted?", vid, vreq if isinstance(vreq, Unread) else restarts)
            elif isinstance(restarts, int) and restarts > self._restarts.get(vid, 0):
                self._restarts[vid] = restarts
                self.op(
                    "restart",
                    vid,
                    read("Request.num_prefill_tokens", getattr, vreq, "num_prefill_tokens"),
                    read("Request.num_decode_tokens", getattr, vreq, "num_decode_tokens"),
                )
        self.op("free", vids)

    # ------------------------------------------------------------------ saying
    def text(self) -> str:
        """The transcript: the construction line, then one line per call (and one per field
        that could not be read)."""
        lines = [described(self._construction_line)]
        lines += [described(self._call_line, call) for call in self._calls]
        return "\n".join(lines)

    def _construction_line(self) -> str:
        made = self._construction
        if isinstance(made, Unread):
            return "sched = <a Vidur replica scheduler>(...)" + _notes([made])
        module, name, own, settings, max_batch = made
        if own is None:
            whose = f"{module}.{name}, no Vidur replica scheduler among its bases; "
        elif own.__module__ == module and own.__qualname__ == name:
            whose = ""
        else:
            whose = f"{module}.{name}, subclassing Vidur's {own.__qualname__}; "
        shown = ", ".join(f"{k}={v}" for k, v in settings)
        values = [v for _, v in settings] + [max_batch]
        return (
            f"sched = {name}(...)  # {whose}{shown}; max batch size {max_batch}; one stage, "
            f"every batch {self._batch_time} s (the adapter's constant execution time)"
            + _notes(values)
        )

    def _name(self, vid: Any) -> str:
        """A Vidur request id with the spec's id beside it: `7 (r0)`."""
        spec = self._names.get(vid) if isinstance(vid, int) else None
        return f"{vid} ({spec})" if spec is not None else str(vid)

    def _call_line(self, call: _Call) -> str:
        if call.what == "add":
            vid, rid, arrived, prefill, decode = call.args
            line = (
                f"sched.add_request(Request(arrived_at={arrived}, num_prefill_tokens={prefill}, "
                f"num_decode_tokens={decode}))  # Request id {vid} ({rid})"
            )
            unread = list(call.args)
        elif call.what == "schedule":
            line, unread = self._schedule_line(call)
        elif call.what == "batch_end":
            (time,) = call.args
            said = "after the batch's stage events"
            if call.result is not None:
                (completed,) = call.result
                done = ", ".join(self._name(v) for v in completed) or "none"
                said += f"; completed: {done}"
            line = f"sched.on_batch_end(batch)  # at t={time}, {said}"
            unread = []
        elif call.what == "abort":
            rid, vid = call.args
            line = (
                f"# abort {rid}, Request id {vid} (Vidur has no abort; the adapter edits its state)"
            )
            unread = [vid]
        else:
            line = "# (outside the adapter's calls)"
            unread = []
        ops = [self._op_text(op) for op in call.ops]
        if ops and call.what == "abort":
            line += ": " + ", ".join(ops)
        elif ops:
            line += ("; " if "  # " in line else "  # ") + "during it: " + ", ".join(ops)
        if call.result is None:
            line += "; it did not return (it raised, or a check stopped the example inside it)"
        unread += [x for op in call.ops for x in op]
        return line + _notes(unread)

    def _schedule_line(self, call: _Call) -> tuple[str, list[Any]]:
        (time,) = call.args
        line = f"batch = sched.on_schedule({time})"
        if call.result is None:
            return line, []
        batch_id, items = call.result
        if batch_id is None:
            return f"{line}  # None: no batch", []
        tokens = ", ".join(f"{self._name(v)} {n} q token{'s' * (n != 1)}" for v, n in items)
        return f"{line}  # Batch {batch_id}: {tokens}", [batch_id] + [v for v, _ in items]

    def _op_text(self, op: Op) -> str:
        what = op[0]
        if what == "allocate":
            _, vid, n, group = op
            return f"allocate({', '.join(str(x) for x in (vid, n, *group))})"
        if what == "free":
            return f"free({', '.join(str(v) for v in op[1])})"
        if what == "restart":
            _, vid, prefill, decode = op
            return (
                f"restart() of {self._name(vid)} (now num_prefill_tokens={prefill}, "
                f"num_decode_tokens={decode})"
            )
        if what == "restarted?":
            return f"(whether {self._name(op[1])} was restarted: unknown)"
        if what == "reset":
            return f"the adapter reset {op[1]}'s pipeline-stage counters, which restart() keeps"
        if what == "unqueued":
            return f"took {op[1]} out of sched.{op[2]}"
        if what == "dropped":
            ids = ", ".join(str(v) for v in op[2])
            return (
                f"dropped Batch {op[1]} ({ids}) from sched._preempted_batches, left with "
                "nothing to run"
            )
        return repr(op)


def _notes(values: Iterable[Any]) -> str:
    """A line per `Unread` among `values`, each after a newline ("" when all were read)."""
    return "".join(
        f"\n# (the transcript could not read {v.what}: {v.error})"
        for v in values
        if isinstance(v, Unread)
    )


__all__ = ["Op", "Unread", "VidurTranscript", "described", "read"]
