"""What vLLM 0.33.0's KV cache events say of each block they store, checked as a router that keys
blocks itself reads them (`integrations.vllm.kv_event_content`, the rule `kv_event_content`,
on whenever `LoopOptions(kv_events=True)`): each key of a `BlockStored`, of the GPU tier or the
CPU tier of vLLM's offloading connector, is the hash of a block of a request the engine was
given; its LoRA fields name that request's adapter; where the store is one block per key, its
token ids are the block's and its keys chain from `parent_block_hash`; its `extra_keys`, when
it carries them, are the block's.

Released vLLM passes with LoRA adapters, a window, a Mamba group, pipeline stages, drafts and
the CPU tier; three seeded bugs (a store that drops the adapter, token ids read one token late,
stores with no parent) fail the rule with messages naming the block. The CPU tier's stores
carry no `extra_keys` where the GPU tier's carry the adapter's name: counted, not a rule. The
checker itself is checked without vLLM.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1
(the checker's own tests run without it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.branching_prompt_programs import branching_prompt_program
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreRun, LoopOptions, run_loop
from integrations.vllm.kv_event_content import EventContent, KeyOrigins
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.offload_restore_fix import tracker_rebuilt
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.vllm_seeded_bugs import stored_tokens_one_late, stores_name_no_adapter, stores_unchained

PROGRAMS = 40
EVENTS = LoopOptions(kv_events=True, loras=2, max_loras=2)


def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _runs(options: LoopOptions, shared: bool = False) -> list[CoreRun]:
    """The first programs with prefix caching (branching prompts, or shared ones), both loops;
    a Mamba group's refusals (no chunked prefill) left out."""
    runs = []
    for seed in range(PROGRAMS):
        program = (shared_prompt_program if shared else branching_prompt_program)(seed)
        if not program.config.enable_prefix_caching:
            continue
        for async_scheduling in (False, True):
            try:
                runs.append(run_loop(program, async_scheduling=async_scheduling, options=options))
            except ConfigError as err:
                assert err.field == "mamba", err
    return runs


@pytest.mark.parametrize(
    "options",
    [
        EVENTS,
        replace(EVENTS, sliding_window=3),
        replace(EVENTS, mamba=True, mamba_block_scale=2),
        replace(EVENTS, pipeline_parallel_size=2, speculative_tokens=2),
    ],
    ids=["lora", "window", "mamba", "pp-drafts"],
)
def test_released_vllm_describes_every_block_it_stores(options: LoopOptions) -> None:
    """Every key stored is checked, in both loops; the GPU tier always carries the blocks'
    extra keys."""
    _vllm()
    runs = _runs(options)
    assert runs
    described = sum(r.events_keys_described for r in runs)
    assert described and described == sum(r.events_stored for r in runs), described
    assert not sum(r.events_without_extra_keys for r in runs)


def test_the_cpu_tier_describes_its_chunks_but_leaves_the_extra_keys_out() -> None:
    """vLLM's offloading connector with self-describing events: its CPU-tier stores name the
    blocks' keys, tokens, parents and adapters as the GPU tier's do, but carry no
    `extra_keys` (`_OffloadEventMetadata(extra_keys=None)`) where the GPU tier's carry the
    adapter's name; counted."""
    _vllm()
    options = replace(
        EVENTS,
        offload_chunks=8,
        offload_outputs=True,
        offload_blocks_per_chunk=2,
        offload_self_describing_events=True,
        fix=make_fixes(
            ["no-pointless-hit"] + ([] if tracker_rebuilt() else ["count-recorded-stores"])
        ),
    )
    runs = _runs(options, shared=True)
    assert sum(r.events_other_media for r in runs)
    assert sum(r.events_keys_described for r in runs) > sum(r.events_stored for r in runs)
    assert sum(r.events_without_extra_keys for r in runs)
    plain = _runs(replace(options, loras=0, max_loras=1), shared=True)
    assert not sum(r.events_without_extra_keys for r in plain)


#: (seeded bug, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], str, tuple[str, ...]]] = [
    (stores_name_no_adapter, "kv_event_content", ("names LoRA adapter", "(None, None)", "runs")),
    (stored_tokens_one_late, "kv_event_content", ("carries token ids", "but that block holds")),
    (stores_unchained, "kv_event_content", ("follows parent_block_hash None", "has key")),
]


