"""`check-trace --profile` and `--twin`: a log checked under the policy its engine declares, and
its decisions compared with a decision twin's (both families, through the command line).

The logs are recorded here from the references, which stand in for engines: SGLang's dLLM order
(`sglang-dllm-order`: prefill first, not work-conserving on purpose), the idealised reference,
vLLM's decision rules (`vllm-v1`) and Vidur's vLLM replica scheduler (`vidur-vllm`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from properties.ar.decisions import operations as ar_operations
from properties.ar.harness import ArHarness
from properties.ar.trace_check import check_ar_trace
from properties.decisions import operations
from properties.harness import Harness
from properties.trace_check import check_trace
from properties.workload import apply_ops
from reference.ar.vidur import VIDUR_VLLM
from reference.ar.vllm_v1 import VLLM_V1
from reference.dllm import REFERENCE_DLLM
from reference.sglang_dllm import SGLANG_DLLM_ORDER
from schedspec_cli.main import main
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent
from spec.ar.profile import ArPolicy
from spec.ar.trace import ar_config_to_dict, write_ar_trace
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.events import ControlReturned, Event
from spec.implementation import ArImplementation, DllmImplementation
from spec.profile import AcceptedDeviation, DllmAdmission, DllmPolicy, DllmProfile
from spec.trace import config_to_dict, event_to_dict, iter_trace, policy_from_dict

DLLM = DllmConfig(
    block_size=2, page_size=2, kv_pages=20, req_pool_rows=3, max_running_requests=3, mode=Mode.FDFO
)
AR = ArConfig(
    block_size=4,
    num_blocks=24,
    max_num_seqs=3,
    max_num_batched_tokens=64,
    max_model_len=64,
    enable_chunked_prefill=False,
)

#: SGLang's order with its work-conservation deviation declared instead of its policy option.
SGLANG_AS_DEVIATION = DllmProfile(
    policy=DllmPolicy(admission=DllmAdmission.PREFILL_FIRST),
    deviations=(AcceptedDeviation("work_conserving", "holds work back while a prefill runs"),),
)


def record_dllm_run(impl: DllmImplementation, config: DllmConfig = DLLM) -> list[Event]:
    """A run with arrivals between rounds and an abort, drained (seed 9: SGLang's order admits
    out of FCFS order, and holds a fitting request back, in it). tests/test_real_sglang.py
    records SGLang's own scheduler on it."""
    h = Harness(impl.factory, config, profile=impl.profile)
    rng = random.Random(9)
    for i in range(8):
        prompt = tuple(rng.randrange(5, 20) for _ in range(rng.randrange(1, 5)))
        h.submit(RequestSpec(f"r{i}", prompt, rng.randrange(1, 7)))
        if i % 2:
            h.round()
        if i == 5:
            h.abort("r4")
    h.drain()
    return list(h.events)


def _write_dllm(
    path: Path, events: list[Event], policy: DllmPolicy | None = None, config: DllmConfig = DLLM
) -> str:
    lines = [json.dumps(config_to_dict(config, policy))]
    lines += [json.dumps(event_to_dict(e)) for e in events]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _ar_events(impl: ArImplementation) -> list[ArEvent]:
    h = ArHarness(impl.factory, AR)
    rng = random.Random(2)
    for i in range(10):
        out = rng.randrange(1, 20)
        stop = rng.randrange(1, out + 1) if rng.random() < 0.3 else None
        h.submit(ArRequest(f"r{i}", rng.randrange(1, 30), out, stop_after=stop))
        h.step()
        if i == 6:
            h.abort("r3")
    h.drain()
    return list(h.events)


