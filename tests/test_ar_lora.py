"""LoRA adapters in the AR spec (`ArConfig.max_loras`, `ArRequest.lora`, rule `lora_slots`):
the running requests use at most max_loras adapters; a waiting request whose adapter finds no
room is passed over by every admission rule, its place kept; the configuration and the
request are checked; a log round-trips its adapters; the vllm-v1 twin passes over such a
request as vLLM does, and a twin that does not schedule adapters is refused a LoRA log."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine

from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.ar.strategies import ar_configs_in, lora_slot_choices
from properties.ar.trace_check import check_ar_trace
from properties.verify import run_machine
from reference.ar.prefix_cache import VLLM_V1_PREFIX, make_vllm_v1_prefix
from reference.ar.vllm_settings import VLLM_V1_CADENCE_FIXED
from reference.ar.vllm_v1 import VLLM_033, VLLM_V1, VllmV1Scheduler
from schedspec_cli.main import main
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, ArRules, Policy, validate_ar_request
from spec.ar.events import (
    ArAborted,
    ArAwaiting,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPauseSet,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile
from spec.ar.trace import ar_config_from_dict, ar_config_to_dict, write_ar_trace
from spec.errors import ConfigError, InvalidRequest, SpecViolation
from spec.implementation import ArImplementation
from spec.profile import ProfileError
from spec.trace import TraceFormatError
from tests.test_ar_awaiting import log_of, verdict
from tests.test_ar_rules_fire import CFG
from tests.test_twin_settings import check

# one adapter slot, two seats
ONE_SLOT = CFG.replace(max_loras=1)


def a_runs_then(*after: ArEvent) -> list[ArEvent]:
    """a (adapter 1, a 3-token prompt in one block, 2 outputs) is admitted in step 0 and
    runs; b (adapter 2) and c (the base model, 4 tokens) wait behind it; then `after`."""
    return [
        ArSubmitted("a", 3, 2, lora=1),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 3),
        ArStepEnd(0),
        ArSubmitted("b", 4, 1, lora=2),
        ArSubmitted("c", 4, 1),
        *after,
    ]


C_PASSES_B: list[ArEvent] = [
    ArScheduled("a", 1),
    ArBlocksAllocated("c", (2,)),
    ArScheduled("c", 4),
    ArStepEnd(1),
]


def test_a_request_whose_adapter_finds_no_room_is_passed_over() -> None:
    """b's adapter finds no room beside a's: c, behind it, is admitted (FCFS holds), and
    without the adapters in the log the same admission breaks FCFS."""
    assert verdict(a_runs_then(*C_PASSES_B), ONE_SLOT) == ("", "")
    bare = [
        ArSubmitted(e.request_id, e.prompt_len, e.max_tokens) if isinstance(e, ArSubmitted) else e
        for e in a_runs_then(*C_PASSES_B)
    ]
    rule, message = verdict(bare, CFG)
    assert rule == "fcfs_admission" and "admitted 'c' while 'b' is ahead of it" in message


def test_a_request_whose_adapter_runs_already_may_not_be_passed_over() -> None:
    """With two slots b's adapter has room: passing over it breaks FCFS."""
    rule, message = verdict(a_runs_then(*C_PASSES_B), CFG.replace(max_loras=2))
    assert rule == "fcfs_admission" and "'b' is ahead" in message, message


def test_admitting_an_adapter_past_max_loras_breaks_lora_slots() -> None:
    """b admitted beside a: two adapters with one slot."""
    events = a_runs_then(ArScheduled("a", 1), ArBlocksAllocated("b", (2,)), ArScheduled("b", 4))
    rule, message = verdict(events, ONE_SLOT)
    assert rule == "lora_slots", message
    assert "admitting 'b' (LoRA adapter 2) makes the running requests use adapters [1, 2]" in (
        message
    )
    assert "max_loras=1" in message


def test_once_the_adapter_frees_its_slot_the_request_is_admitted_first() -> None:
    """a finishes: b's adapter has room, and it is admitted before c."""
    events = a_runs_then(
        ArScheduled("a", 1),
        ArStepEnd(1),
        ArBlocksFreed("a", (1,)),
        ArFinished("a", ArFinishReason.LENGTH),
        ArBlocksAllocated("c", (1,)),
        ArScheduled("c", 4),
    )
    rule, message = verdict(events, ONE_SLOT)
    assert rule == "fcfs_admission" and "'b' is ahead" in message, message


