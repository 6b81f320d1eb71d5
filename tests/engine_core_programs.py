"""Running generated programs through an engine-core check, for the real-engine test modules:
all of them must pass, or the first violations of a seeded bug are collected."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TypeVar

import pytest

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, core_program
from spec.ar.config import validate_ar_request

RunT = TypeVar("RunT")


def passing_runs(seeds: int, run: Callable[[int], RunT], label: str = "") -> list[RunT]:
    """`run(seed)` for seeds 0..seeds-1, every one passing: otherwise the test fails, saying how
    many programs broke a rule and quoting the first three. Returns the runs."""
    runs: list[RunT] = []
    failures: list[str] = []
    for seed in range(seeds):
        try:
            runs.append(run(seed))
        except EngineCoreViolation as err:
            failures.append(f"seed {seed}: {err}")
    if failures:
        pytest.fail(
            f"{label}{len(failures)} of {seeds} programs fail; first: {failures[:3]}",
            pytrace=False,
        )
    return runs


def first_violations(
    seeds: int, run: Callable[[int], object], *, until: str | None = None
) -> dict[str, str]:
    """The first message of each rule `run(seed)` breaks over seeds 0..seeds-1, stopping once
    rule `until` is broken (None: once any is)."""
    seen: dict[str, str] = {}
    for seed in range(seeds):
        try:
            run(seed)
        except EngineCoreViolation as err:
            seen.setdefault(err.rule, str(err))
            if until is None or until in seen:
                break
    return seen


def assert_requests_valid(generate: Callable[[int], CoreProgram], seeds: Iterable[int]) -> None:
    """Every request of `generate(seed)` is valid for its program's configuration."""
    for seed in seeds:
        program = generate(seed)
        for batch in program.arrivals:
            for request in batch:
                validate_ar_request(program.config, request)


def assert_only_prompts_differ(
    generate: Callable[[int], CoreProgram], seeds: Iterable[int]
) -> None:
    """`generate(seed)` is `core_program(seed)` but for its requests' prompts: the same
    configuration, aborts, and every request's other fields."""
    for seed in seeds:
        drawn, changed = core_program(seed), generate(seed)
        assert changed.config == drawn.config and changed.aborts == drawn.aborts, seed
        for before, after in zip(drawn.arrivals, changed.arrivals, strict=True):
            assert [replace(r, prompt=None) for r in before] == [
                replace(r, prompt=None) for r in after
            ], seed
