"""Cache-aware admission (`ArPolicy.cache_aware_window`, vLLM 0.34.0's
`cache_aware_admission_window`): the order it gives the waiting queue, the profile's checks,
and the spec holding the reference twin `VLLM_V1_CACHE_AWARE` to it, while the same decisions
break FCFS for a profile that does not declare it."""

from __future__ import annotations

import pytest

import spec.ar.machine as ar_machine
from properties.ar.harness import ArHarness
from reference.ar.prefix_cache import VLLM_V1_PREFIX
from reference.ar.vllm_settings import VLLM_V1_CACHE_AWARE
from spec.ar.adapter import ArImplementationFactory
from spec.ar.cache_aware import cache_aware_order, pool_usage
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import ArScheduled
from spec.ar.profile import ArPolicy
from spec.errors import SpecViolation
from spec.profile import ProfileError
from tests.script_module import load_script


def _order(queue: str, window: int, depth: dict[str, int], preempted: str = "") -> str:
    out = cache_aware_order(
        list(queue), window, lambda r: r not in preempted, lambda r: depth.get(r, 0)
    )
    return "".join(out)


def test_fresh_requests_in_the_window_go_deepest_prefix_first() -> None:
    assert _order("abcd", 4, {"c": 4, "d": 2}) == "cdab"
    # ties keep queue order; nothing beyond the window moves
    assert _order("abcde", 3, {"b": 2, "c": 2, "e": 8}) == "bcade"


def test_a_preempted_request_keeps_its_place() -> None:
    # p is preempted: it keeps slot 0 though it has the deepest prefix
    assert _order("pabc", 4, {"p": 9, "c": 4}, preempted="p") == "pcab"
    assert _order("apbc", 4, {"c": 4}, preempted="p") == "cpab"


def test_fewer_than_two_fresh_requests_change_nothing() -> None:
    assert _order("pa", 2, {"a": 4}, preempted="p") == "pa"
    assert _order("a", 1, {"a": 4}) == "a"


def test_usage_is_vllms_one_minus_free_over_usable() -> None:
    assert pool_usage(4, 8) == 0.5
    assert pool_usage(8, 8) == 0.0
    assert pool_usage(0, 0) == 0.0


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("cache_aware_window", -1, "an integer >= 0"),
        ("cache_aware_window", True, "an integer >= 0"),
        ("cache_aware_threshold", 1.5, r"a number in \[0, 1\]"),
        ("cache_aware_threshold", "half", r"a number in \[0, 1\]"),
    ],
)
def test_the_profile_rejects_a_bad_window_or_threshold(
    field: str, value: object, valid: str
) -> None:
    with pytest.raises(ProfileError, match=f"policy.{field}.*{valid}"):
        ArPolicy(**{field: value})  # type: ignore[arg-type]


# 8 usable blocks of 2 tokens (the null block besides), one seat: requests queue behind `a`
ONE_SEAT = ArConfig(
    block_size=2,
    num_blocks=9,
    max_num_seqs=1,
    max_num_batched_tokens=16,
    max_model_len=16,
    enable_prefix_caching=True,
    reserve_null_block=True,
)
A = tuple(range(1, 9))  # a's prompt, 8 tokens: 4 blocks, half the pool
B = (50, 51, 52, 53)  # shares nothing
C = (*A[:4], 60, 61)  # shares a's first 2 blocks


def admission_order(
    factory: ArImplementationFactory,
    policy: ArPolicy,
    config: ArConfig = ONE_SEAT,
    c_reads: int | None = None,
) -> list[str]:
    """a runs alone (4 of 8 blocks held: usage 0.5) while b, then c (a's first 4 tokens
    cached; `c_reads`: its `cache_read_limit`), wait for its seat: the order the three are
    admitted in, the spec checking every event, and the snapshot after every step, under
    `policy`. (tests/test_real_vllm_cache_aware.py runs it on vLLM.)"""
    h = ArHarness(factory, config, policy=policy)
    h.submit(ArRequest("a", 8, 2, prompt=A))
    h.step()
    h.submit(ArRequest("b", 4, 1, prompt=B))
    h.submit(ArRequest("c", 6, 1, prompt=C, cache_read_limit=c_reads))
    while not h.spec.is_idle():
        h.step()
    h.drain()
    assert h.violation is None, h.violation
    seen: list[str] = []
    for e in h.events:
        if isinstance(e, ArScheduled) and e.request_id not in seen:
            seen.append(e.request_id)
    return seen


def _admissions(policy: ArPolicy, config: ArConfig = ONE_SEAT) -> list[str]:
    """`admission_order` of the twin `VLLM_V1_CACHE_AWARE` under `policy`."""
    return admission_order(VLLM_V1_CACHE_AWARE.factory, policy, config)


def test_the_request_with_a_cached_prefix_is_admitted_first_and_the_order_persists() -> None:
    """While a holds half the pool, c (a's first 4 tokens cached) moves ahead of b; once a
    finishes the pool is empty (usage 0, below the threshold) and c still goes first."""
    assert _admissions(VLLM_V1_CACHE_AWARE.profile.policy) == ["a", "c", "b"]