def test_the_configuration_and_the_request_are_checked() -> None:
    """A negative max_loras is refused; a request naming an adapter where none is served
    fails valid_request; a cadence with adapters is refused by the machine only beside a pass
    other than vLLM's (SJF here), saying why."""
    with pytest.raises(ConfigError, match="max_loras"):
        ArConfig(max_loras=-1)
    rule, message = verdict([ArSubmitted("a", 4, 1, lora=1)], CFG)
    assert rule == "valid_request" and "max_loras=0" in message, message
    with pytest.raises(InvalidRequest, match="lora"):
        validate_ar_request(ONE_SLOT, ArRequest("a", 4, 1, lora=0))
    ArSpecMachine(ONE_SLOT, ArPolicy(prefill_interval=3))
    ArSpecMachine(ONE_SLOT.replace(policy=Policy.PRIORITY), ArPolicy(prefill_interval=3))
    with pytest.raises(ConfigError, match=r"prefill_interval=3\) with admission sjf.*FCFS or"):
        ArSpecMachine(ONE_SLOT.replace(policy=Policy.SJF), ArPolicy(prefill_interval=3))


# --- beside a prefill cadence: a request skipped for its adapter is deferred ------------------

CADENCE = ArPolicy(prefill_interval=3)
#: one adapter slot, two seats, room for an 8-token prompt and its outputs
CADENCED = ONE_SLOT.replace(max_model_len=16, num_blocks=12)


def cadence_verdict(events: list[ArEvent], config: ArConfig = CADENCED) -> tuple[str, str]:
    """(rule, message) the spec gives `events` under a prefill interval of 3; ("", "") when
    they conform."""
    try:
        ArSpecMachine(config, CADENCE).apply_all(events)
    except SpecViolation as violation:
        return str(violation.rule), str(violation)
    return "", ""


def skipped_then_held(a_prompt: int) -> list[ArEvent]:
    """a (adapter 1, `a_prompt` tokens) is admitted in release step 0 ahead of b (adapter 2),
    which finds no room; c (the base model) arrives, and step 1 (a decodes; the interval of 3
    has not elapsed) admits c's 4-token prefill past b."""
    a_blocks = tuple(range(1, CADENCED.blocks_for(a_prompt) + 1))
    grown = len(a_blocks) + 1
    return [
        ArSubmitted("a", a_prompt, 4, lora=1),
        ArSubmitted("b", 4, 1, lora=2),
        ArBlocksAllocated("a", a_blocks),
        ArScheduled("a", a_prompt),
        ArStepEnd(0),
        ArSubmitted("c", 4, 1),
        ArBlocksAllocated("a", (grown,)),
        ArScheduled("a", 1),
        ArBlocksAllocated("c", (grown + 1,)),
        ArScheduled("c", 4),
        ArStepEnd(1),
    ]


def test_a_request_the_pass_skips_for_its_adapter_lifts_no_hold() -> None:
    """vLLM's capacity escape (`num_waiting > len(deferred_waiting)`) does not count a request
    its pass skipped for its adapter: with budget left after a's 4 tokens, step 0's pass
    reached b and skipped it, so step 0 left no work waiting and step 1 is held; c's prefill
    there breaks `prefill_cadence`, the message saying why the escape stayed shut. Where a's
    8 tokens spent the budget, the pass never reached b: b counts as left waiting, the escape
    lifts the hold, and c may be admitted."""
    rule, message = cadence_verdict(skipped_then_held(4))
    assert rule == "prefill_cadence", message
    assert "'c' admitted with 4 tokens to compute in step 1" in message, message
    assert (
        "no capacity escape: the last release step left waiting only requests its pass "
        "deferred, 'b' (skipped for its adapter)"
    ) in message, message
    assert cadence_verdict(skipped_then_held(8)) == ("", "")


