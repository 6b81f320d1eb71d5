"""vLLM's CPU encoder-cache offload (`ECCPUConnector`, role `ec_both`) in the engine-core loop
(`EncoderOptions(offload_blocks=N)`, `--encoder-offload N`): the scheduler saves every item the
GPU encoder cache books to a CPU region and loads an item the region holds instead of running
the encoder; the loop plays the worker (`integrations.vllm.encoder_offload`).

What is checked, beside the multimodal rules: `ec_load_content` (a load reads blocks holding
its item), `ec_save_lands` (a save names an item the step's encoder runs) and, once drained,
`ec_offload_settled` (once no request is left: nothing pinned or waiting for a save, no push
work). Released vLLM passes random programs; shared-prompt programs pass with the candidate fix
of the first finding; a seeded bug per rule fails them. Two findings, in 0.33.0 and 0.34.0:
booking the items a request encodes before those it loads lets an encoded item's save evict the
CPU entry a load of the same request is about to pin, so no load is sent and a save that never
lands is (`pin-loads-before-saves`); under the priority policy a request preempted in the step
that booked its items leaves their saves queued, never to land, at vLLM's own encoder cache size
(`tell-ec-connector-once-scheduled`, which lifts both).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.encoder_connector_fix import (
    ENCODER_CONNECTOR_FIXES,
    TELL_EC_CONNECTOR_ONCE_SCHEDULED,
)
from integrations.vllm.encoder_inputs import EncoderOptions
from integrations.vllm.encoder_load_order_fix import (
    ENCODER_LOAD_ORDER_FIXES,
    PIN_LOADS_BEFORE_SAVES,
)
from integrations.vllm.encoder_offload import EncoderOffload
from integrations.vllm.engine_core import CoreProgram, LoopOptions, core_program, run_loop
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.mm_upstream_fixes import WHOLE_PROMPT_UNDER_ENCODER_PRESSURE, fixed_upstream
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations, passing_runs
from tests.engine_gate import require_engine
from tests.patch_check import apply_fix_set
from tests.script_module import load_script
from tests.vllm_seeded_bugs import (
    ec_blocks_handed_out_twice,
    ec_load_reports_ignored,
    ec_loads_saved_again,
)

PROGRAMS = 40
#: A GPU encoder cache of two items and a CPU region of two: items leave the GPU cache and
#: come back from the region.
OFFLOAD = EncoderOptions(cache=6, offload_blocks=6)


def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _fixes(*names: str) -> Any:
    """The candidate fixes `names`, with 0.34.0's prompt change backported on 0.33.0 (its
    finding, a prompt split by encoder pressure, is not this one's)."""
    upstream = () if fixed_upstream() else (WHOLE_PROMPT_UNDER_ENCODER_PRESSURE,)
    return make_fixes([*upstream, *names])


def test_a_bad_region_size_is_a_typed_error() -> None:
    """Not a positive integer, or smaller than one item (vLLM's region asserts an item fits)."""
    for value in (0, True, "6"):
        with pytest.raises(ConfigError) as err:
            EncoderOptions(offload_blocks=value)  # type: ignore[arg-type]
        assert err.value.field == "offload_blocks", err.value
    with pytest.raises(ConfigError) as err:
        EncoderOptions(item_tokens=3, offload_blocks=2)
    assert "at least one item's embeddings (3)" in str(err.value)
    assert EncoderOptions(item_tokens=3, offload_blocks=3).offload_blocks == 3


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_released_vllm_offloads_and_reloads_items(async_scheduling: bool) -> None:
    """Random programs pass as released (0.34.0's prompt change backported on 0.33.0): the
    worker saves every item to the region. Their prompts share no item, so nothing loads back:
    shared prompts do (next test)."""
    _vllm()
    options = LoopOptions(encoder=OFFLOAD, fix=_fixes())
    runs = passing_runs(
        PROGRAMS,
        lambda seed: run_loop(
            core_program(seed), async_scheduling=async_scheduling, options=options
        ),
    )
    assert sum(r.encoder_saves for r in runs) > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_shared_prompts_offload_with_the_fix(async_scheduling: bool) -> None:
    """Shared-prompt programs (the same images in many requests) pass with the fix, and load
    more items than they save again."""
    _vllm()
    options = LoopOptions(encoder=OFFLOAD, fix=_fixes(PIN_LOADS_BEFORE_SAVES))
    runs = passing_runs(
        PROGRAMS,
        lambda seed: run_loop(
            shared_prompt_program(seed), async_scheduling=async_scheduling, options=options
        ),
    )
    assert sum(r.encoder_loads for r in runs) > 0


#: (seeded bug, the rule it fails, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], str, tuple[str, ...]]] = [
    (ec_blocks_handed_out_twice, "ec_load_content", ("which hold", "another item")),
    (ec_loads_saved_again, "ec_save_lands", ("the save never lands",)),
    (ec_load_reports_ignored, "ec_offload_settled", ("'pinned'", "never idles")),
]


