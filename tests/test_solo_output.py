"""The parity reference (`properties.harness.solo_output`) and its cache: a request's solo sync
output at batch size 1 is cached per implementation, configuration and whole request, so two
requests that differ only in what ends them never share an output."""

from __future__ import annotations

import dataclasses

from properties.harness import SoloCache, solo_output
from reference.dllm import make_scheduler
from spec.config import RequestSpec
from tests.event_runs import SMALL_SYNC

PLAIN = RequestSpec("a", (3, 4), 8)


def _first_repeat_free_token(out: tuple[int, ...]) -> int:
    """A generated token after the first that occurs nowhere before it (so a stop there cuts
    the output short)."""
    for k, tok in enumerate(out[1:], start=1):
        if tok not in out[:k]:
            return tok
    raise AssertionError(f"every token of {out} repeats an earlier one")


def test_a_cached_solo_output_is_not_reused_for_a_request_with_stop_token_ids() -> None:
    cache: SoloCache = {}
    out = solo_output(make_scheduler, SMALL_SYNC, PLAIN, cache)
    assert len(out) == PLAIN.max_new_tokens
    stop = _first_repeat_free_token(out)
    stopped = dataclasses.replace(PLAIN, stop_token_ids=(stop,))
    assert solo_output(make_scheduler, SMALL_SYNC, stopped, cache) == out[: out.index(stop) + 1]
    assert solo_output(make_scheduler, SMALL_SYNC, PLAIN, cache) == out
    assert len(cache) == 2


def test_a_cached_solo_output_is_not_reused_for_a_request_with_ignore_eos() -> None:
    cache: SoloCache = {}
    out = solo_output(make_scheduler, SMALL_SYNC, PLAIN, {})
    eos = _first_repeat_free_token(out)
    config = SMALL_SYNC.replace(eos_token_id=eos)
    ending = solo_output(make_scheduler, config, PLAIN, cache)
    assert ending == out[: out.index(eos) + 1]
    ignoring = dataclasses.replace(PLAIN, ignore_eos=True)
    assert solo_output(make_scheduler, config, ignoring, cache) == out