def after_a_and_d(seats: int) -> list[ArEvent]:
    """a (adapter 1) and d (the base model, one output) are admitted in release step 0 ahead
    of b (adapter 2); d finishes, c arrives, and step 1 admits c's prefill past b."""
    return [
        ArSubmitted("a", 4, 4, lora=1),
        ArSubmitted("d", 2, 1),
        ArSubmitted("b", 4, 1, lora=2),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArBlocksAllocated("d", (2,)),
        ArScheduled("d", 2),
        ArStepEnd(0),
        ArBlocksFreed("d", (2,)),
        ArFinished("d", ArFinishReason.LENGTH),
        ArSubmitted("c", 4, 1),
        ArBlocksAllocated("a", (3,)),
        ArScheduled("a", 1),
        ArBlocksAllocated("c", (4,)),
        ArScheduled("c", 4),
        ArStepEnd(1),
    ]


def test_past_its_last_admission_the_pass_reaches_a_request_only_with_a_seat_free() -> None:
    """With two seats, a and d fill them and vLLM's pass ends at its loop's head before b: b
    counts as left waiting, and step 1 is not held. With three, the pass goes on, skips b
    for its adapter and defers it: step 1 is held."""
    assert cadence_verdict(after_a_and_d(2), CADENCED) == ("", "")
    rule, message = cadence_verdict(after_a_and_d(3), CADENCED.replace(max_num_seqs=3))
    assert rule == "prefill_cadence" and "'b' (skipped for its adapter)" in message, message


def test_a_request_skipped_before_an_admission_is_deferred() -> None:
    """b, between a and d in the queue, is skipped by the pass that admits d after it: it is
    deferred whatever the seats (the pass reached it before the last admission), so with two
    seats step 1 is held."""
    events = after_a_and_d(2)
    b, d = events[2], events[1]
    events[1], events[2] = b, d
    rule, message = cadence_verdict(events)
    assert rule == "prefill_cadence" and "'b' (skipped for its adapter)" in message, message


# prefix caching with two adapter slots
CACHED_SLOTS = CFG.replace(enable_prefix_caching=True, max_loras=2)
PROMPT = (7, 8, 9, 10, 11)  # one full block and a token


def a_cached_then(*after: ArEvent) -> list[ArEvent]:
    """a (adapter 1, `PROMPT`) runs in step 0 and finishes, its first block (1) left cached;
    then `after`."""
    return [
        ArSubmitted("a", 5, 1, prompt=PROMPT, lora=1),
        ArBlocksAllocated("a", (1, 2)),
        ArScheduled("a", 5),
        ArStepEnd(0),
        ArBlocksFreed("a", (1, 2)),
        ArFinished("a", ArFinishReason.LENGTH),
        *after,
    ]


def hit_of(rid: str, lora: int | None) -> list[ArEvent]:
    """`rid` (`PROMPT` under `lora`) is admitted in step 1 reading a's cached block 1."""
    return [
        ArSubmitted(rid, 5, 1, prompt=PROMPT, lora=lora),
        ArCacheHit(rid, (1,)),
        ArBlocksAllocated(rid, (3,)),
        ArScheduled(rid, 1),
        ArStepEnd(1),
    ]


def miss_of(rid: str, lora: int | None) -> list[ArEvent]:
    """`rid` (`PROMPT` under `lora`) is admitted in step 1 with no cache hit."""
    return [
        ArSubmitted(rid, 5, 1, prompt=PROMPT, lora=lora),
        ArBlocksAllocated(rid, (3, 4)),
        ArScheduled(rid, 5),
        ArStepEnd(1),
    ]


def test_cached_blocks_are_keyed_by_adapter() -> None:
    """vLLM hashes a request's adapter into its blocks: b reads a's cached block under a's
    adapter; under another adapter, or the base model, the same tokens are other content
    (`cache_hit_cached`), and a miss is no missed hit (`cache_hit_longest`)."""
    assert verdict(a_cached_then(*hit_of("b", 1)), CACHED_SLOTS) == ("", "")
    for lora, said in ((2, "'b' runs adapter 2"), (None, "'b' runs the base model")):
        rule, message = verdict(a_cached_then(*hit_of("b", lora)), CACHED_SLOTS)
        assert rule == "cache_hit_cached", message
        assert f"caches other content: the same tokens under LoRA adapter 1, but {said}" in message
    longest = ArPolicy(longest_cache_hit=True)
    for lora in (2, None):
        log = log_of(a_cached_then(*miss_of("b", lora)), CACHED_SLOTS)
        assert check_ar_trace(log, policy=longest).violation is None
    missed = check_ar_trace(log_of(a_cached_then(*miss_of("b", 1)), CACHED_SLOTS), policy=longest)
    assert missed.violation is not None and missed.violation.rule == "cache_hit_longest"