@pytest.mark.parametrize(
    ("bug", "rule", "words"), SEEDED_BUGS, ids=[bug.__name__ for bug, _, _ in SEEDED_BUGS]
)
def test_a_store_that_misdescribes_its_blocks_is_caught(
    bug: Callable[[Any], None], rule: str, words: tuple[str, ...]
) -> None:
    _vllm()
    options = replace(EVENTS, mutate=bug)

    def run(seed: int) -> CoreRun | None:
        program = branching_prompt_program(seed)
        if not program.config.enable_prefix_caching:
            return None
        return run_loop(program, async_scheduling=True, options=options)

    seen = first_violations(PROGRAMS, run, until=rule)
    assert rule in seen, seen
    assert all(w in seen[rule] for w in words), seen[rule]
    assert "a GPU BlockStored's key" in seen[rule], seen[rule]


# --------------------------------------------------------------------- the checker, without vLLM
def _request(rid: str, tokens: list[int], adapter: int = 0) -> SimpleNamespace:
    """A request with blocks of 2 tokens, each hashed as its adapter and its tokens so far
    (so hashes chain, and differ between adapters, as vLLM's do)."""
    hashes = [(adapter, *tokens[: 2 * (j + 1)]) for j in range(len(tokens) // 2)]
    lora = SimpleNamespace(adapter_id=adapter, name=f"a{adapter}") if adapter else None
    return SimpleNamespace(
        request_id=rid, all_token_ids=tokens, block_hashes=hashes, lora_request=lora
    )


def _content(*requests: SimpleNamespace) -> EventContent:
    origins = KeyOrigins({r.request_id: r for r in requests}, 2, lambda h: h)
    return EventContent(
        origins,
        lambda req, _s, _e: (req.lora_request.name,) if req.lora_request else None,
    )


def _store(keys: list[Any], tokens: list[int], parent: Any = None, **fields: Any) -> Any:
    event = {"lora_id": None, "lora_name": None, "extra_keys": None, **fields}
    return SimpleNamespace(
        block_hashes=keys, token_ids=tokens, parent_block_hash=parent, block_size=2, **event
    )


def test_the_checker_passes_a_store_that_describes_its_blocks() -> None:
    r1, r2 = _request("r1", [1, 2, 3, 4, 5, 6]), _request("r2", [1, 2, 9, 9], adapter=3)
    content = _content(r1, r2)
    content.check_store(_store(r1.block_hashes[1:], [3, 4, 5, 6], r1.block_hashes[0]), "GPU", "")
    fields = {"lora_id": 3, "lora_name": "a3", "extra_keys": [("a3",), ("a3",)]}
    content.check_store(_store(r2.block_hashes, [1, 2, 9, 9], **fields), "CPU", "")
    # a placeholder (no tokens, block size 0) says nothing of its blocks
    content.check_store(SimpleNamespace(block_size=0, block_hashes=[("x",)]), "CPU", "")
    # a store of an adapter's blocks without extra keys is counted
    content.check_store(_store(r2.block_hashes[:1], [1, 2], lora_id=3, lora_name="a3"), "", "")
    assert (content.checked, content.stores_without_extra_keys) == (5, 1)


@pytest.mark.parametrize(
    ("store", "words"),
    [
        (_store([("x",)], [7, 7]), "is the hash of no block"),
        (_store([(0, 1, 2)], [1, 2], lora_id=3, lora_name="a3"), "names LoRA adapter"),
        (_store([(0, 1, 2)], [1, 3]), "carries token ids [1, 3], but that block holds [1, 2]"),
        (_store([(0, 1, 2, 3, 4)], [3, 4]), "follows parent_block_hash None"),
        (_store([(0, 1, 2), (0, 1, 2, 3, 4, 5, 6)], [1, 2, 5, 6]), "follows key 0"),
        (_store([(0, 1, 2)], [1, 2], extra_keys=[("a1",)]), "carries extra keys"),
    ],
    ids=["no-such-key", "adapter", "tokens", "parent", "chain", "extra-keys"],
)
def test_the_checker_names_what_a_store_gets_wrong(store: Any, words: str) -> None:
    content = _content(_request("r1", [1, 2, 3, 4, 5, 6]))
    with pytest.raises(EngineCoreViolation) as err:
        content.check_store(store, "GPU", "after schedule 3")
    assert err.value.rule == "kv_event_content"
    assert words in err.value.detail and "after schedule 3" in err.value.detail, err.value
