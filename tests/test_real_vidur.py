"""Vidur's REAL replica schedulers (vidur 0.0.25: the five of the issue and Mnemosyne FCFS with
a fixed chunk) under the AR spec.

Needs `schedspec install-engines vidur`; without it every engine test fails naming that
command, unless SCHEDSPEC_SKIP_ENGINES=1 (then they are skipped with that reason).

Findings (docs/engines/vidur.md, "Vidur"): each is a regression test that FAILS with its rule on
the real class and PASSES with Vidur's files edited the way its fix would go
(`integrations.vidur.fixes`: the edited files run, their changed methods put on Vidur's classes
for the test; `scripts/engine_fixes_diff.py vidur` prints the edits as a patch):

- FasterTransformer frees finished requests only when their whole batch ends (and, with the
  batch regenerated without them, never): terminal_holds_nothing;
- LightLLM admits only when the peak is strictly below the pool: a request whose peak equals
  the pool is never admitted (progress); it also counts a one-token request's peak one token
  too high (progress). Both are LightLLM's own, whose router refuses such a request at arrival;
  the finding is that Vidur accepts it (outside the profile's space, which keeps to requests
  LightLLM accepts: the released scheduler passes there);
- Orca (and FasterTransformer, same base class) reserves max_model_len // block_size blocks:
  too few when max_model_len is not a multiple of the block size (kv_covers_scheduled);
- vidur 0.0.25's `Request.restart()` keeps its pipeline-stage counters: the restarted request
  raises AssertionError at its next batch (implementation_error; the adapter repairs it by
  default, see integrations/vidur/adapter.py);
- Mnemosyne asserts at the end of every prefill (implementation_error), keeps the blocks of a
  request it skips for lack of tokens (waiting_holds_nothing), and lists a KV-parallel
  batch's requests in address order (its decode order and victims change from run to run);
- vLLM, Sarathi and Mnemosyne accept a request that fits the pool only below the watermark and
  never admit or refuse it (progress; open, no fix here).

Then each scheduler passes the suite under its profile: Sarathi as it is, the others with
their findings patched.

On purpose, and declared: Vidur's vLLM demands a free block for a decode that needs none, and
at an exact fit restarts the request and forms an empty batch, as vLLM v0 does
(`preemption_may_empty_step`; its edit `vllm-decode-block` remains, the idealisation the twins
follow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from integrations.manifest import EngineNotInstalled
from integrations.vidur import (
    MANIFEST,
    REAL_VIDUR_FT,
    REAL_VIDUR_LIGHTLLM,
    REAL_VIDUR_MNEMOSYNE,
    REAL_VIDUR_ORCA,
    REAL_VIDUR_SARATHI,
    REAL_VIDUR_VLLM,
    build,
)
from integrations.vidur.adapter import VidurAdapter
from integrations.vidur.fixes import DEFAULT_FIXES, FIXES_OF, VIDUR_FIXES, vidur_fixed
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from reference.ar import vidur as reference_vidur
from reference.ar.mnemosyne import VIDUR_MNEMOSYNE, VIDUR_MNEMOSYNE_ONE_QUEUE
from reference.ar.vidur_released import VIDUR_SARATHI_RELEASED, VIDUR_VLLM_RELEASED
from spec.ar.config import ArConfig, ArRequest, ArRules
from spec.ar.decisions import StepDecision, first_difference, step_decisions
from spec.ar.events import ArBlocksFreed, ArFinished
from spec.ar.profile import ArPolicy
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from spec.profile import ConfigOutsideProfile
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script
from tests.test_ar_mnemosyne import (
    WATERMARK,
    WATERMARK_REQUESTS,
    decisions,
    queue_decisions,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vidur() -> Any:
    """Vidur's real classes; fails naming the install command when it is not installed."""
    if not MANIFEST.installed():
        if os.environ.get("SCHEDSPEC_SKIP_ENGINES") == "1":
            pytest.skip("SCHEDSPEC_SKIP_ENGINES=1: real engines are not checked")
        pytest.fail(
            f"Vidur is not installed: run `schedspec install-engines vidur` "
            f"(installs into {MANIFEST.directory})"
        )
    MANIFEST.activate()
    from integrations.vidur import engine

    return engine.load()


def harness(impl: ArImplementation, config: ArConfig) -> ArHarness:
    return ArHarness(impl.factory, config, policy=impl.profile.policy)


def violation(h: ArHarness, *requests: ArRequest, steps: int = 0) -> SpecViolation | None:
    """Submit `requests`, make `steps` steps one at a time (each followed by the between-steps
    checks), drain, and return the violation (None: the run conformed)."""
    try:
        for r in requests:
            h.guarded("submit", h.submit, r)
        for _ in range(steps):
            h.guarded("step", h.step)
        h.guarded("drain", h.drain, 50)
    except SpecViolation as v:
        return v
    return None


