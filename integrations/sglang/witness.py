"""Witnesses of SGLang 0.5.23's findings: what each finding's mechanism does, seen in a run.

A known fix that changes admissions by design passes a failing program deciding alike only up
to its own first other admission, which is weak evidence that the failure was its finding
(`schedspec_cli.known_fixes`: "probably"). A witness gives the verdict a lead: while the
failing program runs again on SGLang as released, it spies on the method where the finding's
mechanism acts and notes each time it does. A note means the mechanism acted in that run, not
that it caused the failure: under KV pressure it acts in runs that pass too (a review found
it in passing programs, and beside a bug of its own planted elsewhere). No note means only
that this witness did not see it (a witness claims nothing by its silence). Both assume the
adapter's SGLang setup: no separate context encoding, no priority preemption.

- `staged_without_a_row`: the staging path (`PrefillAdder.add_dllm_staging_req`) takes a
  request that holds no row. Only a request the incoming path's adder refused gets there
  without one (`process_dllm_incoming_reqs` moved it to a staging phase before the adder
  decided): the cause `refused-stays-incoming` fixes.
- `staged_block_cut`: the staging path takes a request with its next block cut to the budget
  left (`min(cand_extend_input_len, _rem_tokens)`), to a length that is not whole blocks: the
  truncation `whole-staged-blocks` fixes.

Each is a context manager yielding the list it appends its notes to; SGLang's methods are
restored on the way out, whatever happened inside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from integrations.sglang.adapter import spec_request_id


def was_taken(adder: Any, req: Any) -> bool:
    """Whether the adder put `req` in this round's batch (its methods' results say the budget
    left, not that)."""
    return any(r is req for r in adder.can_run_list)


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


@contextlib.contextmanager
def _spy_on_staging(note: Callable[[Any, Any, int, int], str | None]) -> Iterator[list[str]]:
    """Wrap `PrefillAdder.add_dllm_staging_req`: after each call that put the request in the
    round's batch, `note(adder, req, row_before, wanted)` (`wanted`: the tokens the request
    asked to extend by) may return a line to keep."""
    from integrations.sglang.engine import import_engine

    import_engine()  # the pinned install, activated (a fresh process has not yet)
    from sglang.srt.managers.schedule_policy import PrefillAdder

    seen: list[str] = []
    original = PrefillAdder.add_dllm_staging_req  # imported through the engine, activated

    def staging(self: Any, req: Any) -> Any:
        row = req.kv.req_pool_idx
        wanted = len(req.full_untruncated_fill_ids) - req.prefix_len
        result = original(self, req)
        if was_taken(self, req):
            line = note(self, req, row, wanted)
            if line is not None:
                seen.append(line)
        return result

    PrefillAdder.add_dllm_staging_req = staging
    try:
        yield seen
    finally:
        PrefillAdder.add_dllm_staging_req = original


def staged_without_a_row() -> contextlib.AbstractContextManager[list[str]]:
    """Notes each request the staging path takes without a row (the refused request's way
    back, `refused-stays-incoming`)."""

    def note(adder: Any, req: Any, row: int | None, wanted: int) -> str | None:
        if row is not None:
            return None
        extend = int(req.extend_end - req.prefix_len)
        return (
            f"PrefillAdder.add_dllm_staging_req took {spec_request_id(req.rid)!r} without a row "
            f"(extending it by {_tokens(extend)})"
        )

    return _spy_on_staging(note)


def staged_block_cut() -> contextlib.AbstractContextManager[list[str]]:
    """Notes each request the staging path takes with its extend cut short of what it asked
    for, to a length that is not whole blocks (`whole-staged-blocks`)."""

    def note(adder: Any, req: Any, row: int | None, wanted: int) -> str | None:
        extend = int(req.extend_end - req.prefix_len)
        block = int(adder.dllm_config.block_size)
        if extend >= wanted or extend % block == 0:
            return None
        return (
            f"PrefillAdder.add_dllm_staging_req cut the extend of {spec_request_id(req.rid)!r} to "
            f"{extend} of {_tokens(wanted)} (blocks of {block})"
        )

    return _spy_on_staging(note)


__all__ = ["staged_block_cut", "staged_without_a_row", "was_taken"]
