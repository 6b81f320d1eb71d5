"""The model runner's side of structured output in vLLM's engine-core loop: reading a batch's
`GrammarOutput` and rule `grammar_mask`.

vLLM's scheduler hands the model runner, per batch, the structured-output requests in a fixed
order and a block of `mask_stride` bitmask rows for each (`Scheduler.get_grammar_bitmask`):
row j constrains the token the request samples after its j-th draft, and
`num_acceptable_drafts` says how many of its drafts were checked against the grammar (vLLM's
V2 model runner rejects the rest, `grammar_invalid_drafts`). With
`integrations.vllm.structured`'s grammar a row is right only when it allows the class of the
output sampled under it alone (`grammar_mask`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.release_api import draft_limits
from integrations.vllm.structured import GRAMMAR_VOCAB, token_class


def allowed_classes(row: Any) -> list[int]:
    """The token classes bitmask `row` (int32 words) allows."""
    words = np.asarray(row, dtype=np.int32).view(np.uint32)
    return [c for c in range(GRAMMAR_VOCAB) if (int(words[c // 32]) >> (c % 32)) & 1]


class GrammarRows:
    """One batch's `GrammarOutput` (or None) as the model runner reads it: per structured
    request its rows (a block of `mask_stride` rows, in `structured_output_request_ids`
    order, as `apply_grammar_bitmask` lays them out) and how many drafts it may accept
    (vLLM 0.33.0's `num_acceptable_drafts`: the V2 model runner invalidates drafts from there
    on; 0.34.0 has no such limit, and each draft is accepted or not by its row alone)."""

    def __init__(self, grammar_output: Any) -> None:
        self.rows: dict[str, Any] = {}
        self.acceptable: dict[str, int] = {}
        self.checked: int = 0  # rows `check` found right
        self.reasoning: int = 0  # of those, rows of a reasoning output (unconstrained)
        self.later_reasoning: int = 0  # of those, in a streaming-input session's later turn
        if grammar_output is None:
            return
        ids = list(grammar_output.structured_output_request_ids)
        bitmask = grammar_output.grammar_bitmask
        stride = bitmask.shape[0] // len(ids)
        limits = draft_limits(grammar_output)
        for i, rid in enumerate(ids):
            self.rows[rid] = bitmask[i * stride : (i + 1) * stride]
            limit = limits[i]
            if limit is not None:
                self.acceptable[rid] = limit

    def limit(self, rid: str, drafts: int) -> int:
        """How many of `drafts` the request may accept: all without a grammar."""
        return min(drafts, self.acceptable.get(rid, drafts))

    def check(self, rid: str, first: int, count: int, span: tuple[int, int], turn: int = 1) -> None:
        """`grammar_mask`: request `rid` (structured) samples outputs first..first + count - 1
        from its rows 0..count - 1; its grammar constrains outputs `span` = (start, end). Each
        row for an output in the span must allow the class of that output alone, as the grammar
        stands after the outputs before it; a row for an output before the span (reasoning,
        which vLLM leaves unconstrained) must allow every token. Past `end` the grammar is done
        and vLLM drops what is sampled (a bonus token past `max_tokens` or the stop token), so
        those rows may allow anything. `turn` > 1: a streaming-input session's later turn,
        whose input asked for a grammar of that turn's outputs (named in the message)."""
        start, end = span
        count = min(count, end - first + 1)
        if count <= 0:
            return
        rows = self.rows.get(rid)
        if rows is None:
            raise EngineCoreViolation(
                "grammar_mask",
                f"{rid!r} uses structured output but samples output {first} with no bitmask "
                "row (its batch's grammar output leaves it out)",
            )
        for j in range(count):
            index = first + j
            if j >= len(rows):
                raise EngineCoreViolation(
                    "grammar_mask",
                    f"{rid!r} samples output {index} at row {j} of its {len(rows)} bitmask rows",
                )
            allowed = allowed_classes(rows[j])
            if index < start:
                if len(allowed) != GRAMMAR_VOCAB:
                    raise EngineCoreViolation(
                        "grammar_mask",
                        f"{rid!r} samples output {index}, still reasoning (its grammar starts "
                        f"at output {start}), under bitmask row {j}, which allows "
                        f"{_describe(allowed)}; a reasoning row allows every token",
                    )
                self.checked += 1
                self.reasoning += 1
                self.later_reasoning += turn > 1
                continue
            want = token_class(index)
            if allowed != [want]:
                raise EngineCoreViolation(
                    "grammar_mask",
                    f"{rid!r} samples output {index} under bitmask row {j}, which allows "
                    f"{_describe(allowed)}; its grammar after {index - start} outputs"
                    f"{f' in turn {turn} of its session' if turn > 1 else ''} allows "
                    f"class {want} alone{_state_of(allowed)}",
                )
            self.checked += 1


def _describe(allowed: list[int]) -> str:
    if len(allowed) == GRAMMAR_VOCAB:
        return "every token (unconstrained)"
    if not allowed:
        return "no token"
    return f"class {allowed[0]}" if len(allowed) == 1 else f"classes {allowed}"


def _state_of(allowed: list[int]) -> str:
    """Which output a one-class row is the row of."""
    if len(allowed) != 1:
        return ""
    return f" (the row for output {allowed[0]}, mod {GRAMMAR_VOCAB})"


__all__ = ["GrammarRows", "allowed_classes"]
