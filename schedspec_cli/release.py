"""`schedspec release-check PARITY.json`: is a parity report good enough to call a run a release
run? The gate reads every case, not only the summary, so a report cannot talk its way through.

A release run must: have run on CUDA, with the device named as torch names it (`cuda` or
`cuda:N`); cover what its run can cover, each with at least `MIN_PROMPTS` distinct prompts of at
least `spec.parity.RELEASE_MIN_NEW_TOKENS` new tokens (the shipped engine, `--impl engine`: both
algorithms; another implementation, which `parity --impl` runs with its own algorithm: cases
named after it); have run every mode at batch size 1 and at a batch size > 1, with every run
byte-identical to sync at batch size 1 (outputs, and for the shipped engine per-forward digests
at batch size 1) in every case, and say so consistently in its summary; agree with the golden
decoding in every case and in its summary; and leak no KV slot and hold no request-pool row
after its drains. It must have been produced for the implementation `--impl` names (default
`engine`): a report for another implementation is refused in one line.

A file that is not a parity report (unreadable, not JSON, a key repeated in one object, a field
the verdict rests on missing or of the wrong type, an algorithm or token count no parity run
writes) is an input error (exit 2, one line naming the field); a report that does not qualify
is refused (exit 1) with every reason.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from schedspec_cli.args import Parser, UsageError
from schedspec_cli.registry import BUILTINS, BUILTINS_LIST
from spec.errors import ConfigError
from spec.implementation import Family
from spec.input_file import read_input_bytes
from spec.json_text import NESTED_TOO_DEEPLY, parse_json
from spec.parity import RELEASE_MIN_NEW_TOKENS

SHIPPED_ENGINE = "engine"  # the implementation `gpu.parity` reports on, with logits digests
# `gpu.algorithms.ALGORITHMS`, named here so the gate never imports torch (a test checks they agree)
REQUIRED_ALGORITHMS = frozenset({"LowConfidence", "JointThreshold"})
MIN_PROMPTS = 3  # SGLang's own check: 3 prompts x 128 tokens at temperature 0
MIN_TOKENS = RELEASE_MIN_NEW_TOKENS  # the old name
# str(torch.device) of a CUDA device: "cuda" or "cuda:<index>"
TORCH_CUDA_DEVICE = re.compile(r"cuda(:[0-9]+)?")
POSITIVE_INTS = "a JSON list of positive integers (the batch sizes run, e.g. [1, 4])"


def _field(
    obj: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    where: str,
    valid: str | None = None,
) -> Any:
    """`obj[name]`, or `ConfigError` naming `where.name` when it is missing or not of `kind`
    (a bool is never an int); `valid` describes a right value (default: the JSON kind)."""
    if name not in obj:
        raise ConfigError(
            f"{where}.{name}",
            None,
            "missing, and every report `schedspec parity --json` writes has it (is this one?)",
        )
    value = obj[name]
    if isinstance(value, bool) and kind in (int, (int,)):
        raise ConfigError(f"{where}.{name}", value, valid or "an integer")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{name}", value, valid or f"a JSON {names}")
    return value


def _read_text(path: str) -> str:
    """The UTF-8 text of the file at `path` (`ConfigError` for a directory, an unreadable file
    or bytes that are not UTF-8)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("parity_json", path, "a file (this is a directory)")
    try:
        raw = read_input_bytes(p)
    except OSError as err:
        raise ConfigError("parity_json", path, f"a readable file ({err.strerror})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError("parity_json", path, "a UTF-8 JSON file") from None


class _RepeatedKey(Exception):
    """A JSON object names `key` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' object_pairs_hook: the object, or `_RepeatedKey` for its first key that
    appears twice (json would keep the last value silently)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _RepeatedKey(key)
        obj[key] = value
    return obj


def _parse(text: str, path: str) -> Any:
    """The JSON value of `text`; `ConfigError` for malformed JSON (`parse_json`'s message) or an
    object that names a key twice (which value a reader sees would be ambiguous)."""
    try:
        parse_json(text)  # every way the text can be malformed, as one JSONDecodeError
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise ConfigError(
            "parity_json",
            f"{path}:{err.lineno}",
            f"JSON written by `schedspec parity --json` ({err.msg})",
        ) from None
    except RecursionError:  # the hook's frame on top of a text at the recursion limit
        raise ConfigError(
            "parity_json", path, f"JSON written by `schedspec parity --json` ({NESTED_TOO_DEEPLY})"
        ) from None
    except _RepeatedKey as repeated:
        raise ConfigError(
            "parity_json",
            path,
            f"JSON that names each key once per object (key {repeated.key!r} appears twice, "
            "and which value counts would be ambiguous)",
        ) from None


def _check_batch_sizes(report: Mapping[str, Any]) -> None:
    """`report.batch_sizes` is present and a list of positive integers (`ConfigError`)."""
    sizes = _field(report, "batch_sizes", list, "report", POSITIVE_INTS)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
        raise ConfigError("report.batch_sizes", sizes, POSITIVE_INTS)


@cache
def _max_new_tokens_limit(shipped: bool) -> tuple[int | None, str]:
    """The most new tokens a case of this kind of report can ask for (None: no bound the gate
    knows) and what a valid value is: the shipped model's context less a one-token prompt."""
    if not shipped:
        return None, "a positive integer"
    from gpu.prompts import shipped_context  # reads the model's JSON config, not torch

    context = shipped_context()
    return context - 1, (
        f"a positive integer of at most {context - 1} (the shipped model's context is "
        f"{context} tokens, prompt included)"
    )


def _check_case(case: object, where: str, impl: str) -> None:
    """`case` has every field the verdict rests on, each of its type; its algorithm is one the
    run could have used (for the shipped engine one of `REQUIRED_ALGORITHMS`, for another
    implementation its own name) and its `max_new_tokens` one it could have asked for."""
    if not isinstance(case, dict):
        raise ConfigError(where, case, "a JSON object")
    shipped = impl == SHIPPED_ENGINE
    algorithm = _field(case, "algorithm", str, where)
    if shipped and algorithm not in REQUIRED_ALGORITHMS:
        known = ", ".join(sorted(REQUIRED_ALGORITHMS))
        raise ConfigError(
            f"{where}.algorithm", algorithm, f"one of {known} (the algorithms `parity` runs)"
        )
    if not shipped and algorithm != impl:
        raise ConfigError(
            f"{where}.algorithm",
            algorithm,
            f"{impl!r}: `parity --impl {impl}` runs its own algorithm and names each case after "
            "the implementation",
        )
    prompt = _field(case, "prompt", str, where)
    _field(case, "output", str, where)
    tokens = _field(case, "max_new_tokens", int, where)
    most, valid = _max_new_tokens_limit(shipped)
    if tokens < 1 or (most is not None and tokens > most):
        raise ConfigError(f"{where}.max_new_tokens", tokens, valid)
    if most is not None and len(prompt) + tokens > most + 1:  # one character a token
        raise ConfigError(
            f"{where}.max_new_tokens",
            tokens,
            f"at most {most + 1 - len(prompt)} beside its prompt of {len(prompt)} tokens (the "
            f"shipped model's context is {most + 1} tokens, prompt included)",
        )
    identities = ("identical", "identical_outputs", "identical_digests")
    for name in identities if shipped else identities[:2]:
        _field(case, name, bool, where)
    if not shipped and "identical_digests" in case:
        _field(case, "identical_digests", bool, where)
    _field(case, "mismatched", list, where)
    _field(case, "golden", (bool, type(None)), where, "true, false or null (not checked)")
    if "golden_ties" in case:  # reports before 2026-12-06 have none
        ties = _field(case, "golden_ties", int, where, "a count of ties (0 or more)")
        detail = case.get("golden_detail")
        said = isinstance(detail, str) and "taken the other way" in detail
        if ties < 0 or (ties and (case["golden"] is not True or not said)):
            raise ConfigError(
                f"{where}.golden_ties",
                ties,
                "0, or the ties a case that agrees with golden took the other way (its golden "
                "is true and its golden_detail names them)",
            )


def load_report(path: str) -> dict[str, Any]:
    """The parity report at `path`, structurally checked: every field the verdict rests on is
    present and of its type, with no key repeated (`ConfigError` naming what is wrong)."""
    report = _parse(_read_text(path), path)
    if not isinstance(report, dict):
        raise ConfigError("parity_json", path, "a JSON object (the parity report)")
    _field(report, "device", str, "report")
    _field(report, "identical", bool, "report")
    _field(report, "golden", bool, "report")
    _field(report, "leaked_slots", int, "report")
    _field(report, "leaked_rows", int, "report")
    _check_batch_sizes(report)
    impl = _field(report, "impl", str, "report") if "impl" in report else SHIPPED_ENGINE
    cases = _field(report, "cases", list, "report")
    for i, case in enumerate(cases):
        _check_case(case, f"cases[{i}]", impl)
    return report


def runs_kernels(report: Mapping[str, Any]) -> bool:
    """Whether the report's implementation runs this project's torch model (the shipped
    engine, a torch engine built-in such as `engine-lof` whatever the report says, or another
    implementation whose report has `product_rows`): only then does the device its kernels
    ran on decide anything. An implementation without a model (a scheduler in plain Python)
    computes the same on any machine. A torch engine's report cannot waive the device rule by
    leaving `product_rows` out."""
    impl = str(report.get("impl", SHIPPED_ENGINE))
    builtin = BUILTINS.get(impl)
    torch_builtin = builtin is not None and builtin.is_torch_engine
    return impl == SHIPPED_ENGINE or torch_builtin or report.get("product_rows") is not None


def _device_problems(report: Mapping[str, Any]) -> list[str]:
    """For an implementation that runs kernels (`runs_kernels`), a device other than CUDA as
    torch names it."""
    if not runs_kernels(report):
        return []
    device = str(report.get("device", ""))
    if not device.startswith("cuda"):
        return [f"ran on {device or 'an unknown device'!r}: a release run must run on CUDA"]
    if TORCH_CUDA_DEVICE.fullmatch(device) is None:
        return [f"device {device!r} is not a device name torch reports ('cuda' or 'cuda:N')"]
    named = report.get("device_name")
    if isinstance(named, str) and named.split(" ", 1)[0].lower() == "cpu":
        return [
            f"device {device!r} contradicts the report's device_name {named!r}: a run on "
            "CUDA names its GPU there"
        ]
    return []


def _identity_problems(report: Mapping[str, Any], cases: list[Mapping[str, Any]]) -> list[str]:
    """A summary that is not identical, or that says so while a case differs."""
    problems: list[str] = []
    if report.get("identical") is not True:
        problems.append("FDFO and sync outputs are not byte-identical for every case")
    differing = [c for c in cases if not _case_identical(c)]
    if differing and report.get("identical") is True:
        problems.append(
            f"the summary says identical but {len(differing)} case(s) differ "
            f"(first: {differing[0].get('algorithm')} #{differing[0].get('index', '?')})"
        )
    return problems


def _golden_problems(report: Mapping[str, Any], cases: list[Mapping[str, Any]]) -> list[str]:
    """A summary `golden` that is not true, and every case without golden agreement."""
    problems: list[str] = []
    if report.get("golden") is not True:
        said = json.dumps(report["golden"]) if "golden" in report else "missing"
        unchecked = (
            " (the implementation provides no golden_output to compare with)"
            if report.get("golden_checked") is False
            else ""
        )
        problems.append(
            f"golden parity failed: the report's golden is {said}{unchecked}; every output "
            "must equal the request decoded alone"
        )
    off_golden = [c for c in cases if c.get("golden") is not True]
    if off_golden:
        first = off_golden[0]
        problems.append(
            f"{len(off_golden)} case(s) lack golden agreement (first: {first.get('algorithm')} "
            f"#{first.get('index', '?')}: golden={first.get('golden', 'missing')!r}); every "
            "output must equal the request decoded alone"
        )
    return problems


def _batch_problems(report: Mapping[str, Any]) -> list[str]:
    """No run at batch size 1 (the reference every run is compared with) or none above it."""
    sizes = report.get("batch_sizes")
    ints = [n for n in sizes if type(n) is int] if isinstance(sizes, list) else []
    problems: list[str] = []
    if 1 not in ints:
        problems.append(
            f"batch_sizes={sizes!r}: the run must include batch size 1 (every run is compared "
            "with sync at batch size 1)"
        )
    if not any(n > 1 for n in ints):
        problems.append(
            f"batch_sizes={sizes!r}: the run must include a batch size > 1 (batch parity)"
        )
    return problems


def _reach_problems(report: Mapping[str, Any], cases: list[Mapping[str, Any]]) -> list[str]:
    """A batch size no run of these cases could reach: a forward holds at most one row per
    request, and an algorithm's runs serve only its own cases."""
    sizes = report.get("batch_sizes")
    widest = max((n for n in sizes if type(n) is int), default=0) if isinstance(sizes, list) else 0
    served = Counter(str(c.get("algorithm")) for c in cases)
    most = max(served.values(), default=0)
    if widest > most:
        return [
            f"batch_sizes={sizes!r}: a forward of {widest} rows needs {widest} requests, and no "
            f"algorithm has more than {most} cases"
        ]
    return []


def _coverage_problems(report: Mapping[str, Any], cases: list[Mapping[str, Any]]) -> list[str]:
    """Missing algorithms (for another implementation than the shipped engine: cases named
    after it), repeated prompts, too few distinct prompts, too few new tokens."""
    impl = str(report.get("impl", SHIPPED_ENGINE))
    problems: list[str] = []
    algos = {str(c.get("algorithm")) for c in cases}
    if impl == SHIPPED_ENGINE:
        required = REQUIRED_ALGORITHMS
        missing = sorted(required - algos)
        if missing:
            problems.append(f"no cases for {missing}: run with --algorithm all")
    else:
        required = frozenset({impl})
        if impl not in algos:
            problems.append(
                f"no cases for implementation {impl!r}: `parity --impl {impl}` runs its own "
                f"algorithm and names its cases after it (at least {MIN_PROMPTS} prompts of "
                f"{RELEASE_MIN_NEW_TOKENS} new tokens)"
            )
    # with the prefix cache on, `parity --prefix-cache` serves every prompt twice (the second
    # reads what the first cached): each prompt is then one case twice over, not a repeat
    served = 2 if report.get("prefix_cache") is True else 1
    for algo in sorted(algos):
        mine = [c for c in cases if c.get("algorithm") == algo]
        prompts = [str(c.get("prompt")) for c in mine]
        repeated = sorted({p for p in prompts if prompts.count(p) > served})
        if repeated:
            twice = " (with the prefix cache on, each is served twice, no more)"
            problems.append(
                f"{algo}: repeated prompts {repeated}: each case must be distinct"
                + (twice if served > 1 else "")
            )
        if len(set(prompts)) < MIN_PROMPTS and algo in required:
            problems.append(
                f"{algo}: {len(set(prompts))} distinct prompts; at least {MIN_PROMPTS} are required"
            )
        short = [c for c in mine if int(c.get("max_new_tokens", 0)) < RELEASE_MIN_NEW_TOKENS]
        if short:
            problems.append(
                f"{algo}: {len(short)} case(s) with fewer than {RELEASE_MIN_NEW_TOKENS} new tokens"
            )
        full = {str(c.get("prompt")) for c in mine if _ran_its_budget(c, impl == SHIPPED_ENGINE)}
        if algo in required and len(full) < MIN_PROMPTS:
            problems.append(
                f"{algo}: {len(full)} distinct prompt(s) generated all their new tokens (the "
                f"others ended at EOS sooner); at least {MIN_PROMPTS} must, so that parity holds "
                "over long generations: run more prompts"
                + (" (every shipped prompt: leave out --prompts)" if impl == SHIPPED_ENGINE else "")
            )
    return problems


def _ran_its_budget(case: Mapping[str, Any], shipped: bool) -> bool:
    """Whether the case's output holds all of its `max_new_tokens`: a budget is not a
    generation (a case that meets EOS after 6 tokens checks 6). The shipped engine's output
    is text of its character-level tokenizer, one character a token (EOS not written);
    `parity --impl`'s is the token ids, space-separated."""
    output = str(case.get("output", ""))
    generated = len(output) if shipped else len(output.split())
    return generated >= int(case.get("max_new_tokens", 0))


def release_problems(report: Mapping[str, Any]) -> list[str]:
    """Every reason this (structurally valid) parity report is not a release run; the report's
    `impl` (default the shipped engine) says which cases it must hold."""
    cases = [c for c in report.get("cases") or [] if isinstance(c, Mapping)]
    problems = _device_problems(report)
    if not cases:
        problems.append("the report has no cases")
    for name in ("leaked_slots", "leaked_rows"):
        value = report.get(name)
        if value != 0:
            problems.append(f"{name}={value!r}: must be 0")
    problems += _identity_problems(report, cases)
    problems += _golden_problems(report, cases)
    problems += _batch_problems(report)
    problems += _reach_problems(report, cases)
    problems += _coverage_problems(report, cases)
    return problems


def _case_identical(case: Mapping[str, Any]) -> bool:
    """A case is identical only when every identity it reports agrees."""
    flags = [case.get("identical")]
    flags += [case[k] for k in ("identical_outputs", "identical_digests") if k in case]
    if case.get("mismatched"):
        flags.append(False)
    return all(f is True for f in flags)


def build_parser() -> Parser:
    """The command's flags; a bad one raises `UsageError` (exit 2)."""
    p = Parser(prog="schedspec release-check", description=__doc__.split("\n\n")[0])
    p.add_argument("parity_json", help="the JSON written by `schedspec parity --json`")
    p.add_argument(
        "--impl",
        default="engine",
        help="the implementation the report must have been produced for (default engine)",
    )
    return p


def check_impl_name(name: str) -> None:
    """`--impl` must name what `schedspec parity --impl` can run: a dLLM built-in or a
    `module:attribute` (not imported here: the report only has to have been produced for that
    name). Anything else is a typo, refused with `UsageError` (exit 2) naming the valid ones,
    rather than a report said to be for another implementation (exit 1)."""
    if ":" in name:
        return
    dllm = ", ".join(b.name for b in BUILTINS_LIST if b.family is Family.DLLM)
    builtin = BUILTINS.get(name)
    if builtin is None:
        raise UsageError(
            f"schedspec release-check: error: --impl {name!r} names no implementation: give "
            f"a dLLM built-in ({dllm}) or module:attribute"
        )
    if builtin.family is not Family.DLLM:
        raise UsageError(
            f"schedspec release-check: error: --impl {name!r} is an autoregressive built-in, "
            f"and parity runs dLLM implementations only: give a dLLM built-in ({dllm}) or "
            "module:attribute"
        )


def release_check_main(argv: list[str]) -> int:
    """`schedspec release-check PARITY.json [--impl NAME]`: print `release run OK` and return
    0, or `NOT a release run` with every reason and return 1 (also for a report produced for
    another implementation than `--impl`). A file that is not a parity report raises
    `ConfigError`, a bad flag or an `--impl` that names no dLLM implementation `UsageError`
    (exit 2)."""
    args = build_parser().parse_args(argv)
    check_impl_name(args.impl)
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
    where = (
        f"on {report['device']}"
        if runs_kernels(report)
        else "(no model: the device does not apply)"
    )
    tied = sum(1 for case in report["cases"] if case.get("golden_ties", 0))
    past_ties = f" ({tied} case(s) once float ties are taken the other way)" if tied else ""
    print(
        f"release run OK: {report['impl']} {where}, {len(report['cases'])} cases, "
        f"byte-identical at every batch size, golden agrees{past_ties}, no leaked slot or row"
    )
    return 0


__all__ = [
    "MIN_PROMPTS",
    "REQUIRED_ALGORITHMS",
    "check_impl_name",
    "load_report",
    "release_check_main",
    "release_problems",
    "runs_kernels",
]
