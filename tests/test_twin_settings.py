"""An AR twin runs with the scheduler settings of what it is compared with
(`schedspec_cli.twin_settings`): `check-trace --twin` on a log that declares them, `verify
--twin` beside an implementation whose profile does. A vLLM reference twin takes them (a
cache-aware threshold of 0, a watermark, no whole-sequence reservation); any other twin that
declares different ones is refused in one line (exit 2), since it decides otherwise by
construction; settings that bear on no decision are not compared."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import random
from pathlib import Path

import pytest

from properties.ar.harness import ArHarness
from properties.verify import ArTwin
from reference.ar.prefix_cache import VLLM_V1_PREFIX, PrefixCachingVllmV1, make_vllm_v1_prefix
from reference.ar.vllm_settings import (
    VLLM_033_CADENCE_FIXED,
    VLLM_V1_CACHE_AWARE,
    VLLM_V1_CADENCE_FIXED,
    VLLM_V1_WATERMARK,
    with_vllm_settings,
)
from reference.ar.vllm_v1 import VLLM_033, VllmOptions
from schedspec_cli.impls import resolve
from schedspec_cli.main import main
from schedspec_cli.trace_profile import ar_log_difference
from schedspec_cli.twin_settings import settings_in_effect, window_applies, with_settings
from schedspec_cli.twins import installed_twin, twin_for_target
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import ArEvent
from spec.ar.profile import ArPolicy
from spec.ar.trace import write_ar_trace
from spec.implementation import ArImplementation, Family

# 24 usable blocks of 4 tokens, two seats: prompts sharing 4 to 12 leading tokens keep the pool
# between empty and half used, where thresholds 0 and 0.5 decide apart
CFG = ArConfig(
    num_blocks=25,
    block_size=4,
    max_num_seqs=2,
    max_num_batched_tokens=16,
    max_model_len=64,
    enable_prefix_caching=True,
)

#: vLLM 0.34.0 with the cache-aware window of 3 at threshold 0, as its log declares it.
THRESHOLD_0 = dataclasses.replace(VLLM_V1_CACHE_AWARE.profile.policy, cache_aware_threshold=0.0)


def threshold_0(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """The reference with vLLM 0.34.0's window of 3 at threshold 0 (the log's scheduler)."""
    options = dataclasses.replace(VLLM_033, cache_aware_window=3, cache_aware_threshold=0.0)
    return PrefixCachingVllmV1(config, sink, options)


#: A twin of the user's own: the window at vLLM's default threshold, declared (not a vLLM
#: reference twin, so nothing takes the log's settings).
HALF = ArImplementation(
    lambda config, sink: PrefixCachingVllmV1(
        config, sink, dataclasses.replace(VLLM_033, cache_aware_window=3)
    ),
    VLLM_V1_CACHE_AWARE.profile,
    "the window at threshold 0.5, a twin of the user's own",
)


def events_of(
    seed: int,
    factory: ArImplementationFactory = threshold_0,
    policy: ArPolicy = THRESHOLD_0,
    config: ArConfig = CFG,
) -> list[ArEvent]:
    """The run of 8 requests drawn by `seed` (prompts sharing one of two 12-token stems up to
    a block boundary) through `factory`, checked under `policy`."""
    rng = random.Random(seed)
    h = ArHarness(factory, config, policy=policy)
    stems = [tuple(rng.randrange(100) for _ in range(12)) for _ in range(2)]
    for i in range(8):
        stem = rng.choice(stems)[: rng.choice((0, 4, 8, 12))]
        prompt = stem + tuple(rng.randrange(100, 200) for _ in range(rng.randrange(1, 8)))
        h.submit(ArRequest(f"r{i}", len(prompt), rng.randrange(1, 6), prompt=prompt))
        if rng.random() < 0.5:
            h.step()
    h.drain()
    assert h.violation is None, h.violation
    return list(h.events)


def log_of(
    path: Path, events: list[ArEvent], declared: ArPolicy | None, config: ArConfig = CFG
) -> str:
    """Write `events` as a log whose header declares `declared` (None: no policy)."""
    with path.open("w", encoding="utf-8") as out:
        write_ar_trace(events, out, config, declared)
    return str(path)


def check(path: str, *flags: str) -> tuple[int, str]:
    """`check-trace PATH FLAGS`: its exit code and what it printed."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", out)
        mp.setattr("sys.stderr", out)
        code = main(["check-trace", path, *flags])
    return code, out.getvalue()


CACHE_AWARE = "reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE"