def suite(
    impl: ArImplementation,
    examples: int,
    ignored: frozenset[str] = frozenset(),
    twin: ArImplementation | None = None,
    shrink: bool = True,
) -> SpecViolation | BaseException | None:
    """Run the AR conformance suite on `impl` under its profile (with `twin`: every example
    ends with that decision twin, rule `twin_decisions`); the failure, or None."""
    base = ar_conformance_machine(
        impl.factory,
        profile=impl.profile,
        twin=twin.factory if twin else None,
        twin_policy=twin.profile.policy if twin else None,
    )
    accepted = frozenset(d.rule for d in impl.profile.deviations)
    machine = type(
        base.__name__, (base,), {"ignored_rules": accepted | ignored, "ignored_hits": {}}
    )
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=25,
                deadline=None,
                derandomize=True,
                database=None,
                phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
                suppress_health_check=list(HealthCheck),
            ),
        )
    except BaseException as err:  # SpecViolation, or an ExceptionGroup of several
        return err
    return None


def rules_of(err: BaseException | None) -> set[str]:
    if err is None:
        return set()
    if isinstance(err, SpecViolation):
        return {err.rule}
    if isinstance(err, BaseExceptionGroup):
        return set().union(*(rules_of(e) for e in err.exceptions))
    return {f"{type(err).__name__}: {err}"}


# --------------------------------------------------------------------------- fixes
@pytest.fixture
def patched(vidur: Any) -> Iterator[Callable[[str], None]]:
    """`patched(kind)` runs Vidur with the fixes of `kind`'s findings (`FIXES_OF`: edits of
    Vidur's own files, `integrations.vidur.fixes`) until the test ends."""
    with contextlib.ExitStack() as stack:

        def apply(kind: str) -> None:
            stack.enter_context(vidur_fixed(FIXES_OF[kind]))

        yield apply


def cfg(**kw: Any) -> ArConfig:
    base: dict[str, Any] = {
        "reserve_null_block": False,
        "enable_chunked_prefill": False,
        "max_num_seqs": 2,
    }
    base.update(kw)
    return ArConfig(**base)


# --------------------------------------------------------------------------- plumbing
def test_importing_the_package_does_not_import_vidur() -> None:
    code = "import sys, integrations.vidur; assert 'vidur' not in sys.modules, 'imported vidur'"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr


def test_not_installed_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(tmp_path))
    with pytest.raises(EngineNotInstalled, match="schedspec install-engines vidur"):
        REAL_VIDUR_VLLM.factory(cfg(block_size=2, num_blocks=8, max_num_batched_tokens=32), print)


def test_configurations_outside_the_profile_are_refused_by_field() -> None:
    with pytest.raises(ConfigOutsideProfile, match="block_size"):
        build("lightllm", cfg(block_size=2, num_blocks=8, max_num_batched_tokens=32), print)
    with pytest.raises(ConfigOutsideProfile, match="num_blocks"):
        small = cfg(block_size=2, num_blocks=3, max_num_batched_tokens=32, max_model_len=16)
        build("orca", small, print)
    with pytest.raises(ConfigOutsideProfile, match="enable_chunked_prefill"):
        build("vllm", cfg(block_size=2, num_blocks=8, enable_chunked_prefill=True), print)


def test_every_scheduler_serves_a_simple_workload(vidur: Any) -> None:
    for impl in (REAL_VIDUR_VLLM, REAL_VIDUR_SARATHI, REAL_VIDUR_ORCA, REAL_VIDUR_FT):
        h = harness(
            impl,
            cfg(
                block_size=2,
                num_blocks=12,
                max_num_batched_tokens=16,
                max_model_len=8,
                enable_chunked_prefill=impl is REAL_VIDUR_SARATHI,
            ),
        )
        # Orca records no context for a request it admits (its finding, batch_context)
        with vidur_fixed(["orca-batch-context"] if impl is REAL_VIDUR_ORCA else []):
            assert violation(h, *(ArRequest(f"r{i}", 3, 5) for i in range(3))) is None
        assert h.outputs() == {"r0": 5, "r1": 5, "r2": 5}
        assert h.impl.snapshot().held_blocks() == 0
    h = harness(
        REAL_VIDUR_LIGHTLLM,
        cfg(block_size=1, num_blocks=12, max_num_batched_tokens=16, max_model_len=8),
    )
    assert violation(h, ArRequest("a", 2, 3, stop_after=2), ArRequest("b", 4, 2)) is None
    assert h.outputs() == {"a": 2, "b": 2}


def test_abort_frees_through_vidurs_own_free(vidur: Any) -> None:
    h = harness(
        REAL_VIDUR_VLLM, cfg(block_size=2, num_blocks=8, max_num_batched_tokens=16, max_model_len=8)
    )
    h.submit(ArRequest("a", 3, 4))
    h.submit(ArRequest("b", 3, 4))
    h.step()
    assert h.impl.snapshot().held_blocks() == 4
    assert h.abort("a") is None
    assert h.impl.snapshot().held_blocks() == 2
    assert h.abort("a") is not None  # an ended request is refused
    assert violation(h) is None
    assert h.outputs() == {"b": 4}