@pytest.mark.parametrize(
    ("bug", "rule", "words"), SEEDED_BUGS, ids=[bug.__name__ for bug, _, _ in SEEDED_BUGS]
)
def test_the_checks_catch_each_seeded_offload_bug(
    bug: Callable[[Any], None], rule: str, words: tuple[str, ...]
) -> None:
    _vllm()
    options = LoopOptions(encoder=OFFLOAD, mutate=bug, fix=_fixes(PIN_LOADS_BEFORE_SAVES))

    def run(seed: int) -> object:
        return run_loop(shared_prompt_program(seed), async_scheduling=True, options=options)

    seen = first_violations(PROGRAMS, run, until=rule)
    assert rule in seen, seen
    assert all(w in seen[rule] for w in words), seen[rule]


#: The finding's shrunk program (docs/shrunk/vllm-encoder-load-order.json): r6 and r9 share a
#: prompt with items at [1, 4) and [7, 10); r8's item, between them, takes the region's oldest
#: entry (r6's first item). r9 then encodes its first item and loads its second: the encoded
#: item's save evicts the second item's entry before the load pins it.
LOAD_ORDER = CoreProgram(
    ArConfig(
        block_size=2,
        num_blocks=11,
        max_num_batched_tokens=6,
        max_num_seqs=1,
        max_model_len=18,
        enable_prefix_caching=True,
    ),
    arrivals=(
        (ArRequest("r6", 10, 1, prompt=tuple(range(100, 110))),),
        (ArRequest("r8", 17, 1), ArRequest("r9", 10, 1, prompt=tuple(range(100, 110)))),
    ),
    aborts=((), ()),
)


def test_a_save_evicts_the_entry_its_own_request_loads() -> None:
    """The finding: a save of an item the encoder does not run; the fix lifts it."""
    _vllm()
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(LOAD_ORDER, async_scheduling=False, options=LoopOptions(encoder=OFFLOAD))
    assert caught.value.rule == "ec_save_lands", caught.value
    assert "'image:107,108,109'" in str(caught.value)
    assert "it runs ['image:101,102,103']" in str(caught.value)
    fixed = LoopOptions(encoder=OFFLOAD, fix=make_fixes([PIN_LOADS_BEFORE_SAVES]))
    run = run_loop(LOAD_ORDER, async_scheduling=False, options=fixed)
    assert run.encoder_loads >= 1


def _skip_saves_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the loop's worker do as vLLM's does with a save of an item the step did not encode:
    nothing (no `ec_save_lands`), so the finding's consequences show."""
    save = EncoderOffload.save

    def save_what_ran(self: EncoderOffload, out: Any, ran: set[str], where: str) -> None:
        meta = out.ec_connector_metadata
        meta.saves = {h: b for h, b in meta.saves.items() if h in ran}
        save(self, out, ran, where)

    monkeypatch.setattr(EncoderOffload, "save", save_what_ran)