def _write_ar(path: Path, events: list[ArEvent], impl: ArImplementation | None = None) -> str:
    with path.open("w", encoding="utf-8") as out:
        write_ar_trace(events, out, AR)
    if impl is not None:  # the header declares the implementation's policy
        lines = path.read_text(encoding="utf-8").splitlines()
        lines[0] = json.dumps(ar_config_to_dict(AR, impl.profile.policy))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["check-trace", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# ---------------------------------------------------------------------------- dLLM: --profile


def test_an_engine_log_breaks_the_idealised_spec_only_where_its_profile_declares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_dllm(tmp_path / "sglang.jsonl", record_dllm_run(SGLANG_DLLM_ORDER))
    code, out = _cli(capsys, log)
    assert code == 1 and "[fcfs_admission]" in out, out
    code, out = _cli(capsys, log, "--profile", "sglang-dllm-order")
    assert code == 0, out
    assert "conform to the spec under the profile of sglang-dllm-order" in out


def test_the_header_may_declare_the_policy_and_a_profile_must_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = SGLANG_DLLM_ORDER.profile.policy
    log = _write_dllm(tmp_path / "declared.jsonl", record_dllm_run(SGLANG_DLLM_ORDER), policy)
    code, out = _cli(capsys, log)
    assert code == 0 and "under the policy its header declares" in out, out
    assert _cli(capsys, log, "--profile", "sglang-dllm-order")[0] == 0
    code, out = _cli(capsys, log, "--profile", "reference-dllm")  # the idealised policy
    assert code == 2 and "declares {'admission': 'prefill-first'" in out, out
    # named by the --profile given, with its own policy (the idealised spec's is empty)
    assert "invalid --profile='reference-dllm'" in out and "(this profile's policy: {})" in out
    assert out.count("\n") == 1 and "Traceback" not in out


def test_a_declared_policy_round_trips_through_the_header() -> None:
    policy = DllmPolicy(
        admission=DllmAdmission.PREFILL_FIRST, reserved_kv_pages=1, work_conserving=False
    )
    header = json.dumps(config_to_dict(DLLM, policy))
    items = [item for _, item in iter_trace([header])]
    assert items == [DLLM, policy]
    assert [item for _, item in iter_trace([json.dumps(config_to_dict(DLLM))])] == [DLLM]
    assert "declared_policy" not in config_to_dict(DLLM, DllmPolicy())  # the idealised: nothing


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ({"admission": "lifo"}, "must be one of ['fcfs', 'prefill-first']"),
        ({"work_conserving": "no"}, "must be true or false"),
        ({"greedy": True}, "unknown declared_policy fields ['greedy']"),
        ({"reserved_rows": -1}, "policy.reserved_rows"),
        (3, "must be a JSON object"),
    ],
)
def test_a_bad_declared_policy_is_named_with_its_line(declared: object, says: str) -> None:
    from spec.trace import TraceFormatError

    with pytest.raises(TraceFormatError, match=r"trace line 4: .*") as err:
        policy_from_dict(declared, 4)
    assert says in str(err.value)


def test_a_deviation_the_profile_accepts_is_reported_and_stops_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_dllm(tmp_path / "sglang.jsonl", record_dllm_run(SGLANG_DLLM_ORDER))
    code, out = _cli(capsys, log, "--profile", "tests.test_check_trace_profile:SGLANG_AS_DEVIATION")
    assert code == 0, out
    assert out.startswith(f"ACCEPTED {log}:") and "[work_conserving] is a deviation" in out
    assert "the log after this line is not checked" in out


# ---------------------------------------------------------------------------- dLLM: --twin


def test_the_twin_of_the_engine_decides_alike_and_another_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_dllm(tmp_path / "sglang.jsonl", record_dllm_run(SGLANG_DLLM_ORDER))
    code, out = _cli(capsys, log, "--profile", "sglang-dllm-order", "--twin", "sglang-dllm-order")
    assert code == 0, out
    assert "its twin sglang-dllm-order decides alike in all" in out
    # the log conforms to its engine's profile; the FCFS reference, run on the same operations
    # and checked under its own profile, decides otherwise
    code, out = _cli(capsys, log, "--profile", "sglang-dllm-order", "--twin", "reference-dllm")
    assert code == 1, out
    assert "[twin_decisions] against reference-dllm: round " in out
    assert "the log forwards" in out or "the log admits" in out