def test_an_abort_that_leaves_a_batch_of_finished_requests_drops_it(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """Found by the suite at 4,000 examples (2026-11-25), in the adapter: FasterTransformer runs
    a batch until all its requests are done. `r1` finished in the first batch, then `r0`, the
    one left running, was aborted; the adapter took `r0` out of the preempted batch but kept
    the batch, holding only a finished request, so the next step popped it, built no batch and
    scheduled nothing with `r2` waiting (`[progress]`). Vidur never has such a batch: one whose
    requests all completed is freed at its end. The adapter now drops it the same way."""
    patched("ft")
    config = cfg(block_size=3, num_blocks=12, max_num_batched_tokens=17, max_model_len=17)
    h = harness(REAL_VIDUR_FT, config)
    h.submit(ArRequest("r0", 1, 2))
    h.submit(ArRequest("r1", 1, 1))
    h.step()
    assert h.abort("r0") is None
    h.submit(ArRequest("r2", 1, 1))
    assert violation(h) is None
    assert h.outputs() == {"r1": 1, "r2": 1}


def test_an_abort_that_ends_a_batch_frees_its_earlier_finishers(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """Under `ft-free-at-batch-end`: `a` finishes after step 0 and is carried in
    `_pending_free_map` by the batch formed again; `b` finishes after step 1; aborting `c`, the
    last running, ends the batch, so the adapter drops it and frees `b` and the carried `a`."""
    patched("ft")
    config = cfg(block_size=2, num_blocks=12, max_num_seqs=3, max_model_len=8)
    h = harness(REAL_VIDUR_FT, config)
    for request in (ArRequest("a", 2, 1), ArRequest("b", 2, 2), ArRequest("c", 2, 4)):
        h.submit(request)
    h.step()
    h.step()
    assert h.spec.state().requests["a"].blocks, "a keeps its blocks while its batch runs"
    assert h.abort("c") is None
    assert violation(h) is None
    assert h.outputs() == {"a": 1, "b": 2}
    assert h.spec.free_blocks == 12


# --------------------------------------------------------------------------- findings
FT_HOLD = cfg(block_size=2, num_blocks=8, max_num_batched_tokens=8, max_model_len=8)
FT_BATCH = (ArRequest("short", 2, 1), ArRequest("long", 2, 3))


def test_ft_keeps_finished_requests_blocks(vidur: Any, patched: Callable[[str], None]) -> None:
    """`short` finishes after one step, `long` two steps later. FasterTransformer holds a
    batch's blocks until the whole batch ends, which its profile declares (`free_at_batch_end`);
    Vidur 0.0.25 then frees only `long`, the request of the batch formed again without
    `short`. With `ft-free-at-batch-end` (in `FIXES_OF["ft"]`), `short` is freed at the batch's
    end too."""
    found = violation(harness(REAL_VIDUR_FT, FT_HOLD), *FT_BATCH)
    assert found is not None and found.rule == "terminal_holds_nothing", found
    assert "finished 'short' still holds blocks [0, 1, 2, 3] after its static batch ended" in str(
        found
    )
    patched("ft")
    assert violation(harness(REAL_VIDUR_FT, FT_HOLD), *FT_BATCH) is None


@pytest.mark.parametrize("fix", ["ft-free-at-batch-end", "ft-free-on-finish"])
def test_ft_batch_end_hold_is_declared(vidur: Any, fix: str) -> None:
    """The faithful fix keeps the hold: without the declaration it breaks
    `terminal_holds_nothing` at `short`'s finish; the alternative (`ft-free-on-finish`) passes
    under both. Under the faithful fix `short`'s blocks are freed in the update
    phase of `long`'s last step, as Vidur's `on_batch_end` frees the batch."""
    assert REAL_VIDUR_FT.profile.policy.rules is not None
    declared = REAL_VIDUR_FT.profile.policy.rules
    assert declared.free_at_batch_end
    undeclared = ArPolicy(rules=dataclasses.replace(declared, free_at_batch_end=False))
    with vidur_fixed([fix, "reservation-ceil"]):
        h = harness(REAL_VIDUR_FT, FT_HOLD)
        assert violation(h, *FT_BATCH) is None
        events = h.events
        strict = ArHarness(REAL_VIDUR_FT.factory, FT_HOLD, policy=undeclared)
        found = violation(strict, *FT_BATCH)
    freed_short = [i for i, e in enumerate(events) if e == ArBlocksFreed("short", (0, 1, 2, 3))]
    finished = {e.request_id: i for i, e in enumerate(events) if isinstance(e, ArFinished)}
    if fix == "ft-free-on-finish":
        assert found is None, found
        assert freed_short and freed_short[0] < finished["short"]
    else:
        assert found is not None and found.rule == "terminal_holds_nothing", found
        assert "'short' finished still holding blocks [0, 1, 2, 3]" in str(found)
        assert freed_short and finished["short"] < freed_short[0] < finished["long"]


def test_lightllm_never_admits_a_request_whose_peak_equals_the_pool(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """The strict `<` is LightLLM's own (`req_queue.py`), and LightLLM's router refuses this
    request at arrival (3 + 4 + 1 > 6); Vidur accepts it, and it waits for ever. Outside the
    profile's space, which keeps to requests LightLLM accepts."""
    # peak: 3 prompt + 4 outputs - 1 = 6 tokens = the whole pool of 6 (block size 1)
    config = cfg(block_size=1, num_blocks=6, max_num_batched_tokens=8, max_model_len=8)
    assert REAL_VIDUR_LIGHTLLM.profile.space.outside(config) is not None
    found = violation(harness(REAL_VIDUR_LIGHTLLM, config), ArRequest("r0", 3, 4))
    assert found is not None and found.rule == "progress", found
    patched("lightllm")
    h = harness(REAL_VIDUR_LIGHTLLM, config)
    assert violation(h, ArRequest("r0", 3, 4)) is None
    assert h.outputs() == {"r0": 4}


def test_lightllm_overcounts_a_one_token_request(vidur: Any) -> None:
    """Counting a queued request as prompt + 1 is LightLLM's own (`io_struct.py`,
    `get_tuple_tokens`), and its router refuses this request (3 + 1 + 1 > 3); Vidur accepts it,
    and it waits for ever. Outside the profile's space."""
    # 3 prompt tokens and 1 output need 3 tokens of KV: the whole pool of 3; Vidur counts 4
    config = cfg(block_size=1, num_blocks=3, max_num_batched_tokens=4, max_model_len=4)
    assert REAL_VIDUR_LIGHTLLM.profile.space.outside(config) is not None
    with vidur_fixed(["lightllm-admit-at-peak"]):  # the strict `<` alone does not explain it
        found = violation(harness(REAL_VIDUR_LIGHTLLM, config), ArRequest("r0", 3, 1))
    assert found is not None and found.rule == "progress", found
    with vidur_fixed(["lightllm-admit-at-peak", "lightllm-one-token-peak"]):
        assert violation(harness(REAL_VIDUR_LIGHTLLM, config), ArRequest("r0", 3, 1)) is None


def test_vllms_needless_restart_is_vllm_v0s_and_declared(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """Vidur's vLLM demands a free block for every decode, needed or not, and with none
    restarts the request, forming an empty batch: vLLM v0's `can_append_slot` and recompute
    (vllm 0.2.7, `vllm/core/block_manager.py:143-148`, `vllm/core/scheduler.py:219-232`), so
    on purpose. Its profile declares it (`preemption_may_empty_step`): the release passes; the
    idealised rules call the empty step a stall; `vllm-decode-block`, the idealisation the
    twins follow, decodes instead."""
    # 3 prompt tokens take both blocks of 2; the decode of the 4th token fits them exactly
    config = cfg(
        block_size=2, num_blocks=2, max_num_batched_tokens=5, max_model_len=5, max_num_seqs=1
    )
    policy = REAL_VIDUR_VLLM.profile.policy
    assert policy.rules is not None and policy.rules.preemption_may_empty_step
    h = harness(REAL_VIDUR_VLLM, config)
    assert violation(h, ArRequest("r0", 3, 2)) is None
    assert any(type(e).__name__ == "ArPreempted" for e in h.events)
    idealised = dataclasses.replace(policy, rules=ArRules())
    h = ArHarness(REAL_VIDUR_VLLM.factory, config, policy=idealised)
    found = violation(h, ArRequest("r0", 3, 2))
    assert found is not None and found.rule == "progress", found
    patched("vllm")
    h = harness(REAL_VIDUR_VLLM, config)
    assert violation(h, ArRequest("r0", 3, 2)) is None
    assert not any(type(e).__name__ == "ArPreempted" for e in h.events)


@pytest.mark.parametrize("impl", [REAL_VIDUR_ORCA, REAL_VIDUR_FT], ids=["orca", "ft"])
def test_max_model_len_reservation_is_floored(
    vidur: Any, patched: Callable[[str], None], impl: ArImplementation
) -> None:
    # max_model_len 7, block size 4: Vidur reserves 7 // 4 = 1 block; 6 prompt tokens need 2
    config = cfg(block_size=4, num_blocks=2, max_num_batched_tokens=8, max_model_len=7)
    # Orca's other finding, the contexts it does not record (batch_context), would come first
    with vidur_fixed(["orca-batch-context"] if impl is REAL_VIDUR_ORCA else []):
        found = violation(harness(impl, config), ArRequest("r0", 6, 1))
    assert found is not None and found.rule == "kv_covers_scheduled", found
    patched("orca" if impl is REAL_VIDUR_ORCA else "ft")
    assert violation(harness(impl, config), ArRequest("r0", 6, 1)) is None


def test_restart_keeps_stage_counters(vidur: Any) -> None:
    """Without the adapter's repair, Vidur's own Request crashes at a restarted request's next
    batch (AssertionError, reported as implementation_error)."""
    config = cfg(
        block_size=1,
        num_blocks=5,
        max_num_batched_tokens=3,
        max_model_len=5,
        enable_chunked_prefill=True,
    )
    reqs = (ArRequest("r0", 1, 3), ArRequest("r1", 3, 2))

    def run(fix: bool) -> SpecViolation | None:
        def make(config: ArConfig, sink: Any) -> Any:
            adapter = build("sarathi", config, sink)
            adapter.fix_restart = fix  # type: ignore[attr-defined]
            return adapter

        h = ArHarness(make, config, policy=REAL_VIDUR_SARATHI.profile.policy)
        return violation(h, *reqs)

    found = run(fix=False)
    assert found is not None and found.rule == "implementation_error", found
    assert "AssertionError" in str(found)
    assert run(fix=True) is None


def test_the_fixes_are_a_patch_of_vidurs_files(
    vidur: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every fix as one patch (`scripts/engine_fixes_diff.py vidur`): `git apply -p1` makes
    exactly the edited files the tests run; FasterTransformer's edited `on_batch_end` keeps
    its `super()` call, which reaches Vidur's own base class."""
    assert load_script("engine_fixes_diff").main(["vidur"]) == 0
    diff = capsys.readouterr().out
    assert diff == VIDUR_FIXES.as_diff(DEFAULT_FIXES)
    assert set(VIDUR_FIXES.names) - set(DEFAULT_FIXES) == {"ft-free-on-finish"}
    sources = VIDUR_FIXES.fixed_sources(DEFAULT_FIXES)
    assert len(sources) == 8
    patched = git_apply_to_copies(tmp_path, sources, diff)
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    ft = vidur.schedulers["ft"]
    original = vars(ft)["on_batch_end"]
    with vidur_fixed(["ft-free-on-finish"]):
        edited = vars(ft)["on_batch_end"]
        assert edited is not original
        assert edited.__closure__ is not None and edited.__closure__[0].cell_contents is ft
    assert vars(ft)["on_batch_end"] is original


def test_mnemosyne_crashes_at_the_end_of_every_prefill(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """vidur 0.0.25's Mnemosyne asserts that a request's prefill is incomplete whenever it
    counts its processed tokens without sequence pipeline parallelism, which `on_batch_end`
    does right after a prefill completes: Vidur's own AssertionError at the first prefill.
    0.0.26 dropped the assertion; `mnemosyne-prefill-assert` drops it here."""
    config = cfg(
        block_size=2,
        num_blocks=8,
        max_num_batched_tokens=4,
        max_model_len=8,
        enable_chunked_prefill=True,
    )
    found = violation(harness(REAL_VIDUR_MNEMOSYNE, config), ArRequest("r0", 1, 2))
    assert found is not None and found.rule == "implementation_error", found
    assert "AssertionError" in str(found)
    with vidur_fixed(["mnemosyne-prefill-assert"]):
        h = harness(REAL_VIDUR_MNEMOSYNE, config)
        assert violation(h, ArRequest("r0", 1, 2)) is None
        assert h.outputs() == {"r0": 2}


# two blocks of one token for r0's prompt, one for r1's; a chunk of 2 tokens per batch
MNEMOSYNE_SKIP_REQUESTS = (ArRequest("r0", 2, 1), ArRequest("r1", 1, 1))
MNEMOSYNE_SKIP = cfg(
    block_size=1,
    num_blocks=3,
    max_num_batched_tokens=2,
    max_model_len=4,
    enable_chunked_prefill=True,
)


def test_mnemosyne_keeps_the_blocks_of_a_request_it_skips(vidur: Any) -> None:
    """Mnemosyne allocates a new request's whole prompt before it asks how many tokens the
    batch has left for it; with none left it skips the request, which stays queued holding
    the blocks (and a seat) without having computed anything."""
    with vidur_fixed(["mnemosyne-prefill-assert"]):
        h = harness(REAL_VIDUR_MNEMOSYNE, MNEMOSYNE_SKIP)
        found = violation(h, *MNEMOSYNE_SKIP_REQUESTS, steps=1)
    assert found is not None and found.rule == "waiting_holds_nothing", found
    assert "waiting 'r1' holds blocks" in str(found)
    with vidur_fixed(["mnemosyne-prefill-assert", "mnemosyne-skip-frees"]):
        h = harness(REAL_VIDUR_MNEMOSYNE, MNEMOSYNE_SKIP)
        assert violation(h, *MNEMOSYNE_SKIP_REQUESTS, steps=1) is None
        assert h.outputs() == {"r0": 1, "r1": 1}


def batch_keeps_its_order(vidur: Any) -> bool:
    """Whether the `KVParallelBatch` that Mnemosyne's own batch former makes of 64 requests,
    added as decodes of its one KV-parallel group in the reverse of their creation, lists them
    in the order they were added."""
    config = cfg(
        block_size=1,
        num_blocks=8,
        max_num_seqs=64,
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
    )
    adapter = build("mnemosyne", config, print)
    assert isinstance(adapter, VidurAdapter)
    tracker = adapter.scheduler._get_batch_formation_tracker()
    requests = [vidur.Request(float(i), 2, 2) for i in range(64)][::-1]
    for request in requests:
        tracker.add_request(request, 1, 1, [0])
    return list(tracker.get_batch().requests) == requests


def test_mnemosyne_orders_its_decodes_by_address(vidur: Any) -> None:
    """A `KVParallelBatch` lists its requests as a set does (`list(set(...))`), in the order of
    the objects' hashes, i.e. their addresses, not the order the scheduler added them; Mnemosyne
    re-queues its decodes in that order (`on_batch_end`), so which decodes first and which is
    preempted changes from run to run of the same program. Added in the reverse of their
    creation, 64 requests come out in another order; `mnemosyne-batch-order` keeps it."""
    assert not batch_keeps_its_order(vidur)
    with vidur_fixed(["mnemosyne-batch-order"]):
        assert batch_keeps_its_order(vidur)


def mnemosyne_queue_order(real: list[StepDecision]) -> dict[str, object]:
    """How the real Mnemosyne's decisions on `QUEUE_REQUESTS` compare with the two references:
    step 2's tokens and whether each reference decides alike throughout."""
    return {
        "step2": [list(p) for p in real[2].scheduled],
        "new": first_difference(real, queue_decisions(VIDUR_MNEMOSYNE)) is None,
        "one": first_difference(real, queue_decisions(VIDUR_MNEMOSYNE_ONE_QUEUE)) is None,
    }


def test_mnemosyne_0025_reads_partial_prefills_among_the_waiting(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """0.0.25 puts a request between prefill chunks back in its one request queue, sorted by
    arrival: in step 2 r1, which arrived first, takes the whole chunk before r2 finishes its
    prefill, as `vidur-mnemosyne-one-queue` decides and `vidur-mnemosyne` (0.0.26's
    partial-prefill queue, read first) does not."""
    patched("mnemosyne")
    found = mnemosyne_queue_order(queue_decisions(REAL_VIDUR_MNEMOSYNE))
    assert found == {"step2": [["r1", 2]], "new": False, "one": True}, found


def test_mnemosyne_continues_a_prefill_below_the_watermark(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """With no block free (watermark 1), the fixed real class runs r1's next chunk, as the
    reference does; the reference skipped it until the review of 2026-11-26 (the twin runs of
    the suite never reach a watermark: their pools are under 100 blocks)."""
    patched("mnemosyne")
    real = decisions(REAL_VIDUR_MNEMOSYNE, WATERMARK, WATERMARK_REQUESTS)
    assert real[6].scheduled == (("r0", 1), ("r1", 9))
    ours = decisions(VIDUR_MNEMOSYNE_ONE_QUEUE, WATERMARK, WATERMARK_REQUESTS)
    assert first_difference(real, ours) is None


# --------------------------------------------------------------------------- the watermark
def test_the_watermark_is_a_fraction_of_the_usable_blocks(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """Vidur has no null block: the adapter hands it the usable blocks, and its watermark is
    int(0.01 * those). With 100 blocks, the null block reserved, it is int(0.99) = 0, so a
    request needing all 99 usable blocks is admitted. Until 2026-11-26 the spec took the
    fraction of all 100 (watermark 1) and reported admission_watermark on Vidur's vLLM,
    Sarathi and Mnemosyne."""
    config = cfg(
        block_size=1,
        num_blocks=100,
        reserve_null_block=True,
        max_num_batched_tokens=128,
        max_model_len=128,
    )
    assert REAL_VIDUR_VLLM.profile.policy.watermark_blocks(config) == 0
    for kind, impl, chunked in (
        ("vllm", REAL_VIDUR_VLLM, False),
        ("mnemosyne", REAL_VIDUR_MNEMOSYNE, True),
    ):
        patched(kind)
        c = config.replace(enable_chunked_prefill=chunked)
        assert violation(harness(impl, c), ArRequest("a", 99, 1)) is None, kind


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "mnemosyne"])
def test_a_request_that_fits_only_below_the_watermark_waits_for_ever(
    vidur: Any, patched: Callable[[str], None], kind: str
) -> None:
    """Open in Vidur: a request whose prompt needs more blocks than the pool less the watermark
    (here all 100, watermark 1) is accepted, never admitted (`_can_allocate_request` /
    `_can_allocate_blocks`) and never refused, so the replica idles with it queued and Vidur's
    simulation ends without it. vLLM v0's block manager refused it (`AllocStatus.NEVER`: the
    request can never be allocated). One request short of it (99 blocks) is served."""
    patched(kind)
    impl = REAL_AND_REFERENCE[kind][0]
    config = cfg(
        block_size=1,
        num_blocks=100,
        max_num_batched_tokens=128,
        max_model_len=128,
        enable_chunked_prefill=kind != "vllm",
    )
    found = violation(harness(impl, config), ArRequest("a", 100, 1))
    assert found is not None and found.rule == "progress", found
    assert "step 0 scheduled nothing with 0 running and 1 waiting" in str(found), found
    assert violation(harness(impl, config), ArRequest("a", 99, 1)) is None


# --------------------------------------------------------------------------- suites
# each real class with the project's re-implementation of it
REAL_AND_REFERENCE = {
    "vllm": (REAL_VIDUR_VLLM, reference_vidur.VIDUR_VLLM),
    "sarathi": (REAL_VIDUR_SARATHI, reference_vidur.VIDUR_SARATHI),
    "orca": (REAL_VIDUR_ORCA, reference_vidur.VIDUR_ORCA),
    "lightllm": (REAL_VIDUR_LIGHTLLM, reference_vidur.VIDUR_LIGHTLLM),
    "ft": (REAL_VIDUR_FT, reference_vidur.VIDUR_FT),
    # 0.0.25's Mnemosyne keeps requests between prefill chunks in its one request queue
    "mnemosyne": (REAL_VIDUR_MNEMOSYNE, VIDUR_MNEMOSYNE_ONE_QUEUE),
}
# the re-implementation each fixed real class decides as, step by step: its reference, or,
# where that deviates on purpose (vLLM, Sarathi), the one that decides as the releases do
DECISION_TWIN = {
    **{kind: reference for kind, (_, reference) in REAL_AND_REFERENCE.items()},
    "vllm": VIDUR_VLLM_RELEASED,
    "sarathi": VIDUR_SARATHI_RELEASED,
}


def test_ft_suite_fails_with_its_two_findings(vidur: Any) -> None:
    # as it is, the suite stops at one of FasterTransformer's two findings (the floored
    # reservation usually comes first); with that one set aside, at terminal_holds_nothing
    plain = rules_of(suite(REAL_VIDUR_FT, 40))
    assert plain and plain <= {"kv_covers_scheduled", "terminal_holds_nothing"}, plain
    err = suite(REAL_VIDUR_FT, 40, ignored=frozenset({"kv_covers_scheduled"}))
    assert rules_of(err) == {"terminal_holds_nothing"}, err


@pytest.mark.parametrize("impl", [REAL_VIDUR_SARATHI, REAL_VIDUR_VLLM, REAL_VIDUR_LIGHTLLM])
def test_released_schedulers_pass_the_suite_under_their_profiles(
    vidur: Any, impl: ArImplementation
) -> None:
    """As released: Sarathi; vLLM, whose needless restart its profile declares (vLLM v0's);
    LightLLM inside its space, the requests LightLLM's router accepts."""
    err = suite(impl, 100)
    assert err is None, err


@pytest.mark.parametrize("kind", ["vllm", "orca", "lightllm", "ft", "mnemosyne"])
def test_patched_schedulers_pass_the_suite(
    vidur: Any, patched: Callable[[str], None], kind: str
) -> None:
    patched(kind)
    err = suite(REAL_AND_REFERENCE[kind][0], 50)
    assert err is None, err


# --------------------------------------------------------------------------- differential
def programs(kind: str, count: int, seed: int) -> Iterator[tuple[ArConfig, list[ArRequest]]]:
    """Seeded configurations inside `kind`'s profile and bursts of valid requests."""
    import random

    rng = random.Random(seed)
    for _ in range(count):
        bs = 1 if kind == "lightllm" else rng.choice([1, 2, 3, 4])
        mml = rng.randint(4, 16)
        seqs = rng.randint(1, 4)
        # a max_model_len reservation always fits the pool (LightLLM's: one token more)
        one = -(-(mml + (1 if kind == "lightllm" else 0)) // bs)
        config = cfg(
            block_size=bs,
            num_blocks=rng.randint(one, 2 * one + 1),
            max_num_batched_tokens=rng.randint(max(seqs, mml), 2 * mml),
            max_num_seqs=seqs,
            max_model_len=mml,
            max_waiting_iters=rng.randint(1, 4),
            enable_chunked_prefill=kind == "sarathi",
        )
        reqs = []
        for i in range(rng.randint(1, 6)):
            prompt = rng.randint(1, mml - 1)
            reqs.append(ArRequest(f"r{i}", prompt, rng.randint(1, mml - prompt)))
        yield config, reqs


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "orca", "lightllm", "ft"])
def test_reference_is_decision_identical_to_the_patched_real_class(
    vidur: Any, patched: Callable[[str], None], kind: str
) -> None:
    """The project's reference (reference.ar.vidur), which deliberately deviates from Vidur
    where Vidur is wrong, makes the same decisions as the real class with those findings
    fixed, step by step, on 100 seeded programs. (vLLM and Sarathi differ from it on purpose,
    docs/engines/vidur.md; they are compared with `vidur-<kind>-released`.)"""
    make_ref = DECISION_TWIN[kind].factory
    patched(kind)
    compared = 0
    for config, reqs in programs(kind, 100, seed=11):
        runs = []
        for make in (lambda c, s: build(kind, c, s), make_ref):
            events: list[Any] = []
            adapter = make(config, events.append)
            for r in reqs:
                adapter.submit(r)
            adapter.drain(500)
            runs.append(step_decisions(events))
        assert runs[0] == runs[1], (config, reqs)
        compared += 1
    assert compared == 100


@pytest.mark.parametrize("kind", ["vllm", "sarathi", "orca", "lightllm", "ft", "mnemosyne"])
def test_patched_real_classes_decide_as_the_reference_on_every_example(
    vidur: Any, patched: Callable[[str], None], kind: str
) -> None:
    """The decision identity above, on the suite's generated programs instead of 100 seeded
    bursts: every example of the AR suite on the patched real class ends by running its
    operations through its re-implementation (`DECISION_TWIN`: `vidur-<kind>`; for vLLM and
    Sarathi `vidur-<kind>-released`; for Mnemosyne on 0.0.25 `vidur-mnemosyne-one-queue`),
    which must decide alike step by step (rule `twin_decisions`; `properties.ar.decisions`).
    1,000 examples each passed once (Mnemosyne, vLLM and Sarathi: 2,000, 2026-11-26)."""
    patched(kind)
    real = REAL_AND_REFERENCE[kind][0]
    assert suite(real, 60, twin=DECISION_TWIN[kind]) is None


@pytest.mark.parametrize("kind", ["vllm", "sarathi"])
def test_vidurs_vllm_and_sarathi_differ_from_the_reference_on_purpose(
    vidur: Any, patched: Callable[[str], None], kind: str
) -> None:
    """The two documented differences (docs/engines/vidur.md): Vidur 0.0.25's vLLM sums a batch's
    prefill tokens where the reference pads, so it schedules more at once; its Sarathi
    restarts a decode that needs no block when none is free, which the reference does not. The
    twin sees each, with its fixes applied, in the tokens scheduled (Sarathi's restart
    recomputes the decode's whole context; shrunk, the same restart shows as a preemption the
    twin does not make). `vidur-<kind>-released` makes neither deviation: the test above."""
    patched(kind)
    real, twin = REAL_AND_REFERENCE[kind]
    err = suite(real, 300, twin=twin, shrink=False)  # the first difference is enough here
    assert isinstance(err, SpecViolation) and err.rule == "twin_decisions", err
    assert re.match(r"\[twin_decisions\] step \d+: the implementation schedules ", str(err)), err


def test_lightllm_peak_counts_the_length_the_request_will_produce(
    vidur: Any, patched: Callable[[str], None]
) -> None:
    """Found by the decision twin at 1,000 examples (2026-11-25): Vidur knows each request's
    output length in advance, and LightLLM's peak-memory admission counts with it. `r4` (one
    prompt token, max_tokens 2, a stop token after its first output) will produce one token,
    so its peak is its prompt and, after one decode batch of `r3` (max_waiting_iters=1), it is
    admitted beside `r3` in step 5. The reference counted max_tokens, found no room and
    decoded `r3` again."""
    from reference.ar.vidur import VIDUR_LIGHTLLM
    from spec.ar.decisions import first_difference

    patched("lightllm")
    config = cfg(
        block_size=1, num_blocks=4, max_num_batched_tokens=4, max_model_len=4, max_waiting_iters=1
    )
    runs = []
    for impl in (REAL_VIDUR_LIGHTLLM, VIDUR_LIGHTLLM):
        h = harness(impl, config)
        for i, most in enumerate((1, 1, 1, 3)):
            h.submit(ArRequest(f"r{i}", 1, most, arrival_time=float(i + 1)))
            h.step()
        h.submit(ArRequest("r4", 1, 2, stop_after=1, arrival_time=5.0))
        h.drain()
        runs.append(step_decisions(h.events))
    assert runs[0][5].scheduled == (("r4", 1),), runs[0]
    assert first_difference(runs[0], runs[1]) is None


def test_the_verify_json_names_the_engine_release_it_checked(vidur: Any, tmp_path: Path) -> None:
    """A CI artifact must say which release of the engine passed: each real engine's result
    carries `engine` (name and release); the project's own implementations carry none."""
    from schedspec_cli.main import main

    out = tmp_path / "v.json"
    argv = ["verify", "--impl", "real-vidur-sarathi", "--impl", "reference-dllm"]
    assert main([*argv, "--examples", "2", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert results[0]["engine"] == {"name": "vidur", "version": MANIFEST.version}
    assert "engine" not in results[1]
