"""The release gate refuses CPU runs, mismatches, leaks, thin coverage, and every way of
fooling it: a summary that disagrees with its cases, repeated prompts, held rows, a leaked_rows
field left out, a device name torch would never report, too few new tokens, cases without golden
agreement, a summary whose golden is false, no run at batch size 1 or > 1, a report produced
for another implementation. A file that is not a parity report (a field the verdict rests on
missing or mistyped, a repeated key, an algorithm or token count no parity run writes) is an
input error (exit 2, one line), never a traceback. A `parity --impl` report is held to what
such a run can produce (cases named after the implementation, no logits digests)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from schedspec_cli.main import main
from schedspec_cli.release import release_problems
from spec.parity import RELEASE_MIN_NEW_TOKENS

ROOT = Path(__file__).resolve().parents[1]


def report(**changes: object) -> dict[str, Any]:
    cases: list[dict[str, Any]] = [
        {
            "algorithm": a,
            "index": i,
            "prompt": f"prompt {i}",
            "output": "x" * RELEASE_MIN_NEW_TOKENS,  # the text of every token it asked for
            "max_new_tokens": RELEASE_MIN_NEW_TOKENS,
            "identical": True,
            "identical_outputs": True,
            "identical_digests": True,
            "mismatched": [],
            "golden": True,
        }
        for a in ("LowConfidence", "JointThreshold")
        for i in range(3)
    ]
    base: dict[str, Any] = {
        "impl": "engine",
        "device": "cuda:0",
        "batch_sizes": [1, 3],  # 3 cases an algorithm: a forward holds at most 3 rows
        "identical": True,
        "golden": True,
        "leaked_slots": 0,
        "leaked_rows": 0,
        "cases": cases,
    }
    base.update(changes)
    return base


def check(tmp_path: Path, data: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(data))
    code = main(["release-check", str(p)])
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def test_a_good_cuda_run_qualifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert release_problems(report()) == []
    code, out = check(tmp_path, report(), capsys)
    assert code == 0 and "release run OK" in out
    assert check(tmp_path, report(device="cuda"), capsys)[0] == 0


def test_cpu_runs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(tmp_path, report(device="cpu"), capsys)
    assert code == 1 and "must run on CUDA" in out


def test_a_device_name_torch_never_reports_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(tmp_path, report(device="cudaXYZ-fake"), capsys)
    assert code == 1 and "not a device name torch reports" in out


def test_mismatch_leak_and_coverage_are_refused() -> None:
    assert any("byte-identical" in x for x in release_problems(report(identical=False)))
    assert any("leaked_slots=3" in x for x in release_problems(report(leaked_slots=3)))
    one_algo = report(cases=[c for c in report()["cases"] if c["algorithm"] == "LowConfidence"])
    assert any("JointThreshold" in x for x in release_problems(one_algo))


def test_a_summary_that_disagrees_with_its_cases_is_refused() -> None:
    for flag in ("identical", "identical_outputs", "identical_digests"):
        r = report()
        r["cases"][4][flag] = False
        problems = release_problems(r)
        assert any("summary says identical but 1 case(s) differ" in x for x in problems), flag
    r = report()
    r["cases"][0]["mismatched"] = ["fdfo"]
    assert any("case(s) differ" in x for x in release_problems(r))


def test_repeated_prompts_are_refused() -> None:
    r = report()
    for c in r["cases"]:
        c["prompt"] = "the same prompt"
    problems = release_problems(r)
    assert any("repeated prompts" in x for x in problems)
    assert any("1 distinct prompts; at least 3" in x for x in problems)


def test_held_rows_are_refused() -> None:
    assert any("leaked_rows=2" in x for x in release_problems(report(leaked_rows=2)))


def test_a_report_that_leaves_out_leaked_rows_is_not_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = report()
    del r["leaked_rows"]
    code, out = check(tmp_path, r, capsys)
    assert code == 2 and "report.leaked_rows" in out and "Traceback" not in out


def test_too_few_new_tokens_are_refused() -> None:
    r = report()
    for c in r["cases"]:
        c["max_new_tokens"] = RELEASE_MIN_NEW_TOKENS - 1
    assert any(f"fewer than {RELEASE_MIN_NEW_TOKENS} new tokens" in x for x in release_problems(r))


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b"\xff\xfe\x00binary",
        json.dumps(report(cases="many")).encode(),
        json.dumps(report(leaked_slots="0")).encode(),
        json.dumps(report(identical="yes")).encode(),
        json.dumps(report(cases=[{"algorithm": 1}])).encode(),
    ],
)
def test_malformed_files_are_input_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    p = tmp_path / "parity.json"
    p.write_bytes(content)
    assert main(["release-check", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_docs_quote_the_token_threshold_from_the_code() -> None:
    """Every doc that states the gate's token minimum states RELEASE_MIN_NEW_TOKENS' value."""
    quoted = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"RELEASE_MIN_NEW_TOKENS`?\s*(?:=|is)\s*(\d+)", text):
            quoted.append((doc.name, int(m.group(1))))
        for m in re.finditer(r"gate[^.\n]{0,80}?≥ ?(\d+) new tokens", text):
            quoted.append((doc.name, int(m.group(1))))
    assert ("release.md", RELEASE_MIN_NEW_TOKENS) in quoted, quoted
    assert all(n == RELEASE_MIN_NEW_TOKENS for _, n in quoted), quoted


def test_cases_without_golden_agreement_are_refused() -> None:
    r = report()
    r["cases"][4]["golden"] = False
    assert any("1 case(s) lack golden agreement" in x for x in release_problems(r))
    r = report()
    for c in r["cases"]:
        del c["golden"]  # a report written before the golden oracle
    assert any("6 case(s) lack golden agreement" in x for x in release_problems(r))


@pytest.mark.parametrize("sizes", [[1], [], None, ["4"]])
def test_a_run_without_a_batch_above_one_is_refused(sizes: object) -> None:
    r = report(batch_sizes=sizes)
    if sizes is None:
        del r["batch_sizes"]
    assert any("batch size > 1" in x for x in release_problems(r))


@pytest.mark.parametrize(
    ("impl", "argv", "expected"),
    [
        ("reference-dllm", [], "produced for implementation 'reference-dllm', not for --impl "),
        ("engine", ["--impl", "my.module:factory"], "not for --impl 'my.module:factory'"),
        (None, [], "does not say which implementation"),
    ],
)
def test_a_report_for_another_implementation_is_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    impl: str | None,
    argv: list[str],
    expected: str,
) -> None:
    r = impl_report(impl) if impl == "reference-dllm" else report(impl=impl)
    if impl is None:
        del r["impl"]
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(r))
    code = main(["release-check", *argv, str(p)])
    out = capsys.readouterr().out
    assert code == 1 and expected in out and out.count("\n") == 1, out


def impl_report(impl: str, **changes: object) -> dict[str, Any]:
    """A report of the form `parity --impl IMPL` writes (cases named after the implementation,
    no logits digests), forged on CUDA with release-sized cases."""
    cases = [{k: v for k, v in c.items() if k != "identical_digests"} for c in report()["cases"]]
    for i, case in enumerate(cases):
        output = " ".join(["7"] * RELEASE_MIN_NEW_TOKENS)  # token ids, space-separated
        case.update(algorithm=impl, index=i, prompt=f"prompt {i}", output=output)
    return report(impl=impl, golden_checked=True, cases=cases, **changes)


def test_the_named_implementation_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(impl_report("my.module:factory")))
    assert main(["release-check", "--impl", "my.module:factory", str(p)]) == 0
    # an implementation without this project's model (no `product_rows`) runs no kernels
    assert (
        "release run OK: my.module:factory (no model: the device does not apply), 6 cases"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "recorded", sorted(p.name for p in (ROOT / "docs").glob("parity-cuda-*.json"))
)
def test_the_recorded_gpu_runs_pass_todays_gate(
    recorded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every CUDA parity report kept in docs/ as release evidence still qualifies under the
    gate as it is now (a stricter gate would otherwise leave the docs citing a run it refuses)."""
    code = main(["release-check", str(ROOT / "docs" / recorded)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("release run OK: engine on cuda"), out


MISSING = "missing, and every report `schedspec parity --json` writes has it (is this one?)"


def check_argv(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    """`release-check [ARGV] FILE` on a file holding `text`: exit status, stdout, stderr."""
    p = tmp_path / "parity.json"
    p.write_text(text)
    code = main(["release-check", *argv, str(p)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize(
    "name",
    [
        "algorithm",
        "prompt",
        "max_new_tokens",
        "identical",
        "identical_outputs",
        "identical_digests",
        "mismatched",
        "golden",
    ],
)
def test_a_case_without_a_field_the_verdict_rests_on_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Before, a case without identical_outputs, identical_digests or mismatched passed."""
    r = report()
    del r["cases"][2][name]
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys)
    assert (code, out) == (2, "")
    assert err == f"schedspec: error: invalid cases[2].{name}=None: {MISSING}\n"


@pytest.mark.parametrize("name", ["golden", "batch_sizes", "identical", "cases"])
def test_a_report_without_a_summary_field_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Before, a report without `golden` passed ("golden agrees")."""
    r = report()
    del r[name]
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys)
    assert (code, out) == (2, "")
    assert err == f"schedspec: error: invalid report.{name}=None: {MISSING}\n"


def test_a_summary_whose_golden_is_false_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `"golden": false` passed with "golden agrees", even with every case agreeing."""
    code, out, _ = check_argv(tmp_path, json.dumps(report(golden=False)), capsys)
    assert (code, out) == (
        1,
        "NOT a release run:\n  - golden parity failed: the report's golden is false; every "
        "output must equal the request decoded alone\n",
    )
    code, _, err = check_argv(tmp_path, json.dumps(report(golden="yes")), capsys)
    assert (code, err) == (2, "schedspec: error: invalid report.golden='yes': a JSON bool\n")


@pytest.mark.parametrize("sizes", ["1,4", [1, 4.5], [1, True], [1, 0], [[1, 4]]])
def test_batch_sizes_that_are_not_positive_integers_are_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sizes: object
) -> None:
    """Before, these were refused as a run without a batch size > 1 (exit 1)."""
    code, out, err = check_argv(tmp_path, json.dumps(report(batch_sizes=sizes)), capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: invalid report.batch_sizes={sizes!r}: a JSON list of positive "
        "integers (the batch sizes run, e.g. [1, 4])\n"
    )


def test_a_run_without_batch_size_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every run is compared with sync at batch size 1: a report without it proves nothing.
    Before, `[3]` passed."""
    code, out, _ = check_argv(tmp_path, json.dumps(report(batch_sizes=[3])), capsys)
    assert (code, out) == (
        1,
        "NOT a release run:\n  - batch_sizes=[3]: the run must include batch size 1 (every "
        "run is compared with sync at batch size 1)\n",
    )
    assert len(release_problems(report(batch_sizes=[]))) == 2  # neither 1 nor > 1


def test_an_algorithm_no_parity_run_uses_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, an unknown algorithm was never named (only its prompt count was short)."""
    from gpu.algorithms import ALGORITHMS
    from schedspec_cli.release import REQUIRED_ALGORITHMS

    assert set(ALGORITHMS) == REQUIRED_ALGORITHMS  # the gate names them without torch
    r = report()
    r["cases"][0]["algorithm"] = "Greedy"
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys)
    assert (code, out) == (2, "")
    assert err == (
        "schedspec: error: invalid cases[0].algorithm='Greedy': one of JointThreshold, "
        "LowConfidence (the algorithms `parity` runs)\n"
    )


@pytest.mark.parametrize("tokens", [10**30, 0, -1, True, "128", 256])
def test_a_token_count_no_parity_run_asks_for_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokens: object
) -> None:
    """Before, 10**30 passed. The shipped model's context (256) less a one-token prompt bounds
    an engine report's count; a bool or a string is not a count."""
    from gpu.prompts import shipped_context

    assert shipped_context() == 256
    r = report()
    r["cases"][1]["max_new_tokens"] = tokens
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys)
    valid = {True: "an integer", "128": "a JSON int"}.get(
        tokens,
        "a positive integer of at most 255 (the shipped model's context is 256 tokens, "
        "prompt included)",
    )
    assert (code, out) == (2, "")
    assert err == f"schedspec: error: invalid cases[1].max_new_tokens={tokens!r}: {valid}\n"
    r["cases"][1].update(prompt="q", max_new_tokens=255, output="x" * 255)  # 1 + 255 = 256
    assert check_argv(tmp_path, json.dumps(r), capsys)[0] == 0


REPEATED = {  # each text repeats this key in one object (the summary, or the first case)
    "golden": json.dumps(report())[:-1] + ', "golden": false}',
    "identical": json.dumps(report()).replace(
        '"identical": true,', '"identical": false, "identical": true,', 1
    ),
    "mismatched": json.dumps(report()).replace(
        '"mismatched": []', '"mismatched": ["fdfo@4"], "mismatched": []', 1
    ),
}


@pytest.mark.parametrize("key", sorted(REPEATED))
def test_a_key_repeated_in_one_object_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    """Before, json kept the last value silently (`"golden": true, ..., "golden": false` or
    the reverse passed as whichever came last)."""
    code, out, err = check_argv(tmp_path, REPEATED[key], capsys)
    path = tmp_path / "parity.json"
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: invalid parity_json={str(path)!r}: JSON that names each key once "
        f"per object (key {key!r} appears twice, and which value counts would be ambiguous)\n"
    )


def test_an_impl_report_is_held_to_what_parity_impl_produces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`parity --impl NAME` runs NAME's own algorithm (it refuses --algorithm) and names each
    case after NAME, with no logits digests. Before, the gate demanded LowConfidence and
    JointThreshold cases ("run with --algorithm all") of such a report."""
    text = json.dumps(impl_report("engine-lof", product_rows=16))  # a torch engine built-in
    assert check_argv(tmp_path, text, capsys, "--impl", "engine-lof")[:2] == (
        0,
        "release run OK: engine-lof on cuda:0, 6 cases, byte-identical at every batch size, "
        "golden agrees, no leaked slot or row\n",
    )
    r = impl_report("engine-lof")
    r["cases"][0]["algorithm"] = "LowConfidence"
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys, "--impl", "engine-lof")
    assert (code, out) == (2, "")
    assert err == (
        "schedspec: error: invalid cases[0].algorithm='LowConfidence': 'engine-lof': `parity "
        "--impl engine-lof` runs its own algorithm and names each case after the implementation\n"
    )
    r = impl_report("engine-lof")
    r["cases"][3]["identical_digests"] = False  # checked where present
    problems = release_problems(r)
    assert problems == ["the summary says identical but 1 case(s) differ (first: engine-lof #3)"]


def test_a_real_parity_impl_report_is_refused_only_for_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report `parity --impl reference-dllm` wrote is refused only because its outputs end
    at EOS long before 128 tokens (its oracle's toy model; a budget is not a generation): not
    for algorithms it cannot run (it runs its own), nor for the CPU, since a plain-Python
    scheduler runs no kernels (its report has no `product_rows`). With outputs of the whole
    budget it passes. The same report from one of this project's torch engines (with
    `product_rows`) on the CPU is refused for the CPU too: its kernels must be CUDA's."""
    out_json = tmp_path / "impl.json"
    argv = ["parity", "--impl", "reference-dllm", "--prompts", "3", "--max-new-tokens"]
    assert main([*argv, str(RELEASE_MIN_NEW_TOKENS), "--json", str(out_json)]) == 0
    capsys.readouterr()
    early = (
        "reference-dllm: 0 distinct prompt(s) generated all their new tokens (the others ended "
        "at EOS sooner); at least 3 must, so that parity holds over long generations: run "
        "more prompts"
    )
    assert main(["release-check", "--impl", "reference-dllm", str(out_json)]) == 1
    assert capsys.readouterr().out == f"NOT a release run:\n  - {early}\n"
    data = json.loads(out_json.read_text())
    assert data["device"] == "cpu" and data["product_rows"] is None
    for case in data["cases"]:  # as if every output ran its budget
        case["output"] = " ".join(["7"] * RELEASE_MIN_NEW_TOKENS)
    code, out, _ = check_argv(tmp_path, json.dumps(data), capsys, "--impl", "reference-dllm")
    assert code == 0 and out.startswith(
        "release run OK: reference-dllm (no model: the device does not apply), 3 cases"
    )
    data["product_rows"] = 16
    code, out, _ = check_argv(tmp_path, json.dumps(data), capsys, "--impl", "reference-dllm")
    assert (code, out) == (
        1,
        "NOT a release run:\n  - ran on 'cpu': a release run must run on CUDA\n",
    )


def test_a_budget_the_outputs_did_not_run_is_no_long_generation() -> None:
    """A reviewer's finding: 42 of the 62 cases of a full release run end at EOS before 128
    tokens, some after 6; at `--prompts 3` JointThreshold generated 27, 128 and 20. The gate
    counted the budget. Now at least 3 distinct prompts per algorithm must generate all of it
    (the recorded H200 runs have 14 and 6)."""
    r = report()
    for case in r["cases"][3:5]:  # two of JointThreshold's three end early
        case["output"] = "x" * 27
    problems = release_problems(r)
    assert problems == [
        "JointThreshold: 1 distinct prompt(s) generated all their new tokens (the others ended "
        "at EOS sooner); at least 3 must, so that parity holds over long generations: run more "
        "prompts (every shipped prompt: leave out --prompts)"
    ]


def test_timings_are_named_by_the_batch_size_run(tmp_path: Path) -> None:
    """Two prompts at --batch 4 run at batch size 2: the report's `batch_sizes` and its
    `seconds` keys both say 2 (before, the keys said `@4`); one prompt runs its batched
    setting at batch size 1 too, and its keys say so without colliding."""
    from gpu.engine import tiny_model
    from gpu.parity import run_parity

    modes = ("sync", "fdfo", "fdfo+reuse", "fdfo+reuse+reloop")
    out_json = tmp_path / "impl.json"
    argv = ["parity", "--impl", "reference-dllm", "--prompts", "2", "--max-new-tokens", "4"]
    assert main([*argv, "--batch", "4", "--json", str(out_json)]) == 0
    data = json.loads(out_json.read_text())
    assert data["batch_sizes"] == [1, 2]
    assert list(data["seconds"]) == [f"{m}@{n}" for n in (1, 2) for m in modes]
    model = tiny_model("cpu")
    report_2 = run_parity("cpu", ["JointThreshold"], 2, 4, 4, 8, model=model, batch=4).to_json()
    assert report_2["batch_sizes"] == [1, 2]
    assert list(report_2["seconds"]) == [f"JointThreshold/{m}@{n}" for n in (1, 2) for m in modes]
    report_1 = run_parity("cpu", ["JointThreshold"], 1, 4, 4, 8, model=model, batch=4).to_json()
    assert report_1["batch_sizes"] == [1, 1]
    assert list(report_1["seconds"])[4:] == [f"JointThreshold/{m}@1 (--batch 4)" for m in modes]


@pytest.mark.parametrize("rows", ["absent", None])
def test_a_torch_engine_report_cannot_waive_the_device_by_leaving_out_product_rows(
    rows: object,
) -> None:
    """A reviewer's edit: `engine-lof`'s CPU report with `product_rows` removed (or null) was
    'release run OK ... (no model: the device does not apply)'. A torch engine built-in runs
    the model whatever its report says."""
    r = impl_report("engine-lof", device="cpu")
    if rows != "absent":
        r["product_rows"] = rows
    assert release_problems(r) == ["ran on 'cpu': a release run must run on CUDA"]


def test_a_cuda_device_beside_a_cpu_device_name_is_refused() -> None:
    """A report edited to say `cuda:0` while its `device_name` still names the CPU it ran on."""
    named = "cpu (AMD EPYC, AVX512; torch 2.13.0+cpu, 1 thread)"
    problems = release_problems(report(device_name=named))
    assert problems == [
        f"device 'cuda:0' contradicts the report's device_name {named!r}: a run on CUDA names "
        "its GPU there"
    ]
    assert release_problems(report(device_name="NVIDIA H200 (cuda:0)")) == []


def test_a_prefix_cache_run_serves_each_prompt_twice_and_passes() -> None:
    """`parity --prefix-cache` serves every prompt twice on purpose (the second reads what the
    first cached): the gate refused every such report as repeating all its prompts. A third
    copy is still a repeat, and without the cache a second one is."""
    twice = report(prefix_cache=True)
    twice["cases"] = [dict(c) for c in twice["cases"] for _ in range(2)]
    assert release_problems(twice) == []
    thrice = report(prefix_cache=True)
    thrice["cases"] = [dict(c) for c in thrice["cases"] for _ in range(3)]
    assert any("served twice, no more" in p for p in release_problems(thrice))
    plain = report()
    plain["cases"] = [dict(c) for c in plain["cases"] for _ in range(2)]
    assert any("repeated prompts" in p for p in release_problems(plain))


def test_a_batch_size_no_run_of_its_cases_could_reach_is_refused() -> None:
    """A reviewer's edit: `batch_sizes: [1, 10**30]` passed, as did `[1, 4]` with 3 prompts an
    algorithm: a forward holds one row per request."""
    for sizes in ([1, 10**30], [1, 4]):
        problems = release_problems(report(batch_sizes=sizes))
        assert problems == [
            f"batch_sizes={sizes!r}: a forward of {sizes[1]} rows needs {sizes[1]} requests, "
            "and no algorithm has more than 3 cases"
        ]
    assert release_problems(report(batch_sizes=[1, 3])) == []


def test_a_prompt_and_budget_the_context_cannot_hold_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reviewer's edit: a 200-character prompt with 255 new tokens passed, though the shipped
    model's context (256 tokens, one character a token) holds neither beside the other."""
    r = report()
    r["cases"][1].update(prompt="p" * 200, max_new_tokens=255, output="x" * 255)
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys)
    assert (code, out) == (2, "")
    assert err == (
        "schedspec: error: invalid cases[1].max_new_tokens=255: at most 56 beside its prompt of "
        "200 tokens (the shipped model's context is 256 tokens, prompt included)\n"
    )


def test_cases_that_agree_past_float_ties_pass_and_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case whose output equals its golden decoding once a near-tie is taken the other way
    agrees (`spec.golden.DecodesPastGoldenTies`); the verdict counts such cases."""
    r = report()
    r["cases"][1]["golden_ties"] = 1
    r["cases"][1]["golden_detail"] = "agrees ... once 1 decision(s) ... taken the other way (...)"
    code, out = check(tmp_path, r, capsys)
    assert code == 0, out
    assert "golden agrees (1 case(s) once float ties are taken the other way)" in out
    assert "once float ties" not in check(tmp_path, report(), capsys)[1]


@pytest.mark.parametrize(
    ("ties", "golden", "detail"),
    [
        (-1, True, "taken the other way"),
        (1, False, "taken the other way"),
        (True, True, "taken the other way"),
        ("1", True, "taken the other way"),
        (1, True, ""),  # ties claimed where the case names none
    ],
)
def test_a_tie_count_that_cannot_be_is_an_input_error(
    ties: object, golden: bool, detail: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ties are counted only where a case agrees with golden by them, and says which."""
    r = report()
    r["cases"][0]["golden_ties"], r["cases"][0]["golden"] = ties, golden
    r["cases"][0]["golden_detail"] = detail
    code, out, err = check_argv(tmp_path, json.dumps(r), capsys)
    assert (code, out) == (2, ""), out
    assert err.startswith("schedspec: error: invalid cases[0].golden_ties="), err
    assert err.count("\n") == 1
