"""An AR twin runs with the scheduler settings of what it is compared with
(`schedspec_cli.twin_settings`): `check-trace --twin` on a log that declares them, `verify
--twin` beside an implementation whose profile does. A vLLM reference twin takes each
declared setting (a cache-aware threshold of 0, a window, a watermark); a setting left at the
idealised default declares nothing; any other twin runs as it is, with a note naming the
declared settings it runs otherwise; settings that bear on no decision are not compared."""

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
    VLLM_V1_NO_RESERVE,
    VLLM_V1_WATERMARK,
    vllm_settings_of,
    with_vllm_settings,
)
from reference.ar.vllm_v1 import VLLM_033, VllmOptions
from reference.dllm import REFERENCE_DLLM
from schedspec_cli.impls import resolve
from schedspec_cli.main import main
from schedspec_cli.trace_profile import ar_log_difference
from schedspec_cli.twin_settings import (
    settings_in_effect,
    window_applies,
    window_applies_in,
    with_settings,
)
from schedspec_cli.twins import installed_twin, twin_for_target
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import ArEvent
from spec.ar.profile import ArPolicy
from spec.ar.trace import ar_config_to_dict, ar_policy_stated, write_ar_trace
from spec.errors import ConfigError
from spec.implementation import ArImplementation, Family
from tests.test_check_trace_profile import _write_dllm, record_dllm_run

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