def test_the_prefix_twin_shares_cached_blocks_within_an_adapter_only() -> None:
    """vllm-v1-prefix, through the harness (every event checked): b (a's adapter) reads a's
    cached prefix; c (another adapter) and d (the base model), with the same prompt, do not."""
    h = ArHarness(make_vllm_v1_prefix, CACHED_SLOTS.replace(num_blocks=17, max_num_seqs=4))
    h.submit(ArRequest("a", 5, 1, prompt=PROMPT, lora=1))
    h.step()
    for rid, lora in (("b", 1), ("c", 2), ("d", None)):
        h.submit(ArRequest(rid, 5, 1, prompt=PROMPT, lora=lora))
    h.drain()
    assert h.violation is None, h.violation
    hits = {e.request_id for e in h.events if isinstance(e, ArCacheHit)}
    assert hits == {"b"}, h.events


def test_a_log_round_trips_its_adapters() -> None:
    """The header carries max_loras (left out at 0), ar_submitted its lora (left out for the
    base model)."""
    assert "max_loras" not in ar_config_to_dict(CFG)
    assert ar_config_from_dict(ar_config_to_dict(ONE_SLOT))[0] == ONE_SLOT
    out = io.StringIO()
    write_ar_trace(a_runs_then(*C_PASSES_B), out, ONE_SLOT)
    text = out.getvalue()
    assert '"lora":1' in text and '"lora":2' in text
    assert text.count('"lora"') == 2  # c runs the base model


def twin(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """The vllm-v1 twin (vLLM 0.33.0's options)."""
    return VllmV1Scheduler(config, sink, VLLM_033)


@pytest.mark.parametrize("policy", [Policy.FCFS, Policy.PRIORITY])
def test_the_twin_passes_over_a_request_whose_adapter_finds_no_room(policy: Policy) -> None:
    """Through the harness (every event checked): a, b (adapter 1, 2) and c (base model) with
    one slot: b waits until a finishes while c is admitted past it."""
    config = ONE_SLOT.replace(policy=policy)
    h = ArHarness(twin, config)
    for rid, lora in (("a", 1), ("b", 2), ("c", None)):
        h.submit(ArRequest(rid, 4, 3, lora=lora))
    h.step()
    admitted = [e.request_id for e in h.events if isinstance(e, ArScheduled)]
    assert admitted == ["a", "c"], h.events
    h.drain()
    assert h.violation is None, h.violation
    first: dict[str, int] = {}
    for e in h.events:
        if isinstance(e, ArScheduled):
            first.setdefault(e.request_id, len(first))
    assert list(first) == ["a", "c", "b"]


def test_a_twin_that_does_not_schedule_adapters_is_refused_a_lora_log(tmp_path: Path) -> None:
    """A Vidur twin says nothing of adapters: check-trace --twin refuses the LoRA log in one
    line (exit 2); vllm-v1 decides alike."""
    ends: list[ArEvent] = [
        ArBlocksFreed("a", (1,)),
        ArFinished("a", ArFinishReason.LENGTH),
        ArBlocksFreed("c", (2,)),
        ArFinished("c", ArFinishReason.LENGTH),
        ArBlocksAllocated("b", (1,)),
        ArScheduled("b", 4),
        ArStepEnd(2),
        ArBlocksFreed("b", (1,)),
        ArFinished("b", ArFinishReason.LENGTH),
    ]
    path = tmp_path / "log.jsonl"
    with path.open("w") as out:
        write_ar_trace(a_runs_then(*C_PASSES_B, *ends), out, ONE_SLOT)
    code, said = check(str(path), "--twin", "vidur-sarathi")
    assert code == 2 and said.count("\n") == 1, said
    assert "LoRA adapters (max_loras=1)" in said and "--twin vllm-v1" in said, said
    code, said = check(str(path), "--twin", "vllm-v1")
    assert code == 0 and "its twin vllm-v1 decides alike in all 3 steps" in said, said


def test_look_ahead_passes_over_a_request_whose_adapter_finds_no_room() -> None:
    """FCFS with a look-ahead of 1: b, blocked by its adapter, is not one of the requests c
    looked past (else b, which fits, would have to be admitted first); with room for b's
    adapter the look-ahead fails on it."""
    look_ahead = ArPolicy(rules=ArRules(fcfs_lookahead=1))
    log = log_of(a_runs_then(*C_PASSES_B), ONE_SLOT)
    assert check_ar_trace(log, policy=look_ahead).violation is None
    found = check_ar_trace(
        log_of(a_runs_then(*C_PASSES_B), CFG.replace(max_loras=2)), policy=look_ahead
    )
    assert found.violation is not None and "past 'b'" in str(found.violation), found.violation


def test_a_bad_adapter_in_a_log_is_a_line_error_and_the_state_shows_adapters() -> None:
    """`"lora": 0` is no adapter id: the log's line is refused (exit 2), not checked. A
    counterexample's state names each request's adapter."""
    lines = log_of([ArSubmitted("a", 4, 1, lora=1)], ONE_SLOT)
    bad = [lines[0], lines[1].replace('"lora":1', '"lora":0')]
    with pytest.raises(TraceFormatError, match=r"lora=0: must be an integer >= 1"):
        check_ar_trace(bad)
    events = a_runs_then(ArScheduled("a", 1), ArBlocksAllocated("b", (2,)), ArScheduled("b", 4))
    _, message = verdict(events, ONE_SLOT)
    assert "b: waiting" in message and " lora=2" in message and " lora=1" in message, message


def run_suite(machine: type[RuleBasedStateMachine], examples: int) -> BaseException | None:
    """The conformance suite `machine` over `examples` examples, derandomized: what it raised
    (None when every example passed)."""
    run = settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        stateful_step_count=30,
        suppress_health_check=list(HealthCheck),
    )
    return run_machine(machine, run)[0]


