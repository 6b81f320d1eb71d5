"""Where the vLLM releases this project drives (0.33.0, the default, and 0.34.0, selected with
`SCHEDSPEC_VLLM_VERSION`) differ in an API the adapters call: each difference is one function
here that works on both, told apart by what the installed release has, not by its number.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from spec.errors import ConfigError


def configs_as_with_triton(config: ModuleType, triton_utils: Any) -> None:
    """Build configs as on a CPU install with triton-cpu, where the release demands it.

    vLLM 0.34.0 has one model runner, which compiles kernels with Triton, and its CPU platform
    refuses to build a config on x86 without triton-cpu (`CpuPlatform.check_and_update_config`
    reads `vllm.triton_utils.HAS_TRITON` when it runs). The scheduler never calls Triton and
    the registry has no triton-cpu, so the flag is set; modules that import Triton when it is on
    at their import (`vllm.triton_utils` itself) were imported before. 0.33.0 (whose config
    still has `use_v2_model_runner`) only warns, and chooses its model runner by the flag, so
    there it stays as the install has it."""
    if not hasattr(config.VllmConfig, "use_v2_model_runner"):
        triton_utils.HAS_TRITON = True


def check_scheduler_settings(scheduler_config: type, settings: dict[str, Any]) -> None:
    """Raise `ConfigError` naming a setting the installed release's `SchedulerConfig` lacks
    (vLLM 0.34.0 added `cache_aware_admission_window` and `_threshold`), rather than let
    pydantic reject it with its own message."""
    known = getattr(scheduler_config, "__dataclass_fields__", None)
    if known is None:
        return
    missing = [name for name in settings if name not in known]
    if missing:
        raise ConfigError(
            missing[0],
            settings[missing[0]],
            "a setting of this vLLM release's SchedulerConfig: it is new in vLLM 0.34.0 "
            "(install it with SCHEDSPEC_VLLM_VERSION=0.34.0 schedspec install-engines vllm and "
            "run with that variable set)",
        )


def runner_output(new_output: Callable[..., Any], ids: list[str], **fields: Any) -> Any:
    """`new_output` (vLLM's `ModelRunnerOutput`) for the batch `ids` with `fields`. vLLM 0.33.0
    also asks for each request's index in the batch (`req_id_to_index`); 0.34.0 dropped the
    field and reads the order of `req_ids`."""
    if "req_id_to_index" in getattr(new_output, "__dataclass_fields__", ()):
        fields["req_id_to_index"] = {rid: i for i, rid in enumerate(ids)}
    return new_output(req_ids=ids, **fields)


def resumed_req_ids(out: Any) -> set[str]:
    """The requests a `SchedulerOutput` resumes as cached requests (their block tables
    replaced, not appended to): vLLM 0.33.0's `scheduled_cached_reqs.resumed_req_ids`. 0.34.0
    sends a resumed request in full among `scheduled_new_reqs`, as a new one ("its blocks were
    freed and its worker state dropped at preemption"), so there it is always empty."""
    return set(getattr(out.scheduled_cached_reqs, "resumed_req_ids", ()))


def cached_block_ids(pool: Any) -> dict[Any, list[int]]:
    """The ids of the blocks vLLM's block pool `pool` caches under each key (a block hash with
    its group), sorted. vLLM keeps them in the private map `cached_block_hash_to_block._cache`:
    0.33.0 maps a key to its block, or to a dict of its blocks by id; 0.34.0 maps it to one
    block id, and a key cached by several blocks to all their ids in `_dup_ids`."""
    held = pool.cached_block_hash_to_block
    duplicates = getattr(held, "_dup_ids", None)
    if duplicates is None:  # 0.33.0
        return {
            key: sorted(
                int(b.block_id)
                for b in (blocks.values() if isinstance(blocks, dict) else (blocks,))
            )
            for key, blocks in held._cache.items()
        }
    return {
        key: sorted(int(b) for b in duplicates.get(key, (block_id,)))
        for key, block_id in held._cache.items()
    }


def draft_limits(grammar_output: Any) -> list[int | None]:
    """Per request of a `GrammarOutput` (in `structured_output_request_ids` order), how many
    of its drafts the model runner may accept; None: no limit but the rows' masks. vLLM 0.33.0
    sends `num_acceptable_drafts` (None there invalidates every draft); 0.34.0 has no such
    field: its scheduler trims drafts the grammar rejects before they are scheduled
    (`trim_spec_tokens`)."""
    ids = grammar_output.structured_output_request_ids
    if not hasattr(grammar_output, "num_acceptable_drafts"):
        return [None] * len(ids)
    acceptable = grammar_output.num_acceptable_drafts
    return [int(n) for n in acceptable] if acceptable is not None else [0] * len(ids)


def trims_to_first_rejected(manager: Any) -> bool:
    """Whether vLLM's `StructuredOutputManager` `manager` keeps a request's drafts up to and
    including the first its grammar rejects (0.34.0's `trim_spec_tokens`: the rejected one's
    bitmask row is masked, so rejection sampling turns it down), rather than only those the
    grammar admits (0.33.0's `validate_tokens`)."""
    return hasattr(manager, "trim_spec_tokens")


def cache_read_limit(request: Any) -> int | None:
    """The most leading tokens a prefix-cache hit may give vLLM's `request`
    (`ArRequest.cache_read_limit`): 0.34.0's `prefix_cache_hit_limit` (0 when it skips reading
    the cache, its `prompt_logprob_start` when it scores its prompt, else None); 0.33.0 only
    skips (`skip_reading_prefix_cache`, set for every prompt-scoring request): 0, else None."""
    if hasattr(request, "prefix_cache_hit_limit"):
        limit = request.prefix_cache_hit_limit
        return None if limit is None else int(limit)
    return 0 if request.skip_reading_prefix_cache else None


def bounded_reads(request_class: type) -> bool:
    """Whether vLLM's `Request` class bounds a cache hit at a scored prompt row (0.34.0's
    `get_max_cache_hit_length`), not only skips the cache (0.33.0)."""
    return hasattr(request_class, "get_max_cache_hit_length")


def cache_read_params(limit: int | None) -> dict[str, Any]:
    """The `SamplingParams` fields that give a request the cache read limit `limit`: none for
    None; `skip_reading_prefix_cache` for 0; for more, prompt scoring from row `limit` on
    (`prompt_logprobs=0`, 0.34.0's `prompt_logprob_start`) with `skip_reading_prefix_cache=
    False`: a prompt-scoring request skips the cache unless told so (`SamplingParams.
    __post_init__`; "set skip_reading_prefix_cache=False to reuse local cached rows before
    it", says `prompt_logprob_start`'s own docstring)."""
    if limit is None:
        return {}
    if limit == 0:
        return {"skip_reading_prefix_cache": True}
    return {"prompt_logprobs": 0, "prompt_logprob_start": limit, "skip_reading_prefix_cache": False}


__all__ = [
    "bounded_reads",
    "cache_read_limit",
    "cache_read_params",
    "cached_block_ids",
    "configs_as_with_triton",
    "draft_limits",
    "resumed_req_ids",
    "runner_output",
    "trims_to_first_rejected",
]
