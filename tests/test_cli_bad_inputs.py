"""Every command answers bad input with exit 2 and one line naming what was wrong — never a
traceback, never exit 1 (which means a real violation).

The corpus: wrong types; zero, negative and huge numbers; missing, directory, binary, empty,
byte-order-mark and non-UTF-8 files; unicode names; unknown commands, flags and choices; output
paths that cannot be written (checked before any work starts). Most cases run in-process through
`schedspec_cli.main.main(argv)`; a few run as the installed console script to check that no
traceback reaches the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedspec_cli.main import EXIT_READER_GONE, main
from spec.ar.config import ArConfig
from spec.ar.trace import ar_config_to_dict

HUGE = "9" * 30
DEEP = "[" * 100_000 + "]" * 100_000  # nested past the interpreter's recursion limit
LONG_INT = "1" + "0" * 5_000  # past Python's integer-conversion digit limit
CALIBRATION = Path(__file__).resolve().parents[1] / "docs" / "dllm-calibration-cpu.json"
TRACE_HEADER = {  # a header gives every DllmConfig field (prefix_cache may be left out)
    "kind": "config",
    "block_size": 2,
    "page_size": 2,
    "kv_pages": 2,
    "req_pool_rows": 4,
    "max_running_requests": 4,
    "max_context": 4,
    "mode": "fdfo",
    "in_place_reuse": True,
    "reloop": False,
    "mask_token_id": -1,
    "eos_token_id": None,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    header = json.dumps(TRACE_HEADER) + "\n"
    contents: dict[str, bytes] = {
        "binary": b"\x00\xff\xfe\x01\x02binary",
        "empty": b"",
        "bom": b"\xef\xbb\xbf" + header.encode(),
        "latin1": "caf\xe9 au lait\n".encode("latin-1"),
        "not_json": b"this is not json\n",
        "json_list": b"[1, 2, 3]\n",
        "slots_str": (header + '{"kind":"kv_freed","request_id":"a","slots":["0"]}\n').encode(),
        "row_str": (header + '{"kind":"admitted","request_id":"a","row":"0"}\n').encode(),
        "unknown_kind": (header + '{"kind":"teleported","request_id":"a"}\n').encode(),
        "kind_list": b'{"kind":["ar_submitted"],"request_id":"a"}\n',
        "kind_object": b'{"kind":{"a":1},"family":"ar","block_size":2}\n',
        "header_only": header.encode(),
        "header_partial": json.dumps(
            {k: v for k, v in TRACE_HEADER.items() if k != "eos_token_id"}
        ).encode(),
        "header_family_xyz": json.dumps({**TRACE_HEADER, "family": "xyz"}).encode(),
        "header_duplicate_key": (header[:-2] + ', "kv_pages": 3}\n').encode(),
        "event_without_kind": (header + '{"request_id":"a"}\n').encode(),
        "event_duplicate_key": (
            header + '{"kind":"aborted","request_id":"a","request_id":"b"}\n'
        ).encode(),
        "policy_reserved_huge": (
            json.dumps({**TRACE_HEADER, "declared_policy": {"reserved_kv_pages": 10**30}}) + "\n"
        ).encode(),
        "config_partial": json.dumps({"block_size": 2, "page_size": 2}).encode(),
        "ar_header_only": (json.dumps(ar_config_to_dict(ArConfig())) + "\n").encode(),
        "policy_bad": (
            json.dumps({**TRACE_HEADER, "declared_policy": {"admission": "lifo"}}) + "\n"
        ).encode(),
        "policy_declared": (
            json.dumps({**TRACE_HEADER, "declared_policy": {"admission": "prefill-first"}}) + "\n"
        ).encode(),
        "config_types": b'{"block_size": "4", "page_size": 4, "kv_pages": 2, "max_context": 8}',
        "config_other": json.dumps({**TRACE_HEADER, "kv_pages": 3}).encode(),
        "config_zero": json.dumps({**TRACE_HEADER, "kind": None, "block_size": 0}).encode(),
        "config_huge": json.dumps({**TRACE_HEADER, "kv_pages": 10**30}).encode(),
        "accept_no_colon": b"terminal_owns_nothing because\n",
        "accept_unknown_rule": b"no_such_rule: a reason\n",
        "accept_no_reason": b"no_leak:   \n",
        "accept_twice": b"no_leak: one\nno_leak: two\n",
        "accept_ar_rule": b"preemption_victim: on purpose\n",  # a rule of the AR suite only
        "accept_bad_json": b'[{"rule": "no_leak", "reason": "x"}',
        "accept_json_types": b'[{"rule": 3, "reason": "x"}]',
        "parity_types": json.dumps({"device": "cuda", "identical": "yes"}).encode(),
        "ünïcödé.jsonl": header.encode() + b'{"kind":"submitted"}\n',
        "report_hist_keys": json.dumps(
            {"block_size": 8, "algorithm": {"LowConfidence": {"histogram": {"x": 1}}}}
        ).encode(),
        "report_one_algorithm": json.dumps(
            {"block_size": 8, "algorithm": {"LowConfidence": {"histogram": {"3": 1}}}}
        ).encode(),
        "report_no_block": json.dumps({"algorithm": {"LowConfidence": {}}}).encode(),
        "vidur_trace": b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,20\n",
        "csv_big_field": b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,"
        + b"1" * 200_000
        + b",20\n",
        "csv_header_only": b"arrived_at,num_prefill_tokens,num_decode_tokens\n",
        "deep_json": DEEP.encode(),
        "long_int_json": ('{"block_size": ' + LONG_INT + "}").encode(),
        "deep_event": (header + '{"kind":"submitted","request_id":' + DEEP + "}\n").encode(),
        "long_int_event": (
            header + '{"kind":"admitted","request_id":"a","row":' + LONG_INT + "}\n"
        ).encode(),
        "long_int_header": ('{"kind":"config","block_size":' + LONG_INT + "}\n").encode(),
    }
    calibration = json.loads(CALIBRATION.read_text())
    for name, edit in (
        (
            "cal_long_prompt",
            {"profiles": [{"prompt_len": 9_000_000, "forwards": [2], "tokens": 8}]},
        ),
        ("cal_big_block", {"block_size": 512, "max_new_tokens": 512}),
        (
            "cal_many_seats",
            {"rows": [{**r, "max_running": r["max_running"] * 1000} for r in calibration["rows"]]},
        ),
        ("cal_zero_block", {"block_size": 0}),
        ("cal_short_range", {"paired_range": {"fdfo/sync": {"4": [1.5]}}}),
        ("cal_zero_ratio", {"measured_ratios": {"fdfo/sync": {"4": 0}}}),
        ("cal_zero_tokens", {"rows": [{**r, "tokens": 0} for r in calibration["rows"]]}),
    ):
        contents[name] = json.dumps({**calibration, **edit}).encode()
    out = {}
    for name, data in contents.items():
        (d / name).write_bytes(data)
        out[name] = d / name
    out["missing"] = d / "does-not-exist.jsonl"
    out["dir"] = d
    out["unicode_missing"] = d / "ñö-fïlé.jsonl"
    out["zero"] = Path("/dev/zero")  # endless: a reader must stop at its bound
    out["calibration"] = CALIBRATION
    return out


def cases() -> list[tuple[str, list[str]]]:
    """(id, argv) with {name} placeholders for the files above."""
    c: list[tuple[str, list[str]]] = []
    # top level
    c += [("no-command", []), ("unknown-command", ["frobnicate"]), ("unknown-flag", ["--nope"])]
    c += [("unicode-command", ["vérifier"]), ("list-impls-extra", ["list-impls", "extra"])]
    # check-trace: every kind of bad file, bad --config, bad --family
    for f in (
        "missing",
        "unicode_missing",
        "dir",
        "binary",
        "empty",
        "bom",
        "latin1",
        "not_json",
        "json_list",
        "slots_str",
        "row_str",
        "unknown_kind",
        "kind_list",
        "kind_object",
        "ünïcödé.jsonl",
        "deep_json",
        "deep_event",
        "long_int_event",
        "long_int_header",
        "policy_bad",
        "header_partial",
        "header_family_xyz",
        "header_duplicate_key",
        "event_without_kind",
        "event_duplicate_key",
        "policy_reserved_huge",
    ):
        c.append((f"check-trace-{f}", ["check-trace", f"{{{f}}}"]))
    for f in (
        "missing",
        "dir",
        "binary",
        "empty",
        "json_list",
        "config_types",
        "config_other",
        "deep_json",
        "long_int_json",
        "zero",
    ):
        c.append(
            (f"check-trace-config-{f}", ["check-trace", "{header_only}", "--config", f"{{{f}}}"])
        )
    for f in ("config_zero", "config_huge", "config_partial"):
        c.append((f"check-trace-config-{f}", ["check-trace", "{not_json}", "--config", f"{{{f}}}"]))
    c.append(("check-trace-family", ["check-trace", "{header_only}", "--family", "ar"]))
    c.append(("check-trace-family-bogus", ["check-trace", "{header_only}", "--family", "xl"]))
    # check-trace --profile / --twin: unknown, another family, not a profile or twin, a space
    # that does not hold the log's configuration, a profile the header contradicts
    for flag, values in (
        ("--profile", ("", "nonesuch", "vllm-v1", "math:pi", "os:path", "no_such_module:x")),
        ("--twin", ("", "nonesuch", "vllm-v1", "reference-dllm-joint", "math:pi", "os:path")),
    ):
        for value in values:
            c.append(
                (
                    f"check-trace{flag}-{value.replace(':', '.') or 'empty'}",
                    ["check-trace", "{header_only}", flag, value],
                )
            )
    c.append(  # a class that is no AR factory, named as an AR log's twin
        (
            "check-trace--twin-ar-class",
            ["check-trace", "{ar_header_only}", "--twin", "spec:DllmConfig"],
        )
    )
    c.append(("check-trace--json-dir", ["check-trace", "{header_only}", "--json", "{dir}"]))
    c.append(
        (
            "check-trace--profile-space",
            ["check-trace", "{header_only}", "--profile", "real-sglang-dllm"],
        )
    )
    c.append(
        (
            "check-trace--profile-contradicts-header",
            ["check-trace", "{policy_declared}", "--profile", "reference-dllm"],
        )
    )
    # verify: numbers, implementations, output paths, accept files, choices
    for value in ("0", "-1", HUGE, "abc", "1.5", ""):
        c.append(
            (
                f"verify-examples-{value[:4]}",
                ["verify", "--impl", "reference-dllm", "--examples", value],
            )
        )
    for impl in (
        "",
        "nonesuch",
        "os:path",
        "no_such_module:x",
        "é:ü",
        "math:pi",
        "a:b:c",
        "os:getcwd",
    ):
        c.append((f"verify-impl-{impl[:8]}", ["verify", "--impl", impl]))
    c.append(("verify-family-conflict", ["verify", "--impl", "reference-dllm", "--family", "ar"]))
    c.append(("verify-family-bogus", ["verify", "--impl", "reference-dllm", "--family", "xl"]))
    c.append(("verify-parity-bogus", ["verify", "--impl", "reference-dllm", "--parity", "some"]))
    c.append(("verify-mode-bogus", ["verify", "--impl", "reference-dllm", "--mode", "turbo"]))
    c.append(("verify-mode-ar", ["verify", "--impl", "vidur-vllm", "--mode", "sync"]))
    # --twin: unknown, a built-in without a twin, wrong objects (an implementation factory also
    # takes two arguments: the probe call tells it apart), an AR implementation
    for twin in (
        "",
        "nonesuch",
        "engine",
        "vllm-v1",
        "reference.dllm:make_scheduler",
        "reference.dllm:ReferenceDllmScheduler",
        "reference.dllm:REFERENCE_DLLM",
        "reference.dllm:PREFILL_FIRST_POLICY",
        "os:getcwd",
        "no_such_module:x",
    ):
        c.append(
            (f"verify-twin-{twin[-10:]}", ["verify", "--impl", "reference-dllm", "--twin", twin])
        )
    c.append(("verify-twin-ar", ["verify", "--impl", "vidur-vllm", "--twin", "reference-dllm"]))
    c.append(  # a dLLM factory named as an AR twin: built once up front, it fails there
        (
            "verify-twin-ar-dllm-factory",
            ["verify", "--impl", "vllm-v1", "--twin", "reference.dllm:make_scheduler"],
        )
    )
    c.append(("verify-json-dir", ["verify", "--impl", "reference-dllm", "--json", "{dir}"]))
    c.append(("verify-call-timeout", ["verify", "--impl", "reference-dllm", "--call-timeout", "x"]))
    c.append(
        (
            "verify-json-under-file",
            ["verify", "--impl", "reference-dllm", "--json", "{empty}/x.json"],
        )
    )
    c.append(("verify-report-file", ["verify", "--impl", "reference-dllm", "--report", "{empty}"]))
    c.append(("verify-main-job-json", ["verify", "--json", "x.json"]))
    c.append(("verify-main-job-report-file", ["verify", "--report", "{empty}"]))
    c.append(("verify-main-job-report-empty", ["verify", "--report", ""]))  # was the default
    for f in (
        "missing",
        "dir",
        "binary",
        "empty",
        "latin1",
        "accept_no_colon",
        "accept_unknown_rule",
        "accept_no_reason",
        "accept_twice",
        "accept_bad_json",
        "accept_json_types",
        "json_list",
        "deep_json",
        "long_int_json",
        "zero",
    ):
        c.append(
            (f"verify-accept-{f}", ["verify", "--impl", "reference-dllm", "--accept", f"{{{f}}}"])
        )
    # prove
    for value in ("0", "-1", HUGE, "x"):
        c.append((f"prove-bound-{value[:4]}", ["prove", "--bound", value]))
    c.append(("prove-json-dir", ["prove", "--json", "{dir}"]))
    c.append(("prove-family", ["prove", "--family", "proofs"]))
    # parity (checked before torch or the model loads)
    c += [
        ("parity-device", ["parity", "--device", "cudaXYZ-fake"]),
        ("parity-device-empty", ["parity", "--device", ""]),
        ("parity-prompts-0", ["parity", "--prompts", "0"]),
        ("parity-tokens-neg", ["parity", "--max-new-tokens", "-1"]),
        ("parity-tokens-huge", ["parity", "--max-new-tokens", HUGE]),
        ("parity-tokens-past-context", ["parity", "--max-new-tokens", "235"]),
        ("parity-block-0", ["parity", "--block-size", "0"]),
        ("parity-page-not-multiple", ["parity", "--block-size", "2", "--page-size", "3"]),
        ("parity-algorithm", ["parity", "--algorithm", "Greedy"]),
        ("parity-json-dir", ["parity", "--json", "{dir}"]),
        ("parity-run-timeout-engine", ["parity", "--run-timeout", "5"]),
        ("parity-run-timeout-neg", ["parity", "--impl", "reference-dllm", "--run-timeout", "-1"]),
    ]
    # bench
    c += [
        ("bench-none", ["bench"]),
        ("bench-bogus", ["bench", "gpu"]),
        ("bench-engine-threads", ["bench", "engine", "--threads", "-1"]),
        ("bench-engine-repeats", ["bench", "engine", "--repeats", "0"]),
        ("bench-engine-turn-ms", ["bench", "engine", "--turn-ms", "-5"]),
        ("bench-engine-turn-ms-seq", ["bench", "engine", "--sequential", "--turn-ms", "10"]),
        ("bench-engine-turn-ms-costs", ["bench", "engine", "--forward-costs", "--turn-ms", "0"]),
        # --forward-costs times the shipped model on the CPU at fixed shapes: these were ignored
        ("bench-engine-costs-device", ["bench", "engine", "--forward-costs", "--device", "cuda"]),
        ("bench-engine-costs-requests", ["bench", "engine", "--forward-costs", "--requests", "3"]),
        (
            "bench-engine-costs-max-running",
            ["bench", "engine", "--forward-costs", "--max-running", "1", "4", "16"],
        ),
        ("bench-engine-turn-ms-bound", ["bench", "engine", "--forward-bound", "--turn-ms", "50"]),
        ("bench-engine-rows-bound", ["bench", "engine", "--forward-bound", "--rows-released"]),
        ("bench-engine-rows-costs", ["bench", "engine", "--forward-costs", "--rows-released"]),
        ("bench-engine-requests", ["bench", "engine", "--requests", HUGE]),
        ("bench-engine-tokens-past-context", ["bench", "engine", "--max-new-tokens", "235"]),
        ("bench-engine-json-dir", ["bench", "engine", "--json", "{dir}"]),
        ("bench-conf-examples", ["bench", "conformance", "--examples", "0"]),
        ("bench-conf-impl", ["bench", "conformance", "--impl", "nonesuch"]),
        ("bench-conf-json-dir", ["bench", "conformance", "--json", "{dir}"]),
        ("bench-conf-twin", ["bench", "conformance", "--twin", "nonesuch"]),
        (
            "bench-conf-twin-mixed",
            [
                *("bench", "conformance", "--impl", "vllm-v1", "--impl", "reference-dllm"),
                *("--twin", "vllm-v1"),
            ],
        ),
    ]
    # release-check
    for f in (
        "missing",
        "dir",
        "binary",
        "empty",
        "bom",
        "latin1",
        "not_json",
        "json_list",
        "parity_types",
        "deep_json",
        "long_int_json",
        "zero",
    ):
        c.append((f"release-check-{f}", ["release-check", f"{{{f}}}"]))
    c.append(("release-check-none", ["release-check"]))
    # simulate (its own flags live in schedspec_cli.simulate) and install-engines
    c += [
        ("simulate-bogus", ["simulate", "warp"]),
        ("simulate-flag", ["simulate", "sbs", "--no-such-flag", "1"]),
        ("simulate-requests-neg", ["simulate", "dllm", "--requests", "-1"]),
        ("simulate-dllm-block-too-large", ["simulate", "dllm", "--block-size", "4096"]),
        ("simulate-json-dir", ["simulate", "sbs", "--json", "{dir}"]),
        ("simulate-plots-file", ["simulate", "sbs", "--plots", "{empty}"]),
        ("simulate-dllm-algorithm", ["simulate", "dllm", "--algorithm", "Greedy"]),
        (
            "simulate-dllm-algorithm-not-in-report",
            [
                "simulate",
                "dllm",
                "--steps-report",
                "{report_one_algorithm}",
                "--algorithm",
                "JointThreshold",
            ],
        ),
    ]
    c += [
        (
            "simulate-dllm-algorithm-with-steps",
            ["simulate", "dllm", "--steps", "3:1", "--algorithm", "JointThreshold"],
        ),
        (
            "simulate-dllm-algorithm-with-calibration",
            ["simulate", "dllm", "--calibration", "{calibration}", "--algorithm", "JointThreshold"],
        ),
        (
            "simulate-dllm-steps-and-report",
            ["simulate", "dllm", "--steps", "3:1", "--steps-report", "{report_one_algorithm}"],
        ),
    ]
    for value in ("a,b", "", "0", "1,,2", HUGE):
        c.append((f"simulate-dllm-seats-{value[:4]}", ["simulate", "dllm", "--seats", value]))
    for f in (
        "missing",
        "dir",
        "binary",
        "empty",
        "not_json",
        "json_list",
        "config_types",
        "report_hist_keys",
        "report_no_block",
        "deep_json",
        "long_int_json",
        "zero",
    ):
        c.append(
            (f"simulate-dllm-steps-report-{f}", ["simulate", "dllm", "--steps-report", f"{{{f}}}"])
        )
    for f in (
        "cal_long_prompt",  # this one and the next would run for hours
        "cal_big_block",
        "cal_many_seats",
        "cal_zero_block",
        "cal_short_range",
        "cal_zero_ratio",
        "cal_zero_tokens",
    ):
        c.append(
            (f"simulate-dllm-calibration-{f}", ["simulate", "dllm", "--calibration", f"{{{f}}}"])
        )
    for f in ("deep_json", "long_int_json", "zero"):
        c.append(
            (f"simulate-dllm-calibration-{f}", ["simulate", "dllm", "--calibration", f"{{{f}}}"])
        )
        c.append(
            (
                f"simulate-dllm-forward-table-{f}",
                ["simulate", "dllm", "--forward", f"table:{{{f}}}"],
            )
        )
    for what in ("sbs", "replicas"):
        for flag, value in (("--qps", "5"), ("--arrivals", "fixed"), ("--decode", "8")):
            c.append(
                (
                    f"simulate-{what}-trace-csv-with{flag}",
                    ["simulate", what, "--trace-csv", "{vidur_trace}", flag, value],
                )
            )
        for f in (
            "missing",
            "dir",
            "binary",
            "latin1",
            "csv_big_field",
            "csv_header_only",
            "zero",
        ):
            c.append(
                (f"simulate-{what}-trace-csv-{f}", ["simulate", what, "--trace-csv", f"{{{f}}}"])
            )
    c += [
        ("install-engines-bogus", ["install-engines", "tensorrt"]),
    ]
    return (
        c
        + out_of_range_times()
        + ignored_flags()
        + verify_flags_out_of_scope()
        + past_the_shipped_set()
    )


def past_the_shipped_set() -> list[tuple[str, list[str]]]:
    """More prompts than the shipped set has distinct, or more new tokens than the model's
    context holds: `verify` used to run its whole main job and then fail the parity step with
    exit 1; both are now refused before anything runs, as `parity` refuses them."""
    return [
        ("parity-prompts-past-the-set", ["parity", "--prompts", "32"]),
        ("verify-parity-prompts-past-the-set", ["verify", "--parity-prompts", "33"]),
        ("verify-parity-tokens-past-context", ["verify", "--parity-tokens", "300"]),
    ]


def verify_flags_out_of_scope() -> list[tuple[str, list[str]]]:
    """verify's flags of one kind of run, given to the other: each used to be ignored (the
    main job ran its own parity whatever --parity said; an --impl run never read
    --parity-prompts; an AR run has no outputs to check)."""
    return [
        ("verify-main-job-parity", ["verify", "--parity", "never"]),
        ("verify-main-job-accept-empty", ["verify", "--accept", ""]),
        ("verify-main-job-json-empty", ["verify", "--json", ""]),
        ("verify-main-job-twin", ["verify", "--twin", "reference-dllm"]),
        (
            "verify-impl-parity-prompts",
            ["verify", "--impl", "reference-dllm", "--parity-prompts", "2"],
        ),
        (
            "verify-impl-parity-tokens",
            ["verify", "--impl", "reference-dllm", "--parity-tokens", "4"],
        ),
        ("verify-ar-parity", ["verify", "--impl", "vllm-v1", "--parity", "bs1"]),
        (
            "bench-conformance-ar-parity",
            ["bench", "conformance", "--impl", "vllm-v1", "--parity", "on"],
        ),
    ]


def out_of_range_times() -> list[tuple[str, list[str]]]:
    """Times and rates that used to sum to inf: a ZeroDivisionError traceback, or exit 0 with a
    table of inf and nan."""
    c: list[tuple[str, list[str]]] = []
    for flag in ("--round-overhead", "--alloc-cost", "--alloc-round-cost"):
        for value in ("1e308", "3601"):
            c.append((f"simulate-dllm{flag}-{value}", ["simulate", "dllm", flag, value]))
    for model in ("linear:1e308,0,0", "linear:1e-320,0,0", "linear:0.02,1e308,0", "const:1e308"):
        c.append((f"simulate-dllm-forward-{model}", ["simulate", "dllm", "--forward", model]))
    for value in ("1e308", "1e-320"):
        c.append((f"simulate-sbs-batch-time-{value}", ["simulate", "sbs", "--batch-time", value]))
        for what in ("sbs", "replicas"):
            c.append((f"simulate-{what}-qps-{value}", ["simulate", what, "--qps", value]))
        c.append(
            (
                f"simulate-sweep-qps-{value}",
                ["simulate", "sweep", "--backend", "local", "--qps", value],
            )
        )
    return c


def ignored_flags() -> list[tuple[str, list[str]]]:
    """Flags the run would have ignored without a word: a size, cost or histogram with
    --calibration (the table sets them), a calibration option without it, an empty --steps."""
    c: list[tuple[str, list[str]]] = [
        ("simulate-dllm-steps-empty", ["simulate", "dllm", "--steps", ""]),
        ("simulate-dllm-time-model-alone", ["simulate", "dllm", "--time-model", "per-mode"]),
        ("simulate-dllm-profile-order-alone", ["simulate", "dllm", "--profile-order", "sample"]),
    ]
    for flag, value in (
        ("--block-size", "4"),
        ("--requests", "3"),
        ("--gen-blocks", "2"),
        ("--seats", "2"),
        ("--steps", "2:1"),
        ("--steps-report", "{report_one_algorithm}"),
        ("--forward", "const:0.1"),
        ("--round-overhead", "0"),
        ("--alloc-cost", "0"),
        ("--alloc-round-cost", "0"),
    ):
        argv = ["simulate", "dllm", "--calibration", "{calibration}", flag, value]
        c.append((f"simulate-dllm-calibration-with{flag}", argv))
    return c


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["simulate", "dllm", "--round-overhead", "1e308"], "--round-overhead: 1e308 is out of "),
        (
            ["simulate", "dllm", "--forward", "linear:1e-320,0,0"],
            "invalid exec_model='linear:1e-320,0,0': 'linear:BASE,PER_PREFILL,PER_DECODE[,PER_KV]' "
            "(seconds): BASE must be seconds in [1e-09, 3600]",
        ),
        (
            ["simulate", "replicas", "--exec-model", "linear:0.02,1e308,0"],
            "): PER_PREFILL must be seconds in [0, 3600]",
        ),
        (["simulate", "sbs", "--batch-time", "1e308"], "seconds in [1e-09, 3600]"),
        (["simulate", "dllm", "--plots", ""], "invalid --plots='': a directory path"),
        (["simulate", "dllm", "--calibration", ""], "invalid --calibration='': a calibration"),
        (
            ["verify", "--impl", "reference-dllm", "--accept", "{accept_ar_rule}"],
            ": preemption_victim': a rule the dllm suite checks (preemption_victim is another "
            "family's)",
        ),
        (
            ["simulate", "sweep", "--scheduler", "simple", "--max-model-len", "10"],
            "invalid --max-model-len=10: left out with --scheduler simple",
        ),
        (
            [
                *["simulate", "sweep", "--scheduler", "vllm-v1", "--max-model-len", "10"],
                *["--prefill", "100", "--backend", "local", "--requests", "2"],
            ],
            "could never be scheduled: the replica's scheduler refuses it (request '0' needs ",
        ),
        (
            ["parity", "--impl", "reference-dllm", "--device", "cuda"],
            "invalid --device='cuda': left out with --impl reference-dllm (it runs its own code "
            "here; --device is the engine's)",
        ),
        (["simulate", "sbs", "--prefill", "5-"], "invalid --prefill='5-': 'N' or 'LOW-HIGH'"),
        (["simulate", "sbs", "--decode", "0"], "invalid --decode='0': 'N' or 'LOW-HIGH' with 1"),
        (["verify", "--report", " "], "invalid --report=' ': a directory path"),
        (["simulate", "replicas", "--qps", "1e-320"], "a rate in [1e-06, 1e+09] per second"),
        (
            ["simulate", "sweep", "--backend", "local", "--qps", "5,1e-320"],
            "invalid --qps='5,1e-320': comma-separated rates, each in [1e-06, 1e+09] per second",
        ),
        (
            ["release-check", "{bom}"],
            "invalid report.device=None: missing, and every report `schedspec parity --json` "
            "writes has it (is this one?)",
        ),
        (
            ["verify", "--impl", "reference-dllm", "--twin", "reference-dllm-joint"],
            "invalid --twin='reference-dllm-joint': a built-in with a decision twin "
            "(reference-dllm-joint has none): one of ['reference-dllm', ",
        ),
        (
            ["verify", "--impl", "vidur-vllm", "--mode", "sync"],
            "invalid --mode='sync': only with dLLM implementations (vidur-vllm is AR)",
        ),
        (
            ["simulate", "replicas", "--scheduler", "vidur-vllm", "--max-prefill-tokens", "512"],
            "--max-prefill-tokens=512: at least 1271 (the workload's longest request)",
        ),
        (["simulate", "replicas", "--scheduler", "nope"], "vidur-sarathi-released, "),
        (
            ["simulate", "dllm", "--calibration", str(CALIBRATION), "--seats", "2,4"],
            "--seats='2,4': not with --calibration",
        ),
        (["simulate", "dllm", "--profile-order", "sample"], "only with --calibration"),
        (["simulate", "dllm", "--steps", ""], "invalid steps=''"),
        (["verify", "--parity", "never"], "--parity='never': only with --impl NAME"),
        (
            ["verify", "--impl", "reference-dllm", "--parity-prompts", "2"],
            "--parity-prompts=2: main job only",
        ),
        (["verify", "--impl", "vllm-v1", "--parity", "bs1"], "dLLM implementations only"),
        (["parity", "--prompts", "32"], "--prompts=32: between 1 and 31 (the shipped set's"),
        (["verify", "--parity-prompts", "33"], "--parity-prompts=33: between 1 and 31 "),
        (["verify", "--parity-tokens", "235"], "--parity-tokens=235: the longest of the 8 "),
        (["verify", "--parity-tokens", "235"], "use at most 234 new tokens"),
        (
            ["bench", "engine", "--forward-costs", "--repeats", "2", "--device", "cuda"],
            "--device='cuda': left out with --forward-costs",
        ),
    ],
)
def test_a_refused_flag_is_named_with_what_is_valid(
    argv: list[str], says: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_fill(argv, files)) == 2
    assert says in capsys.readouterr().err


def _fill(argv: list[str], files: dict[str, Path]) -> list[str]:
    """Each {name} inside an argument (a whole argument, or a part: `table:{deep_json}`)
    replaced by that file's path."""
    out = []
    for a in argv:
        for name, path in files.items():
            a = a.replace(f"{{{name}}}", str(path))
        out.append(a)
    return out


