"""vLLM 0.33.0's engine-core loop serving LoRA adapters (`LoopOptions(loras=N, max_loras=M)`,
`--loras N --max-loras M`): request i runs adapter i mod (N + 1), 0 being the base model, and
vLLM's `LoRAConfig(max_loras=M)` bounds the adapters of the running requests.

What is checked: `max_loras` (after every `schedule()`, the running requests and those it
scheduled run at most M adapters); `admission_order` lets a request pass one whose adapter finds
no room, as vLLM skips it by design, and only then; `cache_hit_written` reads a prefix-cache hit
as KV of the adapter that wrote it, so equal tokens under two adapters are other KV whatever the
block hashes say. Released vLLM passes; three seeded bugs (adapters past `max_loras`, adapter
requests never admitted, adapters left out of the block hashes) fail a rule each, with messages
naming the adapters.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import adapter_of, lora_of
from integrations.vllm.engine_core import CoreProgram, LoopOptions, run_loop
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.vllm_seeded_bugs import (
    adapter_not_hashed,
    adapters_never_admitted,
    adapters_past_max_loras,
)

PROGRAMS = 40
LORAS = LoopOptions(loras=3, max_loras=1)


def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def test_each_arrival_runs_its_adapter_in_turn() -> None:
    """Without vLLM: adapters take turns by arrival, the base model first; none without LoRA."""
    assert [lora_of(i, 2) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert {lora_of(i, 0) for i in range(5)} == {0}


@pytest.mark.parametrize("max_loras", [1, 2])
def test_released_vllm_serves_adapters_within_max_loras(max_loras: int) -> None:
    """Shared-prompt programs (equal tokens under several adapters) pass both loops with 3
    adapters and 1 or 2 of them running at once; requests do wait for room for their adapter."""
    _vllm()
    options = replace(LORAS, max_loras=max_loras)
    waits = 0
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = run_loop(
                shared_prompt_program(seed), async_scheduling=async_scheduling, options=options
            )
            waits += run.adapter_waits
    assert waits > 0


def test_prefix_cache_hits_stay_within_an_adapter() -> None:
    """One prompt, four requests in turn, adapters 0, 1, 0, 1: the third hits the first's
    blocks and the fourth the second's, while the second, the first under its adapter, hits
    nothing, though its tokens are the first's."""
    _vllm()
    hits: dict[str, tuple[int, int]] = {}

    def observe(sched: Any) -> None:
        manager = sched.kv_cache_manager
        lookup = manager.get_computed_blocks

        def recorded(request: Any, *args: Any, **kwargs: Any) -> Any:
            found = lookup(request, *args, **kwargs)  # (blocks, tokens, shared boundary)
            hits.setdefault(request.request_id, (adapter_of(request), found[1]))
            return found

        manager.get_computed_blocks = recorded

    config = ArConfig(
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=8,
        enable_prefix_caching=True,
    )
    prompt = (100, 101, 102, 103)
    arrivals: list[tuple[ArRequest, ...]] = []
    for i in range(4):
        arrivals += [(ArRequest(f"r{i}", 4, 1, prompt=prompt),), (), (), ()]
    program = CoreProgram(config, tuple(arrivals), tuple(() for _ in arrivals))
    run_loop(program, async_scheduling=True, options=replace(LORAS, loras=1, fix=observe))
    assert hits == {"r0": (0, 0), "r1": (1, 0), "r2": (0, 2), "r3": (1, 2)}, hits


#: (seeded bug, the rule it fails, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], str, tuple[str, ...]]] = [
    (adapters_past_max_loras, "max_loras", ("run LoRA adapters", "max_loras=1")),
    (adapters_never_admitted, "admission_order", ("still wait",)),
    (adapter_not_hashed, "cache_hit_written", ("under LoRA adapter", "the same block hash")),
]


@pytest.mark.parametrize(
    ("bug", "rule", "words"), SEEDED_BUGS, ids=[bug.__name__ for bug, _, _ in SEEDED_BUGS]
)
def test_the_checks_catch_each_seeded_adapter_bug(
    bug: Callable[[Any], None], rule: str, words: tuple[str, ...]
) -> None:
    _vllm()
    options = replace(LORAS, mutate=bug)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(shared_prompt_program(seed), async_scheduling=True, options=options),
        until=rule,
    )
    assert rule in seen, seen
    assert all(w in seen[rule] for w in words), seen[rule]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"loras": -1}, "loras"),
        ({"loras": True}, "loras"),
        ({"loras": 2, "max_loras": 0}, "max_loras"),
        ({"max_loras": 2}, "max_loras"),
    ],
)
def test_bad_adapter_options_are_typed_errors(fields: dict[str, Any], field: str) -> None:
    _vllm()
    with pytest.raises(ConfigError) as err:
        run_loop(shared_prompt_program(0), async_scheduling=False, options=LoopOptions(**fields))
    assert err.value.field == field, err.value


def test_the_sweep_takes_adapters_and_refuses_max_loras_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/vllm_async_check.py --loras 2 --max-loras 2` passes and counts the waits;
    `--max-loras 2` without `--loras` is a usage error (exit 2)."""
    _vllm()
    script = load_script("vllm_async_check")
    argv = ["--programs", "6", "--programs-from", "shared-prompts", "--loras", "2"]
    assert script.main([*argv, "--max-loras", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 LoRA adapters, at most 2 running" in out and "room for their LoRA adapter" in out
    with pytest.raises(SystemExit) as exit_:
        script.main(["--programs", "1", "--max-loras", "2"])
    assert exit_.value.code == 2
    assert "--max-loras: an int >= 1, with --loras" in capsys.readouterr().err
