"""A candidate fix for a minor finding in vLLM 0.33.0's own KV offloading connector: a hit that
leaves nothing computed once vLLM rolls the whole-prompt hit back by one token.

The finding (docs/engines/vllm-kv.md, "a one-token prompt offloaded at block size 1 loads for
ever"): after an asynchronous load vLLM recomputes the last token of a hit that covers the whole
prompt (`Scheduler._update_waiting_for_remote_kv`: `num_computed_tokens = num_tokens - 1`).
For a one-token prompt, whose one block is offloaded when blocks hold one token, that leaves
nothing computed; the next `schedule()` treats the request as new, the connector offers the
same hit again, and vLLM loads it again, for ever.

The fix: `OffloadingConnectorScheduler.get_num_new_matched_tokens` offers no hit that would
leave, after that rollback, no more than the request's computed tokens (the load would gain
nothing: `num_tokens - 1 <= num_computed_tokens` with a whole-prompt hit). The request is
then computed locally. Every other hit is offered as before. It is an edit of vLLM's own
`vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`
(`OFFLOAD_HIT_FIXES`): `scripts/engine_fixes_diff.py vllm-offloading` prints it as a patch,
and `apply_offload_hit_fix(sched)` gives one built scheduler's connector the edited method.
`FixDoesNotApply` if vLLM's file no longer has the statement the fix edits.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply, FixSet
from integrations.vllm.adapter import load_vllm

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
OFFLOAD_HIT = "no-pointless-hit"
_METHOD = "OffloadingConnectorScheduler.get_num_new_matched_tokens"

#: Where `get_num_new_matched_tokens` records the hit it offers.
_HIT_RECORDED = (
    "        req_status.update_num_hit_chunks(num_computed_tokens + (num_hit_tokens or 0))\n"
)
_HIT_CAPPED = (
    "        if (\n"
    "            num_hit_tokens\n"
    "            and num_computed_tokens + num_hit_tokens >= request.num_tokens\n"
    "            and request.num_tokens - 1 <= num_computed_tokens\n"
    "        ):\n"
    "            # The scheduler recomputes the last token of a whole-prompt hit: this\n"
    "            # one would leave nothing beyond what is computed (a one-token prompt\n"
    "            # would be loaded, rolled back to nothing and looked up again, for ever).\n"
    "            num_hit_tokens = 0\n" + _HIT_RECORDED
)

OFFLOAD_HIT_FIX = EngineFix(
    OFFLOAD_HIT,
    ((MODULE, _HIT_RECORDED, _HIT_CAPPED),),
    ((MODULE, _METHOD),),
    "a whole-prompt hit that vLLM's rollback of its last token leaves worthless (a one-token "
    "prompt at block size 1, loaded for ever): offer no hit",
)
OFFLOAD_HIT_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(MODULE,),
    fixes=(OFFLOAD_HIT_FIX,),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)


@functools.cache
def _fixed_method() -> Any:
    methods = OFFLOAD_HIT_FIXES.fixed_methods((OFFLOAD_HIT,))
    return methods[(MODULE, _METHOD)]


def apply_offload_hit_fix(sched: Any) -> None:
    """Give the offloading connector of `sched` (a built scheduler serving vLLM's
    `OffloadingConnector`) the fixed `get_num_new_matched_tokens`; `FixDoesNotApply` for a
    scheduler without that connector."""
    give_connector_method(sched, OFFLOAD_HIT, "get_num_new_matched_tokens", _fixed_method())


def offloading_connector(sched: Any, fixes: str) -> Any:
    """The scheduler side of vLLM's offloading connector that `sched` serves;
    `FixDoesNotApply` for a scheduler without it, naming `fixes` ("no-pointless-hit edits")."""
    connector = getattr(getattr(sched, "connector", None), "connector_scheduler", None)
    if type(connector).__name__ != "OffloadingConnectorScheduler":
        raise FixDoesNotApply(
            f"{fixes} vLLM's offloading connector; this scheduler serves "
            f"{type(getattr(sched, 'connector', None)).__name__}"
        )
    return connector


def give_methods(holder: Any, methods: dict[str, Any]) -> None:
    """Give the object `holder` `methods` (name -> function) through a subclass of its class,
    as edited methods replace the class's own for that one object."""
    cls = type(holder)
    holder.__class__ = type(cls.__name__, (cls,), methods)


def give_connector_method(sched: Any, fix: str, name: str, method: Any) -> None:
    """Give the offloading connector of `sched` `method` as its method `name` (as fix `fix`
    edits it); `FixDoesNotApply` for a scheduler without vLLM's offloading connector."""
    give_methods(offloading_connector(sched, f"{fix} edits"), {name: method})


__all__ = [
    "OFFLOAD_HIT",
    "OFFLOAD_HIT_FIX",
    "OFFLOAD_HIT_FIXES",
    "apply_offload_hit_fix",
    "give_connector_method",
    "give_methods",
    "offloading_connector",
]