def test_a_log_cut_between_rounds_is_compared_up_to_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = record_dllm_run(REFERENCE_DLLM)
    ends = [i for i, e in enumerate(events) if isinstance(e, ControlReturned)]
    cut = events[: ends[len(ends) // 2] + 1]  # work still running after this round
    log = _write_dllm(tmp_path / "cut.jsonl", cut)
    code, out = _cli(capsys, log, "--twin", "reference-dllm")
    assert code == 0, out
    assert "the log ends with work still running" in out and "decides alike" in out
    # the twin is not drained past the log's end: were it, it would run rounds the log lacks
    code, out = _cli(capsys, log, "--twin", "reference-dllm", "--require-idle")
    assert code == 1 and "--require-idle" in out


def test_a_twin_that_cannot_run_the_logs_configuration_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # block 2, page 4: the profile declares pages equal to blocks only (as SGLang)
    config = DllmConfig(block_size=2, page_size=4, kv_pages=20, req_pool_rows=3)
    log = _write_dllm(
        tmp_path / "pages.jsonl", record_dllm_run(REFERENCE_DLLM, config), None, config
    )
    code, out = _cli(capsys, log, "--twin", "tests.test_check_trace_profile:pages_equal_blocks")
    assert code == 2 and "invalid --twin=" in out and "runs the log's configuration" in out, out
    assert out.count("\n") == 1


def pages_equal_blocks(events: object, config: DllmConfig) -> object:
    """A decision twin (the reference) that refuses pages larger than blocks."""
    from reference.dllm import REFERENCE_TWIN

    if config.page_size != config.block_size:
        raise ConfigError("page_size", config.page_size, "equal to block_size")
    return REFERENCE_TWIN(events, config)  # type: ignore[arg-type]


def test_the_logs_operations_reproduce_it_on_the_same_scheduler() -> None:
    events = record_dllm_run(REFERENCE_DLLM)
    h = Harness(REFERENCE_DLLM.factory, DLLM)
    apply_ops(h, operations(events))
    assert [e for e in h.events] == events


def test_the_python_api_keeps_the_checked_events_and_refuses_a_conflicting_policy(
    tmp_path: Path,
) -> None:
    events = record_dllm_run(SGLANG_DLLM_ORDER)
    declared = SGLANG_DLLM_ORDER.profile.policy
    log = _write_dllm(tmp_path / "declared.jsonl", events, declared)
    kept: list[Event] = []
    res = check_trace(log, keep=kept)
    assert res.ok and kept == events and res.policy == declared and res.config == DLLM
    with pytest.raises(ConfigError, match=r"the trace's own header \(line 1\) declares"):
        check_trace(log, policy=DllmPolicy())


# ---------------------------------------------------------------------------- AR


def test_an_ar_log_decides_as_its_twin_and_not_as_another_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_ar(tmp_path / "vidur.jsonl", _ar_events(VIDUR_VLLM), VIDUR_VLLM)
    code, out = _cli(capsys, log, "--profile", "vidur-vllm", "--twin", "vidur-vllm")
    assert code == 0, out
    assert "under the profile of vidur-vllm" in out and "decides alike in all" in out
    code, out = _cli(capsys, log, "--twin", "vllm-v1")
    assert code == 1, out
    assert "[twin_decisions] against vllm-v1: step " in out and "the log schedules" in out


@pytest.mark.parametrize(
    ("caching", "twin"), [(True, "vllm-v1"), (False, "vllm-v1-prefix")]
)  # fmt: skip
def test_an_ar_twin_whose_declared_space_lacks_the_logs_configuration_is_an_input_error(
    caching: bool, twin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `verify --twin` refuses a twin that does not declare the configurations it would be
    compared on: `vllm-v1` declares no prefix caching, `vllm-v1-prefix` only prefix caching.
    Before, a prefix-caching vLLM log against `vllm-v1` failed by twin_decisions (a false
    failure of stock vLLM) and a plain log was taken by `vllm-v1-prefix`."""
    config = AR.replace(enable_prefix_caching=caching)
    log = tmp_path / "log.jsonl"
    with log.open("w", encoding="utf-8") as written:
        write_ar_trace(_ar_events(VLLM_V1), written, config)
    code, out = _cli(capsys, str(log), "--twin", twin)
    assert code == 2 and f"invalid --twin={twin!r}" in out, out
    assert f"enable_prefix_caching={caching}" in out and out.count("\n") == 1, out


def test_an_ar_profile_that_contradicts_the_header_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_ar(tmp_path / "vidur.jsonl", _ar_events(VIDUR_VLLM), VIDUR_VLLM)
    code, out = _cli(capsys, log, "--profile", "vllm-v1")
    assert code == 2 and "the trace's own header, which declares" in out, out
    assert "invalid --profile='vllm-v1'" in out  # the name given, not the policy alone
    assert out.count("\n") == 1


def test_an_ar_profile_fills_the_ordering_rules_its_adapter_states(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_ar(tmp_path / "vllm.jsonl", _ar_events(VLLM_V1))
    kept: list[ArEvent] = []
    res = check_ar_trace(log, keep=kept)
    assert res.ok and res.idle_at_end and len(kept) == res.events
    code, out = _cli(capsys, log, "--profile", "vllm-v1", "--twin", "vllm-v1")
    assert code == 0 and "decides alike in all" in out, out
    # the profile's space refuses a configuration it does not run
    code, out = _cli(capsys, log, "--profile", "vidur-sarathi")
    assert code == 2 and "a profile whose declared space holds the log's configuration" in out


def test_an_ar_profile_takes_its_open_ordering_rules_from_its_adapter() -> None:
    """vLLM 0.33 under the priority policy picks its victim among all running requests; its
    profile leaves the rules open and its adapter states them, as `verify --impl` reads them."""
    from schedspec_cli.trace_profile import ar_policy_for, resolve_trace_profile
    from spec.ar.config import Policy, VictimOrder
    from spec.implementation import Family

    priority = AR.replace(policy=Policy.PRIORITY)
    named = resolve_trace_profile("vllm-v1", Family.AR)
    assert isinstance(named.profile.policy, ArPolicy) and named.profile.policy.rules is None
    rules = ar_policy_for(named, priority).rules
    assert rules is not None and rules.victim is VictimOrder.LOWEST_PRIORITY_ANY
    bare = resolve_trace_profile("tests.test_check_trace_profile:VLLM_PROFILE_ONLY", Family.AR)
    assert ar_policy_for(bare, priority).rules is None  # a bare profile: the spec's own rules


VLLM_PROFILE_ONLY = VLLM_V1.profile


def test_the_ar_logs_operations_reproduce_it_on_the_same_scheduler() -> None:
    events = _ar_events(VLLM_V1)
    h = ArHarness(VLLM_V1.factory, AR)
    from properties.ar.decisions import apply_ar_ops

    apply_ar_ops(h, ar_operations(events))
    assert h.events == events


def test_a_bare_twin_reaches_the_verdict_of_a_checked_one(tmp_path: Path) -> None:
    """A log's twin runs bare (`checked=False`: linear in the log) and must report exactly what
    the harness-checked twin of `verify --twin` reports: agreement on its own log, the same
    first difference on another engine's, the same stop when its replayed record runs out."""
    from properties.decisions import twin_difference
    from reference.dllm import REFERENCE_TWIN
    from reference.sglang_dllm import SGLANG_ORDER_TWIN

    sglang = record_dllm_run(SGLANG_DLLM_ORDER)
    reference = record_dllm_run(REFERENCE_DLLM)
    cut = reference[: [i for i, e in enumerate(reference) if isinstance(e, ControlReturned)][3]]
    cases = [
        (sglang, SGLANG_ORDER_TWIN, SGLANG_DLLM_ORDER.profile, True),
        (sglang, REFERENCE_TWIN, DllmProfile(), True),
        (reference, REFERENCE_TWIN, DllmProfile(), True),
        (cut, REFERENCE_TWIN, DllmProfile(), True),  # drained past the log: its record runs out
    ]
    verdicts = []
    for events, twin, profile, drain in cases:
        checked = twin_difference(events, DLLM, twin, profile, drain=drain)
        bare = twin_difference(events, DLLM, twin, profile, drain=drain, checked=False)
        assert bare == checked
        verdicts.append(bare)
    assert verdicts[0] is None and verdicts[2] is None
    assert verdicts[1] is not None and verdicts[1].startswith("round ")
    assert verdicts[3] is not None and "the twin then stopped" in verdicts[3]


def test_the_trace_benchmark_times_the_twin(tmp_path: Path) -> None:
    from tests.script_module import load_script

    bench = load_script("bench_trace_check")
    out = tmp_path / "bench.json"
    assert bench.main(["--sizes", "4", "--twin", "reference-dllm", "--json", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    (row,) = data["rows"]
    assert data["twin"] == "reference-dllm" and row["twin_over_plain"] > 0


# ---------------------------------------------------------------------------- --json


def test_the_verdict_is_written_as_json_for_a_ci_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = record_dllm_run(SGLANG_DLLM_ORDER)
    declared = _write_dllm(tmp_path / "declared.jsonl", events, SGLANG_DLLM_ORDER.profile.policy)
    bare = _write_dllm(tmp_path / "bare.jsonl", events)
    out = tmp_path / "verdict.json"

    def verdict(*argv: str) -> dict[str, object]:
        code = main(["check-trace", *argv, "--json", str(out)])
        capsys.readouterr()
        data: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
        assert data["exit"] == code
        return data

    passed = verdict(declared, "--twin", "sglang-dllm-order")
    assert passed["verdict"] == "pass" and passed["policy"] == "header"
    assert passed["twin"] == "sglang-dllm-order" and passed["twin_difference"] is None
    assert passed["idle_at_end"] is True and passed["events"] == len(events)
    differs = verdict(declared, "--twin", "reference-dllm")
    assert differs["verdict"] == "violation" and differs["rule"] == "twin_decisions"
    assert str(differs["twin_difference"]).startswith("round ")
    failed = verdict(bare)
    assert failed["verdict"] == "violation" and failed["rule"] == "fcfs_admission"
    assert isinstance(failed["line"], int) and failed["line"] > 1  # an event's line, not the header
    accepted = verdict(bare, "--profile", "tests.test_check_trace_profile:SGLANG_AS_DEVIATION")
    assert accepted["verdict"] == "accepted" and accepted["rule"] == "work_conserving"
    ends = [i for i, e in enumerate(events) if isinstance(e, ControlReturned)]
    cut = _write_dllm(
        tmp_path / "cut.jsonl", events[: ends[2] + 1], SGLANG_DLLM_ORDER.profile.policy
    )
    incomplete = verdict(cut, "--require-idle")
    assert incomplete["verdict"] == "incomplete" and incomplete["exit"] == 1
    # an output path that cannot be written is refused before the log is read
    code = main(["check-trace", str(tmp_path / "missing.jsonl"), "--json", str(tmp_path)])
    assert code == 2 and "invalid --json=" in capsys.readouterr().err