def test_below_the_threshold_the_queue_keeps_arrival_order() -> None:
    """With twice the pool, a holds a quarter of it: no reordering, b goes first."""
    roomy = ONE_SEAT.replace(num_blocks=17)
    assert _admissions(VLLM_V1_CACHE_AWARE.profile.policy, roomy) == ["a", "b", "c"]


def test_the_reordering_breaks_fcfs_for_a_profile_that_does_not_declare_it() -> None:
    """The same run under vLLM's policy without the window, step by step: the spec sees the
    queue reordered at the end of the step that reorders it (`waiting_order`)."""
    h = ArHarness(VLLM_V1_CACHE_AWARE.factory, ONE_SEAT, policy=VLLM_V1_PREFIX.profile.policy)
    h.submit(ArRequest("a", 8, 2, prompt=A))
    h.step()
    h.submit(ArRequest("b", 4, 1, prompt=B))
    h.submit(ArRequest("c", 6, 1, prompt=C))
    with pytest.raises(SpecViolation, match=r"implementation queue \['c', 'b'\], FCFS order") as e:
        h.step()
    assert e.value.rule == "waiting_order"


def test_a_twin_that_admits_in_arrival_order_fails_the_declared_profile() -> None:
    """`vllm-v1-prefix` (no window) checked under the cache-aware profile: in the step after
    a's last, it admits b while the spec's queue, reordered in a's last step and kept since,
    has c at its head (`fcfs_admission`)."""
    h = ArHarness(VLLM_V1_PREFIX.factory, ONE_SEAT, policy=VLLM_V1_CACHE_AWARE.profile.policy)
    h.submit(ArRequest("a", 8, 2, prompt=A))
    h.step()
    h.submit(ArRequest("b", 4, 1, prompt=B))
    h.submit(ArRequest("c", 6, 1, prompt=C))
    with pytest.raises(SpecViolation) as err:
        h.drain()
    assert err.value.rule == "fcfs_admission", err.value
    first = str(err.value).splitlines()[0]
    assert "admitted 'b' while 'c' is ahead of it" in first, first
    assert "usage 0 at this step's admission; last reordered in step 1" in first, first


def test_the_window_is_ignored_under_priority_as_vllm_ignores_it() -> None:
    """Under priority the declared window reorders nothing: equal priorities keep arrival
    order, and the twin (which applies it under FCFS only) agrees."""
    policy = VLLM_V1_CACHE_AWARE.profile.policy
    assert _admissions(policy, ONE_SEAT.replace(policy=Policy.PRIORITY)) == ["a", "b", "c"]


def test_the_tally_shows_the_window_engaged_and_moving_the_queue(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/cache_aware_tally.py` on the twin: a pass in which the window moved the queue,
    and ranked some request below its whole cached prefix for its cache read limit; an
    implementation that declares no window is a usage error (exit 2, one line)."""
    tally = load_script("cache_aware_tally")
    assert tally.main(["--examples", "30", "--seed", "8"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[0] == "reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE" and row[-1] == "PASS", row
    asked, moved, cut = int(row[2]), int(row[3]), int(row[4])
    assert asked >= moved > 0, row
    # the twin's profile draws cache read limits: some ranks were cut by one
    assert asked >= cut > 0, row
    assert vars(ar_machine)["cache_aware_order"] is cache_aware_order  # put back
    assert ar_machine.ArSpecMachine._reorder_cache_aware.__name__ == "_reorder_cache_aware"
    assert tally.main(["--impl", "reference.ar.vllm_v1:VLLM_V1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "declares cache_aware_window" in err, err


def test_the_adapters_setting_is_checked_and_sent_only_when_on() -> None:
    """`integrations.vllm.settings_034`: a bad window or threshold is a `ConfigError`; off, it
    sends vLLM nothing (0.33.0's `SchedulerConfig` has no such field), and a release without the
    field is refused naming it and the release that has it."""
    from dataclasses import dataclass

    from integrations.vllm.release_api import check_scheduler_settings
    from integrations.vllm.settings_034 import VLLM_034_DEFAULTS, Vllm034Settings
    from spec.errors import ConfigError

    with pytest.raises(ConfigError, match="cache_aware_window"):
        Vllm034Settings(-1)
    with pytest.raises(ConfigError, match="cache_aware_threshold"):
        Vllm034Settings(3, 2.0)
    with pytest.raises(ConfigError, match="max_inflight_kv_loads"):
        Vllm034Settings(max_inflight_kv_loads=0)
    assert VLLM_034_DEFAULTS.scheduler_settings() == {}
    capped = Vllm034Settings(max_inflight_kv_loads=2).scheduler_settings()
    assert capped == {"max_num_inflight_kv_loads": 2}
    on = Vllm034Settings(3).scheduler_settings()
    assert on == {"cache_aware_admission_window": 3, "cache_aware_admission_threshold": 0.5}

    @dataclass
    class OldSchedulerConfig:  # a release without the setting
        watermark: float = 0.0

    check_scheduler_settings(OldSchedulerConfig, {"watermark": 0.25})
    with pytest.raises(ConfigError, match=r"cache_aware_admission_window=3.*new in vLLM 0\.34\.0"):
        check_scheduler_settings(OldSchedulerConfig, {"watermark": 0.25, **on})
