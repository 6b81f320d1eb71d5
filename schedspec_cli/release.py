"""`schedspec release-check PARITY.json`: is a parity report good enough to call a run a release
run? The gate reads every case, not only the summary, so a report cannot talk its way through.

A release run must: have run on CUDA, with the device named as torch names it (`cuda` or
`cuda:N`); cover both algorithms, each with at least `MIN_PROMPTS` distinct prompts of at least
`spec.parity.RELEASE_MIN_NEW_TOKENS` new tokens; have run every mode at batch size 1 and at a
batch size > 1, with every run byte-identical to sync at batch size 1 (outputs, and per-forward
digests at batch size 1) in every case, and say so consistently in its summary; agree with the
golden decoding (`gpu.golden`) in every case; and leak no KV slot and hold no request-pool row
after its drains. It must have been produced for the implementation `--impl` names (default
`engine`): a report for another implementation is refused in one line.

A file that is not a parity report (unreadable, not JSON, wrong field types) is an input error
(exit 2); a report that does not qualify is refused (exit 1) with every reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schedspec_cli.args import Parser
from spec.errors import ConfigError
from spec.input_file import read_input_bytes
from spec.json_text import parse_json
from spec.parity import RELEASE_MIN_NEW_TOKENS

REQUIRED_ALGORITHMS = frozenset({"LowConfidence", "JointThreshold"})
MIN_PROMPTS = 3  # SGLang's own check: 3 prompts x 128 tokens at temperature 0
MIN_TOKENS = RELEASE_MIN_NEW_TOKENS  # the old name
# str(torch.device) of a CUDA device: "cuda" or "cuda:<index>"
TORCH_CUDA_DEVICE = re.compile(r"cuda(:[0-9]+)?")


def _field(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in obj:
        raise ConfigError(
            f"{where}.{name}",
            None,
            "missing, and every report `schedspec parity --json` writes has it (is this one?)",
        )
    value = obj[name]
    if isinstance(value, bool) and kind in (int, (int,)):
        raise ConfigError(f"{where}.{name}", value, "an integer")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{name}", value, f"a JSON {names}")
    return value


def load_report(path: str) -> dict[str, Any]:
    """The parity report at `path`, structurally checked (ConfigError naming what is wrong)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("parity_json", path, "a file (this is a directory)")
    try:
        raw = read_input_bytes(p)
    except OSError as err:
        raise ConfigError("parity_json", path, f"a readable file ({err.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError("parity_json", path, "a UTF-8 JSON file") from None
    try:
        report = parse_json(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            "parity_json",
            f"{path}:{err.lineno}",
            f"JSON written by `schedspec parity --json` ({err.msg})",
        ) from None
    if not isinstance(report, dict):
        raise ConfigError("parity_json", path, "a JSON object (the parity report)")
    _field(report, "device", str, "report")
    _field(report, "identical", bool, "report")
    _field(report, "leaked_slots", int, "report")
    _field(report, "leaked_rows", int, "report")
    if "impl" in report:
        _field(report, "impl", str, "report")
    cases = _field(report, "cases", list, "report")
    for i, case in enumerate(cases):
        where = f"cases[{i}]"
        if not isinstance(case, dict):
            raise ConfigError(where, case, "a JSON object")
        _field(case, "algorithm", str, where)
        _field(case, "prompt", str, where)
        _field(case, "max_new_tokens", int, where)
        _field(case, "identical", bool, where)
        for name in ("identical_outputs", "identical_digests"):
            if name in case:
                _field(case, name, bool, where)
        if "mismatched" in case:
            _field(case, "mismatched", list, where)
    return report


def release_problems(report: Mapping[str, Any]) -> list[str]:
    """Every reason this (structurally valid) parity report is not a release run."""
    problems: list[str] = []
    device = str(report.get("device", ""))
    if not device.startswith("cuda"):
        problems.append(f"ran on {device or 'an unknown device'!r}: a release run must run on CUDA")
    elif TORCH_CUDA_DEVICE.fullmatch(device) is None:
        problems.append(
            f"device {device!r} is not a device name torch reports ('cuda' or 'cuda:N')"
        )
    cases = [c for c in report.get("cases") or [] if isinstance(c, Mapping)]
    if not cases:
        problems.append("the report has no cases")
    for name in ("leaked_slots", "leaked_rows"):
        value = report.get(name)
        if value != 0:
            problems.append(f"{name}={value!r}: must be 0")
    if report.get("identical") is not True:
        problems.append("FDFO and sync outputs are not byte-identical for every case")
    differing = [c for c in cases if not _case_identical(c)]
    if differing and report.get("identical") is True:
        problems.append(
            f"the summary says identical but {len(differing)} case(s) differ "
            f"(first: {differing[0].get('algorithm')} #{differing[0].get('index', '?')})"
        )
    off_golden = [c for c in cases if c.get("golden") is not True]
    if off_golden:
        first = off_golden[0]
        problems.append(
            f"{len(off_golden)} case(s) lack golden agreement (first: {first.get('algorithm')} "
            f"#{first.get('index', '?')}: golden={first.get('golden', 'missing')!r}); every "
            "output must equal the request decoded alone"
        )
    sizes = report.get("batch_sizes")
    ints = [n for n in sizes if isinstance(n, int)] if isinstance(sizes, list) else []
    if not any(n > 1 for n in ints):
        problems.append(
            f"batch_sizes={sizes!r}: the run must include a batch size > 1 (batch parity)"
        )
    algos = {str(c.get("algorithm")) for c in cases}
    missing = sorted(REQUIRED_ALGORITHMS - algos)
    if missing:
        problems.append(f"no cases for {missing}: run with --algorithm all")
    for algo in sorted(algos):
        mine = [c for c in cases if c.get("algorithm") == algo]
        prompts = [str(c.get("prompt")) for c in mine]
        repeated = sorted({p for p in prompts if prompts.count(p) > 1})
        if repeated:
            problems.append(f"{algo}: repeated prompts {repeated}: each case must be distinct")
        if len(set(prompts)) < MIN_PROMPTS and algo in REQUIRED_ALGORITHMS:
            problems.append(
                f"{algo}: {len(set(prompts))} distinct prompts; at least {MIN_PROMPTS} are required"
            )
        short = [c for c in mine if int(c.get("max_new_tokens", 0)) < RELEASE_MIN_NEW_TOKENS]
        if short:
            problems.append(
                f"{algo}: {len(short)} case(s) with fewer than {RELEASE_MIN_NEW_TOKENS} new tokens"
            )
    return problems


def _case_identical(case: Mapping[str, Any]) -> bool:
    """A case is identical only when every identity it reports agrees."""
    flags = [case.get("identical")]
    flags += [case[k] for k in ("identical_outputs", "identical_digests") if k in case]
    if case.get("mismatched"):
        flags.append(False)
    return all(f is True for f in flags)


def release_check_main(argv: list[str]) -> int:
    """`schedspec release-check PARITY.json [--impl NAME]`: print `release run OK` and return
    0, or `NOT a release run` with every reason and return 1 (also for a report produced for
    another implementation than `--impl`). A file that is not a parity report raises
    `ConfigError`, a bad flag `UsageError` (exit 2)."""
    p = Parser(prog="schedspec release-check", description=__doc__.split("\n\n")[0])
    p.add_argument("parity_json", help="the JSON written by `schedspec parity --json`")
    p.add_argument(
        "--impl",
        default="engine",
        help="the implementation the report must have been produced for (default engine)",
    )
    args = p.parse_args(argv)
    report = load_report(args.parity_json)
    produced_for = report.get("impl")
    if produced_for != args.impl:
        what = (
            "does not say which implementation it was produced for (re-run schedspec parity)"
            if produced_for is None
            else f"was produced for implementation {produced_for!r}"
        )
        print(f"NOT a release run: the report {what}, not for --impl {args.impl!r}")
        return 1
    problems = release_problems(report)
    if problems:
        print("NOT a release run:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print(
        f"release run OK: {report['impl']} on {report['device']}, {len(report['cases'])} cases, "
        "byte-identical at every batch size, golden agrees, no leaked slot or row"
    )
    return 0


__all__ = [
    "MIN_PROMPTS",
    "REQUIRED_ALGORITHMS",
    "load_report",
    "release_check_main",
    "release_problems",
]