@pytest.mark.parametrize(("case", "argv"), cases(), ids=[c for c, _ in cases()])
def test_bad_input_is_exit_2_with_one_line(
    case: str,
    argv: list[str],
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(_fill(argv, files))
    out, err = capsys.readouterr()
    assert code == 2, f"{case}: exit {code}\n{err}"
    assert not out, f"{case}: printed results before refusing its input:\n{out}"
    lines = [line for line in err.splitlines() if line.strip()]
    message = lines[-1] if lines else ""
    assert "error" in message and "Traceback" not in err, f"{case}: {err}"
    # one line for the error itself (the simulator may print its progress before it), and no
    # usage block: that is for --help
    assert sum("error" in line for line in lines) == 1, f"{case}: {err}"
    assert not any(line.startswith("usage:") for line in lines), f"{case}: {err}"
    assert not list(tmp_path.iterdir()), f"{case}: wrote files before refusing"


@pytest.mark.parametrize(
    "argv",
    [
        ["check-trace", "{binary}"],
        ["verify", "--impl", "reference-dllm", "--examples", "0"],
        ["release-check", "{not_json}"],
        ["simulate", "warp"],
        ["verify", "--impl", "os:path"],
    ],
)
def test_no_traceback_reaches_the_terminal(argv: list[str], files: dict[str, Path]) -> None:
    schedspec = Path(sys.executable).parent / "schedspec"
    res = subprocess.run(
        [str(schedspec), *_fill(argv, files)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and res.stderr.strip().count("\n") <= 1, res.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["list-impls"],
        ["simulate", "dllm", "--requests", "2"],
        ["bench", "conformance", "--examples", "1"],
    ],
)
def test_a_closed_stdout_ends_the_command_quietly(argv: list[str]) -> None:
    """`schedspec ... | head` closes the pipe under the writer. That is not an input error
    (exit 2) and deserves no message: the shell's SIGPIPE status, nothing on stderr. The read
    end is closed before the command starts, so its first write fails every time."""
    schedspec = Path(sys.executable).parent / "schedspec"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run(
            [str(schedspec), *argv], stdout=write_end, stderr=subprocess.PIPE, check=False
        )
    finally:
        os.close(write_end)
    err = res.stderr.decode()
    assert res.returncode == EXIT_READER_GONE, err
    assert "error" not in err and "Exception" not in err and "Traceback" not in err, err


WITHOUT_Z3 = """
import sys

class NoZ3:
    def find_spec(self, name, path=None, target=None):
        if name == "z3" or name.startswith("z3."):
            raise ImportError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoZ3())
from schedspec_cli.main import main
sys.exit(main(["prove"]))
"""


def test_prove_without_the_z3_solver_says_what_to_install() -> None:
    """An install that skipped dependencies (`pip install --no-deps`) has no Z3: `prove` used to
    end in a ModuleNotFoundError traceback; it now says what to install, exit 2."""
    res = subprocess.run([sys.executable, "-c", WITHOUT_Z3], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "schedspec: error: prove needs the Z3 solver, which is not installed here: pip install "
        "z3-solver"
    ]


def test_a_scripts_closed_stdout_ends_it_quietly() -> None:
    """The scripts' `run_script` does as `schedspec` does: before, `scripts/engine_fixes_diff.py
    --list | head -1` printed a BrokenPipeError traceback (2 of 3 tries)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "engine_fixes_diff.py"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run(
            [sys.executable, str(script), "--list"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
        )
    finally:
        os.close(write_end)
    err = res.stderr.decode()
    assert res.returncode == EXIT_READER_GONE, err
    assert "Traceback" not in err and "Error" not in err, err


def test_the_top_level_help_says_each_thing_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Before, `simulate` read `... (each takes --help) (takes --help)`."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "takes --help) (takes --help)" not in text, text
    assert "dllm | sbs | replicas | sweep (each takes --help)" in text, text