#: A user's own twin that wraps `make_vllm_v1_prefix` (functools.wraps) but runs the idealised
#: options: another scheduler, which no settings rebuild into the stock reference.
WRAPPED = ArImplementation(
    functools.wraps(make_vllm_v1_prefix)(
        lambda config, sink: PrefixCachingVllmV1(config, sink, VllmOptions())
    ),
    VLLM_V1_PREFIX.profile,
    "a wrapper of vllm-v1-prefix's factory running other options",
)


def test_the_cache_aware_twin_takes_the_threshold_the_log_declares(tmp_path: Path) -> None:
    """Logs of the window at threshold 0: the twin as declared (threshold 0.5) decides
    otherwise on most of them, by construction; `--twin` takes the log's threshold and decides
    alike on every one, saying whose threshold it ran."""
    as_declared = VLLM_V1_CACHE_AWARE.profile
    raw = ArTwin("raw", VLLM_V1_CACHE_AWARE.factory, as_declared.policy, as_declared.space)
    apart = 0
    for seed in range(12):
        events = events_of(seed)
        apart += ar_log_difference(raw, events, CFG, THRESHOLD_0, True, {}) is not None
        code, said = check(
            log_of(tmp_path / f"{seed}.jsonl", events, THRESHOLD_0), "--twin", CACHE_AWARE
        )
        assert code == 0, said
        assert f"its twin {CACHE_AWARE} with the log's cache_aware_threshold=0.0 decides" in said
    assert apart >= 6, apart


def test_a_plain_vllm_twin_takes_the_window_too(tmp_path: Path) -> None:
    """vllm-v1-prefix declares no window: it takes the log's window and threshold, and
    `--json` names the twin it ran."""
    log = log_of(tmp_path / "log.jsonl", events_of(1), THRESHOLD_0)
    verdict = tmp_path / "verdict.json"
    code, said = check(log, "--twin", "vllm-v1-prefix", "--json", str(verdict))
    taken = "vllm-v1-prefix with the log's cache_aware_window=3, cache_aware_threshold=0.0"
    assert code == 0 and f"its twin {taken} decides alike" in said, said
    assert json.loads(verdict.read_text())["twin"] == taken


def test_a_twin_of_the_users_own_with_other_settings_is_refused(tmp_path: Path) -> None:
    """A twin that declares threshold 0.5 (nothing rebuilds it) is an input error naming the
    setting, the log's value and the twin's, before any event is read."""
    log = log_of(tmp_path / "log.jsonl", events_of(1), THRESHOLD_0)
    code, said = check(log, "--twin", f"{__name__}:HALF")
    assert code == 2, said
    assert said.count("\n") == 1 and "Traceback" not in said, said
    assert "cache_aware_threshold: the log 0.0, the twin 0.5" in said, said


def test_a_watermark_vllm_does_not_have_is_refused_where_it_keeps_blocks(tmp_path: Path) -> None:
    """A Vidur-style watermark (of the usable blocks, whatever runs) is no vLLM setting: where
    it keeps blocks free, vllm-v1 cannot take it and says which settings differ (by the blocks,
    not the watermark's kind). Vidur's own 0.01 keeps none of 24 blocks: not compared."""
    flat = CFG.replace(enable_prefix_caching=False)
    vidur_like = ArPolicy(watermark_fraction=0.25, full_sequence_admission=True)
    events = events_of(2, config=flat, policy=vidur_like)
    code, said = check(
        log_of(tmp_path / "log.jsonl", events, vidur_like, flat), "--twin", "vllm-v1"
    )
    assert code == 2 and said.count("\n") == 1, said
    assert "(watermark_blocks: the log 6, the twin 0), or --twin-as-declared" in said, said
    vidurs = ArPolicy(watermark_fraction=0.01, full_sequence_admission=True)
    events = events_of(2, config=flat, policy=vidurs)
    code, said = check(log_of(tmp_path / "0.jsonl", events, vidurs, flat), "--twin", "vllm-v1")
    assert code in (0, 1) and "invalid" not in said and "vllm-v1 with" not in said, said


def test_the_profile_gives_the_settings_of_a_log_that_declares_none(tmp_path: Path) -> None:
    """A header without a policy, of a run whose watermark binds (8 usable blocks), checked
    `--profile vllm-v1-watermark`: the profile's watermark is the log's, so vllm-v1-prefix
    takes it and decides alike; without the profile it runs as it is, and decides otherwise."""
    small = CFG.replace(num_blocks=9)
    impl = VLLM_V1_WATERMARK
    events = events_of(0, impl.factory, impl.profile.policy, small)
    log = log_of(tmp_path / "log.jsonl", events, None, small)
    code, said = check(log, "--profile", "vllm-v1-watermark", "--twin", "vllm-v1-prefix")
    assert code == 0, said
    assert "vllm-v1-prefix with the log's watermark_fraction=0.25 (2 blocks) decides" in said
    code, said = check(log, "--twin", "vllm-v1-prefix")
    assert code == 1 and "[twin_decisions] against vllm-v1-prefix: step " in said, said


