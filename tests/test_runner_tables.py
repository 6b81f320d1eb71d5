"""The model runner's block tables rebuilt from scheduler outputs
(`integrations.vllm.runner_tables`), without vLLM: outputs and a scheduler's tables are
stand-ins with the fields the runner and the check read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from integrations.vllm.runner_tables import RunnerTables


def _output(
    *,
    new: dict[str, list[list[int]]] | None = None,
    cached: dict[str, list[list[int]] | None] | None = None,
    resumed: frozenset[str] = frozenset(),
    finished: frozenset[str] = frozenset(),
) -> Any:
    """A scheduler output: new requests with their tables, running or resumed ones with their
    new blocks (None: none), finished ids; every new or cached request scheduled."""
    new = new or {}
    cached = cached or {}
    return SimpleNamespace(
        finished_req_ids=set(finished),
        scheduled_new_reqs=[SimpleNamespace(req_id=r, block_ids=t) for r, t in new.items()],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(cached), new_block_ids=list(cached.values()), resumed_req_ids=resumed
        ),
        num_scheduled_tokens=dict.fromkeys([*new, *cached], 1),
    )


def _scheduler(tables: dict[str, list[list[int | None]]]) -> Any:
    """A scheduler holding `tables` (one list per group; None: the null block)."""
    groups = max((len(t) for t in tables.values()), default=1)

    def block(i: int | None) -> Any:
        return SimpleNamespace(is_null=i is None, block_id=0 if i is None else i)

    managers = [
        SimpleNamespace(req_to_blocks={r: [block(i) for i in t[g]] for r, t in tables.items()})
        for g in range(groups)
    ]
    return SimpleNamespace(
        kv_cache_manager=SimpleNamespace(coordinator=SimpleNamespace(single_type_managers=managers))
    )


def test_new_blocks_are_appended_and_a_resumed_table_replaces() -> None:
    runner = RunnerTables()
    assert runner.apply(_output(new={"a": [[1, 2]], "b": [[3]]})) is None
    assert runner.apply(_output(cached={"a": [[4]], "b": None})) is None
    assert runner.tables == {"a": [[1, 2, 4]], "b": [[3]]}
    assert runner.apply(_output(cached={"a": [[7, 8]]}, resumed=frozenset({"a"}))) is None
    assert runner.tables["a"] == [[7, 8]]
    assert runner.apply(_output(finished=frozenset({"b"}))) is None
    assert "b" not in runner.tables


def test_the_check_names_the_request_and_both_tables_when_they_differ() -> None:
    """The runner was told of block 2 only; the scheduler holds 2 and 5."""
    runner = RunnerTables()
    out = _output(new={"a": [[2]]})
    assert runner.apply(out) is None
    assert runner.mismatch(_scheduler({"a": [[2]]}), out) is None
    problem = runner.mismatch(_scheduler({"a": [[2, 5]]}), out)
    assert (
        problem
        == "'a' is scheduled with blocks [2, 5] in group 0, but its outputs gave the runner [2]"
    )


def test_null_blocks_in_the_scheduler_are_not_compared() -> None:
    """A sliding-window group's dropped blocks: the scheduler holds the null block where the
    runner still holds the old id; a real block that differs is still caught."""
    runner = RunnerTables()
    out = _output(new={"a": [[1, 2, 3], [4, 5, 6]]})
    assert runner.apply(out) is None
    assert runner.mismatch(_scheduler({"a": [[1, 2, 3], [None, None, 6]]}), out) is None
    problem = runner.mismatch(_scheduler({"a": [[1, 2, 3], [None, 9, 6]]}), out)
    assert problem is not None and "in group 1" in problem and "[None, 9, 6]" in problem


def test_outputs_the_runner_could_not_apply_are_named() -> None:
    runner = RunnerTables()
    resumed = _output(cached={"a": None}, resumed=frozenset({"a"}))
    assert runner.apply(resumed) == "'a' is resumed without its block table"
    problem = RunnerTables().apply(_output(cached={"z": [[3]]}))
    assert problem is not None and "'z' is scheduled as a running request" in problem
    unknown = _output(cached={"z": None})
    assert RunnerTables().mismatch(_scheduler({"z": [[3]]}), unknown) == (
        "'z' is scheduled, but no output gave the runner its block table"
    )


def test_a_request_vllm_freed_unreported_is_an_orphan() -> None:
    """The runner holds a and b; vLLM still has a, and reports b finished in its next output:
    nothing is wrong. Once b is neither vLLM's nor reported, the runner would hold it for
    ever."""
    runner = RunnerTables()
    assert runner.apply(_output(new={"a": [[1]], "b": [[2]]})) is None
    vllm = SimpleNamespace(requests={"a": object()}, finished_req_ids={"b"})
    assert runner.orphans(vllm) is None
    vllm.finished_req_ids = set()
    assert runner.orphans(vllm) == (
        "the model runner still holds ['b'], which vLLM freed without reporting them finished"
    )
    assert runner.apply(_output(finished=frozenset({"b"}))) is None
    assert runner.orphans(vllm) is None