def test_the_suite_draws_adapters_where_asked_and_the_space_serves_them() -> None:
    """`loras=True` draws adapter slots for a space that serves them (half the configurations
    none); a space that serves none, or the suite not asked, draws none."""
    lora_space = VLLM_V1.profile.space
    assert lora_slot_choices(lora_space) == (0, 0, 1, 2)
    assert lora_slot_choices(ArConfigSpace()) == (0,)
    assert lora_slot_choices(ArConfigSpace(max_loras=1)) == (0, 0, 1)
    drawn: set[int] = set()

    @given(ar_configs_in(lora_space, loras=True))
    @settings(max_examples=60, derandomize=True, database=None)
    def draw(config: ArConfig) -> None:
        drawn.add(config.max_loras)

    draw()
    assert drawn == {0, 1, 2}, drawn

    @given(ar_configs_in(lora_space))
    @settings(max_examples=30, derandomize=True, database=None)
    def unasked(config: ArConfig) -> None:
        assert config.max_loras == 0

    unasked()


@pytest.mark.parametrize("implementation", [VLLM_V1, VLLM_V1_PREFIX], ids=["vllm-v1", "prefix"])
def test_the_reference_twins_conform_with_adapters(implementation: ArImplementation) -> None:
    """The suite with adapters drawn passes on the reference twins, which serve them."""
    machine = ar_conformance_machine(
        implementation.factory, profile=implementation.profile, loras=True
    )
    assert run_suite(machine, 120) is None


def test_a_space_without_adapters_is_named() -> None:
    """A configuration with more adapter slots than the space serves is outside it, and a
    space serving fewer than another does not cover it."""
    assert ArConfigSpace().outside(ONE_SLOT) == ("max_loras", 1, "at most 0 (0: no LoRA adapter)")
    assert VLLM_V1.profile.space.outside(ONE_SLOT) is None
    assert ArConfigSpace(max_loras=1).uncovered(ArConfigSpace(max_loras=None)) == (
        "max_loras any (this space: at most 1)"
    )
    with pytest.raises(ProfileError, match=r"space\.max_loras"):
        ArConfigSpace(max_loras=-1)