@pytest.mark.parametrize(
    "config",
    [CFG.replace(policy=Policy.PRIORITY), CFG.replace(enable_prefix_caching=False)],
    ids=["priority", "no-prefix-caching"],
)
def test_a_window_vllm_does_not_apply_is_not_compared(config: ArConfig) -> None:
    """Under priority, or without prefix caching, vLLM applies no window: a log declaring none
    and a twin declaring one have the same settings in effect."""
    plain = VLLM_V1_CACHE_AWARE.profile.policy
    window = window_applies(config)
    assert settings_in_effect(plain, window) == settings_in_effect(
        dataclasses.replace(plain, cache_aware_window=0), window
    )
    assert window_applies(CFG)
    assert settings_in_effect(plain, True) != settings_in_effect(
        dataclasses.replace(plain, cache_aware_window=0), True
    )


def run(*argv: str) -> tuple[int, str]:
    """`schedspec ARGV`: its exit code and what it printed."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", out)
        mp.setattr("sys.stderr", out)
        code = main(list(argv))
    return code, out.getvalue()


def test_verify_runs_a_vllm_twin_with_the_implementations_settings() -> None:
    """`verify --impl vllm-v1-adaptive --twin vllm-v1-watermark`: the twin drops its watermark
    and takes the adaptive threshold, and the two decide alike (before, the twin's own
    watermark failed twin_decisions within 40 examples); the table names what it took."""
    code, said = run(
        "verify", "--impl", "vllm-v1-adaptive", "--twin", "vllm-v1-watermark", "--examples", "40"
    )
    assert code == 0, said
    taken = "watermark_fraction=0.0, adaptive_long_prefill_threshold=True"
    assert f"vllm-v1-watermark with vllm-v1-adaptive's {taken}" in said, said


def test_verify_refuses_a_twin_of_other_settings_it_cannot_take() -> None:
    """Vidur's released vLLM scheduler keeps a watermark of 0.01; the fixed twin declares none,
    and no Vidur twin is rebuilt: exit 2 before any example, one line naming the setting."""
    code, said = run(
        "verify", "--impl", "vidur-vllm-released", "--twin", "vidur-vllm", "--examples", "5"
    )
    assert code == 2 and said.count("\n") == 1, said
    assert "watermark_fraction: vidur-vllm-released 0.01, the twin 0.0" in said, said


def test_a_bare_factory_declares_no_settings() -> None:
    """A bare factory is checked under no declared policy: the twin runs as it is, while the
    implementation that declares the same scheduler's settings gets a rebuilt twin."""
    twin = installed_twin("vllm-v1", Family.AR)  # reserves whole sequences, as declared
    bare = resolve("reference.ar.vllm_v1:make_vllm_v1_033", Family.AR)
    assert twin_for_target(twin, bare) is twin
    declared = twin_for_target(twin, resolve("vllm-v1-no-reserve", Family.AR))
    assert declared.name == "vllm-v1 with vllm-v1-no-reserve's full_sequence_admission=False"


def test_the_bare_factory_of_a_variant_takes_the_threshold_too(tmp_path: Path) -> None:
    """A bare factory declares no policy, yet the reference knows the settings it runs: the
    cache-aware variant's factory is rebuilt at the log's threshold as its implementation is."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    bare = "reference.ar.vllm_settings:make_vllm_v1_cache_aware"
    code, said = check(log, "--twin", bare)
    assert code == 0 and f"{bare} with the log's cache_aware_threshold=0.0 decides" in said, said


def test_a_users_wrapper_of_a_reference_factory_is_not_rebuilt(tmp_path: Path) -> None:
    """A twin of the user's own that wraps the reference's factory is another scheduler: it is
    refused for the log's window, not silently replaced by the stock reference."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    code, said = check(log, "--twin", f"{__name__}:WRAPPED")
    assert code == 2 and "cache_aware_window: the log 3, the twin 0" in said, said


def test_a_header_declaring_null_declares_no_settings(tmp_path: Path) -> None:
    """`"declared_policy": null` declares nothing, for the twin as for the check: the twin runs
    as it is."""
    path = tmp_path / "log.jsonl"
    log_of(path, events_of(0, VLLM_V1_PREFIX.factory, VLLM_V1_PREFIX.profile.policy), None)
    lines = path.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "declared_policy": None})
    path.write_text("\n".join(lines) + "\n")
    code, said = check(str(path), "--twin", "vllm-v1-prefix")
    assert code == 0 and "its twin vllm-v1-prefix decides alike" in said, said


