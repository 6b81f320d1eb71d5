"""One line per event of an engine-core loop, for reading a (shrunk) counterexample.

`BatchQueueLoop` with a `trace` list (`LoopOptions(trace=[])`) appends a line for every
submission, abort, `schedule()` call and applied output, and the KV connector's store one for
every lookup put off, load, send and report (`RemoteKv.log`). These functions say a vLLM
`SchedulerOutput` and a batch's `EngineCoreOutputs` in one line each.
"""

from __future__ import annotations

import re
from typing import Any

from integrations.vllm.release_api import resumed_req_ids

_EMPTY = re.compile(r"step (\d+): schedule (\d+): nothing$")
_NO_TOKEN = re.compile(r"step (\d+): output of schedule (\d+): no token$")


def counted(n: int, thing: str) -> str:
    """`n` and `thing`, plural unless `n` is 1 ("1 token", "3 tokens")."""
    return f"{n} {thing}{'s' * (n != 1)}"


def counted_of(n: int, thing: str) -> str:
    """`counted` as a possessive ("1 token's", "3 tokens'")."""
    return counted(n, thing) + ("'s" if n == 1 else "'")


def schedule_line(out: Any, *, canvas: bool = False) -> str:
    """What a `SchedulerOutput` schedules: each request's tokens (new, resumed, with drafts, or
    with `canvas` a diffusion canvas, which rides the drafts' field, and the multimodal items
    the encoder runs for it), then the requests preempted in the call, those reported ended
    since the last one and the encoder cache entries the runner is told to free."""
    new = {r.req_id for r in out.scheduled_new_reqs}
    resumed = resumed_req_ids(out)
    drafts = out.scheduled_spec_decode_tokens or {}
    encoder_inputs = getattr(out, "scheduled_encoder_inputs", None) or {}
    parts = []
    for rid, tokens in out.num_scheduled_tokens.items():
        tag = " (new)" if rid in new else " (resumed)" if rid in resumed else ""
        k = len(drafts.get(rid, ()))
        parts.append(f"{rid} {tokens} token{'s' if tokens != 1 else ''}{tag}")
        if k:
            parts[-1] += f" with a canvas of {k}" if canvas else f" with {k} draft{'s' * (k != 1)}"
        if items := encoder_inputs.get(rid):
            parts[-1] += f", encoder runs its item{'s' * (len(items) != 1)} {sorted(items)}"
    line = ", ".join(parts) or "nothing"
    if out.preempted_req_ids:
        line += f"; preempted {sorted(out.preempted_req_ids)}"
    if out.finished_req_ids:
        line += f"; ended since the last call {sorted(out.finished_req_ids)}"
    if freed := getattr(out, "free_encoder_mm_hashes", None):
        line += f"; encoder cache frees {sorted(freed)}"
    return line


def output_line(engine_outputs: Any) -> str:
    """What applying a batch's output gave each request: tokens, and a finish reason."""
    parts = []
    for per_client in engine_outputs.values():
        for o in per_client.outputs:
            n = len(o.new_token_ids)
            part = f"{o.request_id} +{n} token{'s' if n != 1 else ''}"
            if o.finish_reason is not None:
                part += f", finished ({o.finish_reason.name.lower()})"
            parts.append(part)
    return ", ".join(parts) or "no token"


def compact(trace: list[str]) -> list[str]:
    """`trace` with each run of idle engine steps (a schedule of nothing and its output: a
    hang's steps) said in one line."""
    lines: list[str] = []
    empty: set[str] = set()  # the schedules of nothing
    run: list[int] = []  # the engine steps of the idle run being gathered
    for line in trace:
        nothing = _EMPTY.match(line)
        no_token = _NO_TOKEN.match(line)
        if nothing:
            empty.add(nothing.group(2))
        idle = nothing or (no_token if no_token and no_token.group(2) in empty else None)
        if idle:
            run.append(int(idle.group(1)))
            continue
        if run:
            lines.append(_idle(run))
            run = []
        lines.append(line)
    if run:
        lines.append(_idle(run))
    return lines


def elide(lines: list[str], head: int = 60, tail: int = 20) -> list[str]:
    """`lines` with all but the first `head` and the last `tail` said in one line (a hang's
    run, whose repeating events `compact` cannot fold, would fill a report)."""
    if len(lines) <= head + tail + 1:
        return list(lines)
    left = len(lines) - head - tail
    return [*lines[:head], f"... {left} lines left out ...", *lines[-tail:]]


def _idle(steps: list[int]) -> str:
    first, last = steps[0], steps[-1]
    if first == last:
        return f"step {first}: schedule() scheduled nothing"
    return f"steps {first}..{last}: schedule() scheduled nothing"


__all__ = ["compact", "counted", "counted_of", "output_line", "schedule_line"]
