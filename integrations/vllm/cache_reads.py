"""Cache read limits in vLLM's engine-core loop (`LoopOptions.cache_read_limits`): requests that
skip the prefix cache or score their prompt from a row on, and the rule that they read no more.

`with_cache_read_limits(program, bounded)` gives a program's requests their limits in turn, by
arrival (a request named r<n>, as every generator names them in arrival order, takes turn n, so
a shrunk program's requests keep their limits): none, 0 (vLLM's `skip_reading_prefix_cache`),
and, where the release bounds a hit (0.34.0's `prompt_logprob_start`, `bounded`), a first
scored row s = (prompt_len - 1) // 2 for a prompt of 3 tokens or more (vLLM refuses a row from
prompt_len - 1 on), else 0 again. The adapter passes them on to vLLM
(`integrations.vllm.release_api.cache_read_params`).

`check_cache_reads` is rule `cache_read_limit`: a request scheduled as new or resumed after a
preemption, whose computed tokens then come from the prefix cache or a KV connector's load,
starts with at most its limit of them. A connector's load counts too: vLLM reads nothing from a
connector for a request with a limit (`skip_reading_external_kv`). A streaming-input session
resuming on the KV it kept between turns read nothing, and is left out (`own_kv`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation
from spec.ar.config import ArRequest

#: The limits requests take in turn, by arrival (a scored row: "row", where the release has
#: one, else 0).
CYCLE = (None, 0, "row")


def limit_for(request: ArRequest, index: int, bounded: bool) -> int | None:
    """The cache read limit of the `index`-th request to arrive (`CYCLE`)."""
    kind = CYCLE[index % len(CYCLE)]
    if kind is None:
        return None
    if kind == "row" and bounded and request.prompt_len >= 3:
        return (request.prompt_len - 1) // 2
    return 0


def turn_of(request: ArRequest, index: int) -> int:
    """The turn of the `index`-th request to arrive: n for a request named r<n> (the generators
    name them so, in arrival order; a smaller program shrunk from one keeps the names, and so
    each request its limit), else `index`."""
    named = re.fullmatch(r"r(\d+)", request.request_id)
    return int(named.group(1)) if named else index


def with_cache_read_limits(program: Any, bounded: bool) -> Any:
    """`program` (a `CoreProgram`) with its requests' cache read limits set in turn, by arrival
    (`turn_of`, `limit_for`)."""
    index = 0
    batches = []
    for batch in program.arrivals:
        limited = []
        for request in batch:
            turn = turn_of(request, index)
            limited.append(replace(request, cache_read_limit=limit_for(request, turn, bounded)))
            index += 1
        batches.append(tuple(limited))
    return replace(program, arrivals=tuple(batches))


def describe_limit(limit: int) -> str:
    """What a limit means, for a message."""
    if limit == 0:
        return "it skips reading the prefix cache"
    return f"it scores its prompt from row {limit} on"


def check_cache_reads(starts: Mapping[str, int], limits: Mapping[str, int], where: str) -> int:
    """Rule `cache_read_limit` over the requests of `limits`: those a `schedule()` call admits
    (new, or resumed after a preemption, but not sessions resuming on their kept KV) that have
    a limit, with it; `starts`: each one's computed tokens before the call's batch. Returns how
    many of them read part of a hit (some tokens, within the limit)."""
    partial = 0
    for rid, limit in sorted(limits.items()):
        start = starts[rid]
        if start > limit:
            raise EngineCoreViolation(
                "cache_read_limit",
                f"{where}: {rid!r} is scheduled from {start} computed tokens, read from the "
                f"prefix cache or a KV connector at its admission, but its cache read limit is "
                f"{limit} ({describe_limit(limit)}): at most {limit} may be read",
            )
        partial += start > 0
    return partial


__all__ = [
    "CYCLE",
    "check_cache_reads",
    "describe_limit",
    "limit_for",
    "turn_of",
    "with_cache_read_limits",
]
