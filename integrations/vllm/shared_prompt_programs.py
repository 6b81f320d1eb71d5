"""Engine-core programs in which every program shares prompts, for the connector's offload
store.

`integrations.vllm.engine_core.core_program` makes half the prompts prefixes of one shared
prompt only in its prefix-caching programs (a third of them), as only prefix caching looked at
prompts. A KV connector does too: vLLM hashes every request's full blocks when a connector is
configured, and a content-addressed store (`integrations.vllm.offload_store.OffloadStore`)
serves a request the blocks an earlier request with the same prefix stored. Over
`core_program`'s programs only the prefix-caching third can hit it, and there vLLM's own prefix
cache serves a block first.

`shared_prompt_program(seed)` is `core_program(seed)` (the same configuration, arrivals and
aborts) with half the prompts of a program without prefix caching made prefixes of the shared
prompt too. Without prefix caching every such request's hit must come from the store: loaded,
and possibly failing, where the prefix cache would have served it.
"""

from __future__ import annotations

import random
from dataclasses import replace

from integrations.vllm.engine_core import SHARED_PROMPT_BASE, CoreProgram, core_program


def shared_prompt_program(seed: int) -> CoreProgram:
    """`core_program(seed)`, its prompts shared in every program: a prefix-caching program as
    drawn (half its prompts already shared), any other with each request's prompt made, by a
    coin of its own seeded draws, the first `prompt_len` tokens of one shared prompt."""
    program = core_program(seed)
    if program.config.enable_prefix_caching:
        return program
    rnd = random.Random(seed * 7919 + 2)
    shared = tuple(range(SHARED_PROMPT_BASE, SHARED_PROMPT_BASE + program.config.max_model_len))
    arrivals = tuple(
        tuple(replace(r, prompt=shared[: r.prompt_len]) if rnd.random() < 0.5 else r for r in batch)
        for batch in program.arrivals
    )
    return replace(program, arrivals=arrivals)


__all__ = ["shared_prompt_program"]