def test_a_refusal_for_the_space_names_the_twin_as_given(tmp_path: Path) -> None:
    """A twin outside the log's space is refused under the name the user gave, not the one it
    would have taken with the log's settings."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    code, said = check(log, "--twin", "vllm-v1")
    assert code == 2 and "invalid --twin='vllm-v1': a twin whose declared space" in said, said


def test_twin_as_declared_runs_the_twin_with_its_own_settings(tmp_path: Path) -> None:
    """`--twin-as-declared`: the cache-aware twin keeps its threshold of 0.5 and decides
    otherwise on a threshold-0 log (exit 1); without --twin the flag is an input error; verify
    takes it too."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    code, said = check(log, "--twin", CACHE_AWARE, "--twin-as-declared")
    assert code == 1 and f"[twin_decisions] against {CACHE_AWARE}: step " in said, said
    code, said = check(log, "--twin-as-declared")
    assert code == 2 and "--twin-as-declared" in said and said.count("\n") == 1, said
    argv = ("verify", "--impl", "vllm-v1-adaptive", "--twin", "vllm-v1-watermark")
    code, said = run(*argv, "--twin-as-declared", "--examples", "40")
    assert code == 1 and "twin_decisions" in said, said


def test_a_rebuilt_twin_takes_every_setting_and_keeps_its_other_options() -> None:
    """`with_vllm_settings` on the cadence twin with the candidate fix: every setting is the
    declared one, the fix (`lift_empty_hold`) and vLLM 0.33.0's other options are kept; a
    watermark other than vLLM's (either of its two kinds missing) is none it can take."""
    declared = ArPolicy(
        watermark_fraction=0.1,
        watermark_of_pool=True,
        watermark_beside_running=True,
        adaptive_long_prefill_threshold=True,
        prefill_interval=2,
        full_sequence_admission=False,
        cache_aware_window=2,
        cache_aware_threshold=0.3,
    )
    rebuilt = with_vllm_settings(VLLM_V1_CADENCE_FIXED.factory, declared)
    assert rebuilt is not None
    adapter = rebuilt(CFG, lambda _: None)
    assert isinstance(adapter, PrefixCachingVllmV1)
    assert adapter.options == dataclasses.replace(
        VLLM_033_CADENCE_FIXED,
        watermark=0.1,
        adaptive_threshold=True,
        prefill_interval=2,
        full_sequence_admission=False,
        cache_aware_window=2,
        cache_aware_threshold=0.3,
    )
    for other in (
        dataclasses.replace(declared, watermark_of_pool=False),
        dataclasses.replace(declared, watermark_beside_running=False),
    ):
        assert with_vllm_settings(VLLM_V1_CADENCE_FIXED.factory, other) is None, other
    assert with_vllm_settings(WRAPPED.factory, declared) is None


def test_settings_in_effect_leave_out_what_no_decision_reads() -> None:
    """No threshold without a window, no watermark kind without a watermark, and under a
    log's configuration the watermark as the blocks it keeps free (its kind folded in)."""
    plain = ArPolicy(cache_aware_threshold=0.3, watermark_of_pool=True)
    assert settings_in_effect(plain, True) == settings_in_effect(ArPolicy(), True)
    assert "cache_aware_threshold" not in settings_in_effect(plain, True)
    vllms = ArPolicy(watermark_fraction=0.25, watermark_of_pool=True)
    vidurs = ArPolicy(watermark_fraction=0.25)
    assert settings_in_effect(vllms, False) != settings_in_effect(vidurs, False)
    # 25 blocks, 24 usable: int(0.25 * 25) == int(0.25 * 24) == 6
    assert settings_in_effect(vllms, False, CFG) == settings_in_effect(vidurs, False, CFG)
    assert settings_in_effect(vidurs, False, CFG)["watermark_blocks"] == 6
    tiny = ArPolicy(watermark_fraction=0.01, watermark_beside_running=True)
    assert settings_in_effect(tiny, False, CFG) == settings_in_effect(ArPolicy(), False, CFG)


def test_a_rebuilt_twin_keeps_the_space_it_declares() -> None:
    """The rebuilt twin runs the configurations the named twin declares: its space is kept."""
    twin = installed_twin(CACHE_AWARE, Family.AR)
    assert isinstance(twin, ArTwin)
    rebuilt = with_settings(twin, THRESHOLD_0, True, "the log", CFG)
    assert rebuilt is not twin and rebuilt.space == twin.space and rebuilt.space is not None