def twin_033(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """vllm-v1 (vLLM 0.33.0's options, whole sequences reserved), the log's scheduler."""
    return PrefixCachingVllmV1(config, sink, VLLM_033)


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


def run(*argv: str) -> tuple[int, str]:
    """`schedspec ARGV`: its exit code and what it printed."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", out)
        mp.setattr("sys.stderr", out)
        code = main(list(argv))
    return code, out.getvalue()


def check(path: str, *flags: str) -> tuple[int, str]:
    """`check-trace PATH FLAGS`: its exit code and what it printed."""
    return run("check-trace", path, *flags)


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
        assert f"its twin {CACHE_AWARE} (with cache_aware_threshold=0.0) decides" in said
    assert apart >= 6, apart


def test_a_plain_vllm_twin_takes_the_window_too(tmp_path: Path) -> None:
    """vllm-v1-prefix declares no window: it takes the log's window and threshold, and
    `--json` names the twin and the settings it took."""
    log = log_of(tmp_path / "log.jsonl", events_of(1), THRESHOLD_0)
    verdict = tmp_path / "verdict.json"
    code, said = check(log, "--twin", "vllm-v1-prefix", "--json", str(verdict))
    taken = "vllm-v1-prefix (with cache_aware_window=3, cache_aware_threshold=0.0)"
    assert code == 0 and f"its twin {taken} decides alike" in said, said
    written = json.loads(verdict.read_text())
    assert written["twin"] == "vllm-v1-prefix" and written["twin_note"] is None
    assert written["twin_settings"] == {"cache_aware_window": 3, "cache_aware_threshold": 0.0}


def test_a_twin_of_the_users_own_with_other_settings_runs_with_a_note(tmp_path: Path) -> None:
    """A twin that declares threshold 0.5 (nothing rebuilds it) runs as it is: a note names
    the setting, the log's value and the twin's, and the difference it finds follows."""
    log = log_of(tmp_path / "log.jsonl", events_of(1), THRESHOLD_0)
    verdict = tmp_path / "verdict.json"
    code, said = check(log, "--twin", f"{__name__}:HALF", "--json", str(verdict))
    assert code == 1 and "[twin_decisions] against" in said, said
    note = "runs its own settings, not those the log declares (cache_aware_threshold: the log "
    assert f"note: {log}: {__name__}:HALF {note}0.0, the twin 0.5)" in said, said
    assert "cache_aware_threshold" in json.loads(verdict.read_text())["twin_note"]


def test_a_watermark_vllm_does_not_have_keeps_the_twin_as_it_is(tmp_path: Path) -> None:
    """A Vidur-style watermark (of the usable blocks, whatever runs) is no vLLM setting: where
    it keeps blocks free, vllm-v1 runs as it is and the note says so (by the blocks, not the
    watermark's kind). Vidur's own 0.01 keeps none of 24 blocks: no note."""
    flat = CFG.replace(enable_prefix_caching=False)
    vidur_like = ArPolicy(watermark_fraction=0.25, full_sequence_admission=True)
    events = events_of(2, config=flat, policy=vidur_like)
    code, said = check(
        log_of(tmp_path / "log.jsonl", events, vidur_like, flat), "--twin", "vllm-v1"
    )
    assert code in (0, 1) and "(watermark_blocks: the log 6, the twin 0)" in said, said
    vidurs = ArPolicy(watermark_fraction=0.01, full_sequence_admission=True)
    events = events_of(2, config=flat, policy=vidurs)
    code, said = check(log_of(tmp_path / "0.jsonl", events, vidurs, flat), "--twin", "vllm-v1")
    assert code in (0, 1) and "note:" not in said and "vllm-v1 (with" not in said, said


def test_a_setting_left_at_its_default_declares_nothing(tmp_path: Path) -> None:
    """A header that declares only the lone-request exemption says nothing of the
    whole-sequence reservation: vllm-v1 keeps its own, with no note."""
    flat = CFG.replace(enable_prefix_caching=False)
    partial = ArPolicy(lone_request_threshold_exempt=True)
    log = log_of(tmp_path / "log.jsonl", events_of(4, twin_033, partial, flat), partial, flat)
    code, said = check(log, "--twin", "vllm-v1")
    assert code == 0 and "its twin vllm-v1 decides alike" in said and "note" not in said, said


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
    assert "vllm-v1-prefix (with watermark_fraction=0.25) decides" in said, said
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


def test_verify_runs_a_vllm_twin_with_the_implementations_settings(tmp_path: Path) -> None:
    """`verify --impl vllm-v1-watermark --twin vllm-v1-no-reserve`: the twin takes the
    watermark and the whole-sequence reservation, and the two decide alike (the twin as it
    declares itself fails twin_decisions, `--twin-as-declared`); the line below the table and
    the JSON name what it took."""
    argv = ("verify", "--impl", "vllm-v1-watermark", "--twin", "vllm-v1-no-reserve")
    written = tmp_path / "verify.json"
    code, said = run(*argv, "--examples", "40", "--json", str(written))
    assert code == 0, said
    took = "watermark_fraction=0.25, full_sequence_admission=True"
    assert f"vllm-v1-watermark: its twin vllm-v1-no-reserve (with {took})" in said, said
    result = json.loads(written.read_text())  # one implementation: its result
    assert result["twin"] == "vllm-v1-no-reserve"
    assert result["twin_settings"] == {"watermark_fraction": 0.25, "full_sequence_admission": True}
    code, said = run(*argv, "--twin-as-declared", "--examples", "40")
    assert code == 1 and "twin_decisions" in said, said


def test_verify_notes_a_twin_that_cannot_take_the_settings() -> None:
    """Vidur's released vLLM scheduler keeps a watermark of 0.01; the fixed twin declares none
    and no Vidur twin is rebuilt: the run goes on, and a line below the table says so."""
    code, said = run(
        "verify", "--impl", "vidur-vllm-released", "--twin", "vidur-vllm", "--examples", "5"
    )
    note = (
        "vidur-vllm-released: note: vidur-vllm runs its own settings, not those "
        "vidur-vllm-released declares (watermark_fraction: vidur-vllm-released 0.01, the twin "
        "0.0)"
    )
    assert code in (0, 1) and note in said, said


def test_twin_as_declared_is_refused_where_it_says_nothing() -> None:
    """`--twin-as-declared` without `--twin`, or with a dLLM implementation: exit 2, one
    line."""
    for argv in (
        ("verify", "--impl", "vllm-v1", "--twin-as-declared"),
        ("verify", "--impl", "reference-dllm", "--twin", "reference-dllm", "--twin-as-declared"),
    ):
        code, said = run(*argv, "--examples", "2")
        assert code == 2 and "--twin-as-declared" in said and said.count("\n") == 1, said


def test_a_bare_factory_declares_no_settings() -> None:
    """A bare factory is checked under no declared policy: the twin runs as it is, while the
    implementation that declares a watermark gets a twin rebuilt with it."""
    twin = installed_twin("vllm-v1", Family.AR)
    bare = resolve("reference.ar.vllm_v1:make_vllm_v1_033", Family.AR)
    assert twin_for_target(twin, bare) == (twin, "")
    declared, note = twin_for_target(twin, resolve("vllm-v1-watermark", Family.AR))
    assert isinstance(declared, ArTwin) and note == ""
    assert dict(declared.took) == {"watermark_fraction": 0.25}


def test_the_bare_factory_of_a_variant_takes_the_threshold_too(tmp_path: Path) -> None:
    """A bare factory declares no policy, yet the reference knows the settings it runs: the
    cache-aware variant's factory is rebuilt at the log's threshold as its implementation is."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    bare = "reference.ar.vllm_settings:make_vllm_v1_cache_aware"
    code, said = check(log, "--twin", bare)
    assert code == 0 and f"{bare} (with cache_aware_threshold=0.0) decides" in said, said


def test_a_users_wrapper_of_a_reference_factory_is_not_rebuilt(tmp_path: Path) -> None:
    """A twin of the user's own that wraps the reference's factory is another scheduler: it
    runs as it is, with a note for the log's window, not silently replaced by the stock
    reference."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    code, said = check(log, "--twin", f"{__name__}:WRAPPED")
    assert code in (0, 1) and "(cache_aware_window: the log 3, the twin 0" in said, said


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
    otherwise on a threshold-0 log (exit 1); without --twin the flag is an input error."""
    log = log_of(tmp_path / "log.jsonl", events_of(0), THRESHOLD_0)
    code, said = check(log, "--twin", CACHE_AWARE, "--twin-as-declared")
    assert code == 1 and f"[twin_decisions] against {CACHE_AWARE}: step " in said, said
    code, said = check(log, "--twin-as-declared")
    assert code == 2 and "--twin-as-declared" in said and said.count("\n") == 1, said


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
    rebuilt, note = with_settings(twin, THRESHOLD_0, True, "the log", CFG)
    assert rebuilt is not twin and rebuilt.space == twin.space and rebuilt.space is not None
    assert note == "" and rebuilt.took == (("cache_aware_threshold", 0.0),)


def test_window_and_settings_of_the_references() -> None:
    """Where a space holds a configuration with a window (FCFS with prefix caching), and the
    settings a bare reference factory runs (vLLM's watermark: of the pool, beside a running
    request)."""
    assert window_applies_in(VLLM_V1_CACHE_AWARE.profile.space)
    assert not window_applies_in(
        VLLM_V1_PREFIX.profile.space.__class__(prefix_caching=frozenset({False}))
    )
    assert not window_applies_in(
        VLLM_V1_PREFIX.profile.space.__class__(policies=frozenset({Policy.PRIORITY}))
    )
    watermark = vllm_settings_of(VLLM_V1_WATERMARK.factory)
    assert watermark is not None
    assert (watermark.watermark_fraction, watermark.watermark_of_pool) == (0.25, True)
    assert watermark.watermark_beside_running and watermark.full_sequence_admission
    assert vllm_settings_of(WRAPPED.factory) is None


def test_bench_runs_the_twin_with_the_implementations_settings() -> None:
    """`bench conformance --twin` takes the settings as verify does: the watermark pair
    passes there too."""
    code, said = run(
        "bench",
        "conformance",
        "--impl",
        "vllm-v1-watermark",
        "--twin",
        "vllm-v1-no-reserve",
        "--examples",
        "20",
    )
    assert code == 0, said
    rows = [line for line in said.splitlines() if line.startswith("vllm-v1-watermark")]
    assert len(rows) == 2 and all(" True " in row for row in rows), said


def test_a_twin_keeps_the_settings_the_log_leaves_undeclared(tmp_path: Path) -> None:
    """A log that declares a window and no watermark, against vllm-v1-watermark: the twin
    takes the window and keeps its own watermark (of vLLM's kind), with no note."""
    log = log_of(tmp_path / "log.jsonl", events_of(1), THRESHOLD_0)
    code, said = check(log, "--twin", "vllm-v1-watermark")
    took = "(with cache_aware_window=3, cache_aware_threshold=0.0)"
    assert f"its twin vllm-v1-watermark {took}" in said and "note:" not in said, said
    assert code in (0, 1), said


def test_a_declared_window_declares_its_threshold_too() -> None:
    """A window declared at the default threshold (0.5, left out of a header) declares that
    threshold: a twin at threshold 0 takes 0.5."""
    as_declared = VLLM_V1_CACHE_AWARE.profile
    at_0 = ArTwin("at-0", VLLM_V1_CACHE_AWARE.factory, THRESHOLD_0, as_declared.space)
    rebuilt, note = with_settings(at_0, as_declared.policy, True, "the log", CFG)
    assert note == "" and rebuilt.took == (("cache_aware_threshold", 0.5),)


def test_twin_as_declared_is_refused_for_a_dllm_log(tmp_path: Path) -> None:
    """A dLLM twin takes no settings: the flag on a dLLM log is exit 2, one line."""
    log = _write_dllm(tmp_path / "dllm.jsonl", record_dllm_run(REFERENCE_DLLM))
    code, said = check(log, "--twin", "reference-dllm", "--twin-as-declared")
    assert code == 2 and "only for an AR log" in said and said.count("\n") == 1, said


def test_a_setting_the_header_writes_out_at_its_default_is_declared(tmp_path: Path) -> None:
    """A log of the reference without the whole-sequence reservation (`vllm-v1-no-reserve`,
    8 usable blocks): its header leaving `full_sequence_admission` out says nothing, so
    vllm-v1 keeps its own reservation and decides otherwise; written out as false (as the
    live vLLM log writes it, `ar_config_to_dict`'s `stated`), it is declared, and vllm-v1 is
    rebuilt without it and decides alike."""
    small = CFG.replace(enable_prefix_caching=False, num_blocks=9)
    policy = VLLM_V1_NO_RESERVE.profile.policy
    events = events_of(0, VLLM_V1_NO_RESERVE.factory, policy, small)
    log = Path(log_of(tmp_path / "log.jsonl", events, policy, small))
    code, said = check(str(log), "--twin", "vllm-v1")
    assert code == 1 and "[twin_decisions] against vllm-v1: step " in said, said
    lines = log.read_text(encoding="utf-8").splitlines()
    header = ar_config_to_dict(small, policy, stated=("full_sequence_admission",))
    assert header["declared_policy"]["full_sequence_admission"] is False
    assert ar_policy_stated(header) == frozenset(header["declared_policy"])
    log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    code, said = check(str(log), "--twin", "vllm-v1")
    assert code == 0, said
    assert "vllm-v1 (with full_sequence_admission=False) decides alike" in said, said
    with pytest.raises(ConfigError, match="an ArPolicy option"):
        ar_config_to_dict(small, policy, stated=("rules",))
