"""`integrations.vllm.release_api` on both releases' shapes of each API that differs between
vLLM 0.33.0 and 0.34.0, with stand-ins built as each release builds them (no engine needed; the
real objects are exercised by the engine tests on 0.33.0 and by tests/test_real_vllm_newest.py
on 0.34.0)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

from integrations.vllm import release_api as api


@dataclass
class OutputWithIndex:  # vLLM 0.33.0's ModelRunnerOutput (the fields that matter)
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = field(default_factory=list)


@dataclass
class OutputWithoutIndex:  # vLLM 0.34.0's
    req_ids: list[str]
    sampled_token_ids: list[list[int]] = field(default_factory=list)


def test_a_runner_output_carries_the_batch_index_only_where_the_release_asks_for_it() -> None:
    old = api.runner_output(OutputWithIndex, ["a", "b"], sampled_token_ids=[[1], []])
    assert old == OutputWithIndex(["a", "b"], {"a": 0, "b": 1}, [[1], []])
    new = api.runner_output(OutputWithoutIndex, ["a", "b"], sampled_token_ids=[[1], []])
    assert new == OutputWithoutIndex(["a", "b"], [[1], []])


def test_resumed_requests_are_named_by_0_33_and_sent_as_new_by_0_34() -> None:
    old = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(resumed_req_ids={"r1"}))
    new = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace())
    assert api.resumed_req_ids(old) == {"r1"}
    assert api.resumed_req_ids(new) == set()


def _block(block_id: int) -> Any:
    return SimpleNamespace(block_id=block_id)


def test_cached_block_ids_read_both_layouts_of_the_prefix_cache_map() -> None:
    # 0.33.0: a key maps to its block, or to a dict of its blocks by id
    old = SimpleNamespace(
        cached_block_hash_to_block=SimpleNamespace(
            _cache={"k1": _block(4), "k2": {7: _block(7), 2: _block(2)}}
        )
    )
    # 0.34.0: a key maps to one block id; a key of several blocks has all their ids apart
    new = SimpleNamespace(
        cached_block_hash_to_block=SimpleNamespace(
            _cache={"k1": 4, "k2": 7}, _dup_ids={"k2": {7: None, 2: None}}
        )
    )
    assert api.cached_block_ids(old) == {"k1": [4], "k2": [2, 7]}
    assert api.cached_block_ids(new) == {"k1": [4], "k2": [2, 7]}


def test_draft_limits_follow_the_release() -> None:
    ids = ["a", "b"]
    assert api.draft_limits(SimpleNamespace(structured_output_request_ids=ids)) == [None, None]
    limited = SimpleNamespace(structured_output_request_ids=ids, num_acceptable_drafts=[2, 0])
    assert api.draft_limits(limited) == [2, 0]
    unset = SimpleNamespace(structured_output_request_ids=ids, num_acceptable_drafts=None)
    assert api.draft_limits(unset) == [0, 0]  # 0.33.0: None invalidates every draft


def test_the_draft_trim_and_the_triton_flag_are_told_apart_by_what_the_release_has() -> None:
    assert api.trims_to_first_rejected(SimpleNamespace(trim_spec_tokens=None))
    assert not api.trims_to_first_rejected(SimpleNamespace(validate_tokens=None))
    new, old = ModuleType("vllm.config"), ModuleType("vllm.config")
    new.VllmConfig = type("VllmConfig", (), {})  # type: ignore[attr-defined]
    old.VllmConfig = type(  # type: ignore[attr-defined]
        "VllmConfig", (), {"use_v2_model_runner": property(lambda self: False)}
    )
    flag = SimpleNamespace(HAS_TRITON=False)
    api.configs_as_with_triton(new, flag)
    assert flag.HAS_TRITON  # 0.34.0: one model runner, which needs triton-cpu on x86
    flag = SimpleNamespace(HAS_TRITON=False)
    api.configs_as_with_triton(old, flag)
    assert not flag.HAS_TRITON  # 0.33.0 picks its runner by the flag: left as installed