def verify(*argv: str) -> tuple[int, str]:
    """`schedspec verify ARGV` in-process: its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["verify", *argv])
    return code, out.getvalue()


def test_verify_loras_draws_adapters_and_catches_a_scheduler_that_ignores_their_slots() -> None:
    """`verify --loras` draws adapters for an implementation that serves them: a scheduler
    that admits past max_loras fails `lora_slots` (exit 1); without `--loras` it passes, as
    no adapter is drawn. A target whose space serves none, or a dLLM one, is refused in one
    line (exit 2)."""
    target = "tests.ar_mutants:ADAPTER_SLOTS_IGNORED"
    code, said = verify("--impl", target, "--loras", "--examples", "300")
    assert code == 1 and "violation of [lora_slots]" in said, said
    assert "makes the running requests use adapters" in said, said
    code, said = verify("--impl", target, "--examples", "60")
    assert code == 0, said
    for impl, why in (("vidur-vllm", "ArConfigSpace.max_loras=0"), ("reference-dllm", "is dLLM")):
        code, said = verify("--impl", impl, "--loras", "--examples", "5")
        assert code == 2 and said.count("\n") == 1 and why in said, said


#: The cadence reference (with the fix of its stall) declaring a space that serves no adapters:
#: as a twin it covers every configuration of `VLLM_V1_CADENCE_FIXED` but those with adapter
#: slots.
CADENCE_SERVING_NO_ADAPTERS = ArImplementation(
    VLLM_V1_CADENCE_FIXED.factory,
    ArProfile(
        space=dataclasses.replace(VLLM_V1_CADENCE_FIXED.profile.space, max_loras=0),
        policy=VLLM_V1_CADENCE_FIXED.profile.policy,
    ),
)


def test_a_twin_serving_no_adapters_is_refused_only_where_adapters_are_drawn() -> None:
    """`--twin` must cover what the run draws: without `--loras` every configuration has
    max_loras 0, so a twin serving no adapters runs beside a target that serves them; with
    `--loras` it is refused in one line naming what it lacks."""
    argv = ("--impl", "reference.ar.vllm_settings:VLLM_V1_CADENCE_FIXED", "--examples", "20")
    twin = ("--twin", "tests.test_ar_lora:CADENCE_SERVING_NO_ADAPTERS")
    code, said = verify(*argv, *twin)
    assert code == 0, said
    code, said = verify(*argv, *twin, "--loras")
    assert code == 2 and said.count("\n") == 1, said
    assert "declares no max_loras any (this space: at most 0)" in said, said


def stopped_at_e() -> list[ArEvent]:
    """Under the whole-sequence gate, 4 usable blocks: release step 0 admits f (adapter 1,
    decoding from then on) and a (one output), and its pass stops at e (12 tokens, whose 3
    blocks do not fit the 2 free), before b (adapter 2). Release step 1 admits e's first
    chunk, which spends the budget: its pass ends before b too. Step 2 runs e's next chunk."""
    return [
        ArSubmitted("f", 2, 8, lora=1),
        ArSubmitted("a", 4, 1),
        ArSubmitted("e", 12, 1),
        ArSubmitted("b", 4, 1, lora=2),
        ArBlocksAllocated("f", (1,)),
        ArScheduled("f", 2),
        ArBlocksAllocated("a", (2,)),
        ArScheduled("a", 4),
        ArStepEnd(0),
        ArBlocksFreed("a", (2,)),
        ArFinished("a", ArFinishReason.LENGTH),
        ArScheduled("f", 1),
        ArBlocksAllocated("e", (2, 3)),
        ArScheduled("e", 7),
        ArStepEnd(1),
        ArScheduled("f", 1),
        ArBlocksAllocated("e", (4,)),
        ArScheduled("e", 5),
        ArStepEnd(2),
    ]


