"""The `schedspec` command line.

    schedspec verify [--impl NAME|module:factory ...] [--examples N] [--json PATH]
    schedspec list-impls
    schedspec check-trace FILE [--config JSON]
    schedspec prove [--json PATH] [--bound K]
    schedspec parity --device cpu|cuda --algorithm NAME|all --prompts N --max-new-tokens M
    schedspec bench engine|conformance ...
    schedspec release-check PARITY.json
    schedspec simulate dllm|sbs|replicas ... [--json PATH] [--plots DIR] [--trace PATH]

Every subcommand exits 0 on success and non-zero, naming what failed, otherwise. Engine and
proof commands are resolved by import string, so `properties` never imports `gpu` statically.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from properties.registry import BUILTINS, all_builtins, resolve
from properties.verify import VerifyResult, stderr_progress, verify_impl
from spec.errors import SchedSpecError


def _write_json(path: str | None, payload: object) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _entry(target: str) -> Callable[[list[str]], int]:
    """A `main(argv) -> int` resolved by import string (module:function)."""
    module, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    return fn  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- verify
def cmd_verify(args: argparse.Namespace) -> int:
    if not args.impl:
        from properties.main_job import main_job

        return main_job(args.report, args.examples, args.parity_prompts, args.parity_tokens)
    names: list[str] = args.impl
    configs = None
    if args.mode:
        from properties.strategies import dllm_configs
        from spec.config import Mode

        configs = dllm_configs(modes=tuple(Mode.parse(m) for m in args.mode))
    results: list[VerifyResult] = []
    for name in names:
        display, factory, builtin = resolve(name)
        parity = builtin.parity if builtin else args.parity
        builder = _entry(builtin.machine) if builtin and builtin.machine else None
        res = verify_impl(
            display,
            factory,
            args.examples,
            parity=parity,
            builder=builder,  # type: ignore[arg-type]
            progress=stderr_progress(f"verify {display}", args.examples),
            configs=configs if builtin is None or builtin.family == "dllm" else None,
        )
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        results.append(res)
    rows = [
        (
            r.impl,
            "PASS" if r.passed else "FAIL",
            r.examples,
            r.steps,
            f"{r.seconds:.1f}",
            f"{r.steps / r.seconds:.0f}" if r.seconds else "-",
            r.failures[0].rule if r.failures else "",
        )
        for r in results
    ]
    print(_table(("impl", "result", "examples", "steps", "seconds", "steps/s", "rule"), rows))
    for r in results:
        for f in r.failures:
            print(f"\n=== {r.impl}: violation of [{f.rule}]\n{f.message}\n--- program ---")
            print(f.program)
    payload: dict[str, Any]
    if len(results) == 1:
        payload = results[0].to_json()
    else:
        payload = {
            "passed": all(r.passed for r in results),
            "results": [r.to_json() for r in results],
        }
    _write_json(args.json, payload)
    return 0 if all(r.passed for r in results) else 1


# ---------------------------------------------------------------------------- others
def cmd_list_impls(args: argparse.Namespace) -> int:
    rows = [(b.name, b.family, b.target, b.description) for b in all_builtins().values()]
    print(_table(("name", "family", "target", "description"), rows))
    return 0


def cmd_check_trace(args: argparse.Namespace) -> int:
    from properties.trace_check import check_trace
    from spec.trace import config_from_dict

    config = None
    if args.config:
        config = config_from_dict(json.loads(Path(args.config).read_text(encoding="utf-8")))
    res = check_trace(args.file, config)
    if res.violation is not None:
        print(f"FAIL {args.file}:{res.line}: {res.violation}")
        return 1
    tail = "" if res.idle_at_end else " (work still running at the end of the trace)"
    print(f"OK {args.file}: {res.events} events, {res.rounds} rounds conform to the spec{tail}")
    return 0


def cmd_prove(args: argparse.Namespace) -> int:
    proofs = importlib.import_module("properties.proofs")
    progress = (
        (lambda msg: sys.stderr.write(f"\rprove: {msg:<60}")) if sys.stderr.isatty() else None
    )
    results = proofs.run_all_proofs(progress=progress, bound=args.bound)
    if progress:
        sys.stderr.write("\n")
    rows = [(r.name, r.status, f"{r.seconds:.2f}", r.detail[:70]) for r in results]
    print(_table(("proof", "status", "seconds", "detail"), rows))
    _write_json(args.json, {"proofs": [r.to_json() for r in results]})
    bad = [r.name for r in results if r.status != "proved"]
    if bad:
        print(f"not proved: {', '.join(bad)}")
    return 1 if bad else 0


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    targets = {
        "engine": "gpu.bench:bench_main",
        "conformance": "properties.bench:bench_main",
    }
    return _entry(targets[args.what])(rest)


def cmd_parity(rest: list[str]) -> int:
    return _entry("gpu.parity:parity_main")(rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="schedspec", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser(
        "verify",
        help="with --impl: the conformance suite on those implementations; without: the main "
        "job (proofs, conformance on every built-in, parity, FDFO vs sync, report)",
    )
    v.add_argument("--impl", action="append", help="built-in name or module:factory (repeat)")
    v.add_argument("--examples", type=int, default=100, help="generated programs per impl")
    v.add_argument("--json", help="write the result as JSON here")
    v.add_argument(
        "--parity",
        choices=("always", "bs1", "never"),
        default="bs1",
        help="output parity policy for a module:factory impl (built-ins know their own)",
    )
    v.add_argument(
        "--mode",
        action="append",
        choices=("sync", "fdfo"),
        help="only generate configurations in these modes (for schedulers that implement one)",
    )
    v.add_argument("--report", default="reports/verify", help="main job: report directory")
    v.add_argument("--parity-prompts", type=int, default=8, help="main job: parity prompts")
    v.add_argument("--parity-tokens", type=int, default=32, help="main job: tokens per prompt")
    v.set_defaults(func=cmd_verify)

    li = sub.add_parser("list-impls", help="list built-in implementations")
    li.set_defaults(func=cmd_list_impls)

    ct = sub.add_parser("check-trace", help="check a JSON Lines event log against the spec")
    ct.add_argument("file")
    ct.add_argument("--config", help="JSON file with DllmConfig fields (if no header line)")
    ct.set_defaults(func=cmd_check_trace)

    pr = sub.add_parser("prove", help="run the Z3 proofs")
    pr.add_argument("--json")
    pr.add_argument("--bound", type=int, default=None, help="BMC depth (default per proof)")
    pr.set_defaults(func=cmd_prove)

    sub.add_parser(
        "parity", help="bs=1 FDFO vs sync byte parity on the shipped model", add_help=False
    )
    b = sub.add_parser("bench", help="benchmarks (engine, conformance)", add_help=False)
    b.add_argument("what", choices=("engine", "conformance"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "parity":
            return cmd_parity(argv[1:])
        if argv and argv[0] == "release-check":
            return _entry("properties.release:release_check_main")(argv[1:])
        if argv and argv[0] == "simulate":
            return _entry("reference.sim.cli:simulate_main")(argv[1:])
        parser = build_parser()
        if argv and argv[0] == "bench":
            args, rest = parser.parse_known_args(argv)
            return cmd_bench(args, rest)
        args = parser.parse_args(argv)
        code: int = args.func(args)
        return code
    except SchedSpecError as err:
        print(f"schedspec: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["BUILTINS", "build_parser", "main"]