def test_the_save_that_never_lands_keeps_the_engine_stepping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its entry is never ready: once every request is done the connector still reports push
    work, and vLLM's engine steps for good."""
    _vllm()
    _skip_saves_not_run(monkeypatch)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(LOAD_ORDER, async_scheduling=False, options=LoopOptions(encoder=OFFLOAD))
    assert caught.value.rule == "ec_offload_settled", caught.value
    assert "{'image:107,108,109': 'not ready'}" in str(caught.value)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_load_never_sent_is_a_runner_miss(
    monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    """Where the runner was told to free the item before, the load never sent leaves it
    without: the step reading it is an "Encoder cache miss" (shared-prompt program 207, found
    by 300 programs with such a worker: 3 misses, 11 engines stepping for good)."""
    _vllm()
    _skip_saves_not_run(monkeypatch)
    options = LoopOptions(encoder=OFFLOAD, fix=_fixes())
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(shared_prompt_program(207), async_scheduling=async_scheduling, options=options)
    assert caught.value.rule == "encoder_output_ready", caught.value
    assert "('image:107,108,109')" in str(caught.value)
    fixed = LoopOptions(encoder=OFFLOAD, fix=_fixes(PIN_LOADS_BEFORE_SAVES))
    run_loop(shared_prompt_program(207), async_scheduling=async_scheduling, options=fixed)


#: The second finding's shrunk program (`scripts/vllm_shrink.py --seed 953 --loop sync --rule
#: ec_save_lands --programs-from shared-prompts --mm-items 2 --encoder-cache 3
#: --encoder-offload 6`): 'r3' (priority 2) is scheduled its item's first token in the step
#: in which the higher-priority requests' chunks preempt it.
VICTIM_SAVE = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=21,
        max_num_batched_tokens=4,
        max_num_seqs=4,
        max_model_len=9,
        long_prefill_token_threshold=1,
        policy=Policy.PRIORITY,
    ),
    arrivals=(
        (ArRequest("r3", 4, 1, priority=2), ArRequest("r4", 8, 1, prompt=tuple(range(100, 108)))),
        (ArRequest("r5", 7, 1, prompt=tuple(range(100, 107))),),
        (),
        (ArRequest("r11", 5, 1, prompt=tuple(range(100, 105))),),
    ),
    aborts=((), (), (), ()),
)
#: vLLM's own encoder cache size (the step's tokens, raised to one item): 4 embeddings.
OWN_SIZES = EncoderOptions(offload_blocks=6)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_same_step_victims_saves_never_land(async_scheduling: bool) -> None:
    """The second finding, at vLLM's own encoder cache size: the save of the victim's item is
    sent though nothing computes it, with the same-step victim's own fixes
    (`uncache-preempted`, `unbook-victim-encoder-inputs`) and the first finding's in place;
    the fix lifts it."""
    _vllm()
    others = ("uncache-preempted", "unbook-victim-encoder-inputs", PIN_LOADS_BEFORE_SAVES)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            VICTIM_SAVE,
            async_scheduling=async_scheduling,
            options=LoopOptions(encoder=OWN_SIZES, fix=_fixes(*others)),
        )
    assert caught.value.rule == "ec_save_lands", caught.value
    assert "'image:1000000,1000000,1000000'" in str(caught.value)
    assert "(it runs [])" in str(caught.value)
    fixed = LoopOptions(encoder=OWN_SIZES, fix=_fixes(*others, TELL_EC_CONNECTOR_ONCE_SCHEDULED))
    run_loop(VICTIM_SAVE, async_scheduling=async_scheduling, options=fixed)


def test_the_victims_save_keeps_the_engine_stepping(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a worker that skips the save, as vLLM's does, the entry is never ready (the GPU
    side's own finding fixed)."""
    _vllm()
    _skip_saves_not_run(monkeypatch)
    options = LoopOptions(
        encoder=OWN_SIZES, fix=_fixes("uncache-preempted", "unbook-victim-encoder-inputs")
    )
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(VICTIM_SAVE, async_scheduling=False, options=options)
    assert caught.value.rule == "ec_offload_settled", caught.value
    assert "'image:1000000,1000000,1000000': 'not ready'" in str(caught.value)


def test_the_connector_fix_lifts_the_first_finding_too() -> None:
    """Telling the connector once the step is final, loads first, also keeps a load's entry
    from its own request's save."""
    _vllm()
    options = LoopOptions(encoder=OFFLOAD, fix=make_fixes([TELL_EC_CONNECTOR_ONCE_SCHEDULED]))
    run = run_loop(LOAD_ORDER, async_scheduling=False, options=options)
    assert run.encoder_loads >= 1


def test_the_sweep_takes_the_offload_and_refuses_it_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/vllm_async_check.py --mm-items 2 --encoder-offload 6` counts saves and loads;
    `--encoder-offload` without `--mm-items`, or a bad size, is a usage error (exit 2)."""
    _vllm()
    script = load_script("vllm_async_check")
    argv = ["--programs", "6", "--mm-items", "2", "--encoder-cache", "6", "--encoder-offload"]
    fixes = ["--fix", PIN_LOADS_BEFORE_SAVES, "--fix", WHOLE_PROMPT_UNDER_ENCODER_PRESSURE]
    assert script.main([*argv, "6", *fixes]) == 0
    out = capsys.readouterr().out
    assert "offloaded to a CPU encoder cache of 6 embeddings" in out
    assert "items saved to the CPU encoder cache" in out
    for bad, message in (
        (["--encoder-offload", "6"], "--encoder-offload: only with --mm-items"),
        (["--mm-items", "1", "--encoder-offload", "0"], "invalid offload_blocks=0"),
        (["--mm-items", "1", "--encoder-offload", "2"], "asserts every item fits its region"),
    ):
        with pytest.raises(SystemExit) as exit_:
            script.main(["--programs", "1", *bad])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


def test_the_fix_is_an_edit_of_vllms_scheduler(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py vllm-encoder-load-order` and `vllm-encoder-connector`
    apply with `git apply` to the text the fixed scheduler runs."""
    _vllm()
    diff, patched = apply_fix_set(tmp_path / "load-order", ENCODER_LOAD_ORDER_FIXES)
    assert diff.count("+                    external_load_encoder_input") == 1
    assert all("Loads first" in text for text in patched.values())
    diff, patched = apply_fix_set(tmp_path / "connector", ENCODER_CONNECTOR_FIXES)
    assert "+                self._ec_booked.append((request, input_id))" in diff
    assert all("def _tell_ec_connector" in text for text in patched.values())