def test_the_pass_reaches_no_request_behind_the_one_it_stops_at() -> None:
    """b, behind e where step 0's pass stopped, was never reached by a pass: it counts as
    left waiting by release step 1, whose escape lifts step 2's hold, so e's next chunk may
    run there. Had the spec deferred b (skipping it as if the pass went on), step 2 would be
    held and e's chunk would break `prefill_cadence`."""
    gated = dataclasses.replace(CADENCE, full_sequence_admission=True)
    config = CADENCED.replace(num_blocks=5, max_num_seqs=3)
    ArSpecMachine(config, gated).apply_all(stopped_at_e())
    b_first = stopped_at_e()
    b_first[2], b_first[3] = b_first[3], b_first[2]  # b ahead of e: reached and deferred
    with pytest.raises(SpecViolation) as caught:
        ArSpecMachine(config, gated).apply_all(b_first)
    assert caught.value.rule == "prefill_cadence" and "'e' scheduled 5 tokens" in str(
        caught.value
    ), str(caught.value)


def test_the_pass_skips_a_request_awaiting_its_input_and_goes_on() -> None:
    """g, awaiting its grammar between a and b, is skipped as b is: both are deferred, and
    step 1 is held (the message names each with why)."""
    events = skipped_then_held(4)
    events[1:1] = [ArSubmitted("g", 4, 1), ArAwaiting("g", "grammar")]
    rule, message = cadence_verdict(events)
    assert rule == "prefill_cadence", message
    assert "'g' (its input awaited), 'b' (skipped for its adapter)" in message, message


def test_a_step_paused_for_new_requests_reaches_no_waiting_one() -> None:
    """a's 8 tokens spend step 0's budget, so its pass never reaches b; step 1, paused for new
    requests, runs no pass over the waiting ones, so b is still not deferred and counts as
    left waiting: step 2, unpaused, is not held, and c (arrived since) may start its
    prefill."""
    events = [
        *skipped_then_held(8)[:5],
        ArPauseSet("paused_new"),
        ArBlocksAllocated("a", (3,)),
        ArScheduled("a", 1),
        ArStepEnd(1),
        ArPauseSet("unpaused"),
        ArSubmitted("c", 4, 1),
        ArScheduled("a", 1),
        ArBlocksAllocated("c", (4,)),
        ArScheduled("c", 4),
        ArStepEnd(2),
    ]
    assert cadence_verdict(events) == ("", ""), cadence_verdict(events)


def test_a_step_that_preempts_reaches_no_waiting_request() -> None:
    """Priority, interval 5: step 0 leaves w waiting (the budget spent), so the escape is
    open. Step 1 preempts v and so runs no waiting pass: b (adapter 2, the best priority)
    is not reached, and stays counted. With v and w aborted, step 2 (paused for new
    requests: no pass either) leaves only b waiting, and the escape stays open: step 3 may
    admit c's prefill. Had step 1 deferred b, step 3 would be held."""
    config = ArConfig(
        block_size=4,
        num_blocks=5,
        max_num_batched_tokens=12,
        max_num_seqs=3,
        max_model_len=16,
        policy=Policy.PRIORITY,
        max_loras=1,
    )
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 8, priority=1, lora=1),
        ArSubmitted("v", 7, 8, priority=5),
        ArSubmitted("d", 1, 8, priority=2),
        ArSubmitted("w", 4, 1, priority=6),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArBlocksAllocated("d", (4,)),
        ArScheduled("d", 1),
        ArBlocksAllocated("v", (2, 3)),
        ArScheduled("v", 7),
        ArStepEnd(0),
        ArSubmitted("b", 4, 1, priority=0, lora=2),
        ArPreempted("v", (2, 3)),
        ArBlocksAllocated("a", (2,)),
        ArScheduled("a", 1),
        ArScheduled("d", 1),
        ArStepEnd(1),
        ArAborted("v"),
        ArAborted("w"),
        ArPauseSet("paused_new"),
        ArScheduled("a", 1),
        ArScheduled("d", 1),
        ArStepEnd(2),
        ArPauseSet("unpaused"),
        ArSubmitted("c", 4, 1, priority=2),
        ArScheduled("a", 1),
        ArScheduled("d", 1),
        ArBlocksAllocated("c", (3,)),
        ArScheduled("c", 4),
        ArStepEnd(3),
    ]
    ArSpecMachine(config, ArPolicy(prefill_interval=5)).apply_all(events)
