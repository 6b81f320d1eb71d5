"""`schedspec`: one entry point for every command.

    schedspec verify [--impl NAME|module:attr ...] [--twin NAME] [--keep-going] [--accept FILE] ...
    schedspec list-impls [--json PATH]
    schedspec check-trace FILE [--config JSON] [--family dllm|ar] [--require-idle]
    schedspec prove [--bound K] [--json PATH]
    schedspec parity [--impl NAME|module:factory] --device cpu|cuda --algorithm NAME|all ...
    schedspec bench engine|conformance ...
    schedspec release-check [--impl NAME] PARITY.json
    schedspec simulate dllm|sbs|replicas ...
    schedspec install-engines [vllm|sglang|vidur|all]

Exit status: 0 pass; 1 a violation, mismatch or failed check; 2 a usage or input error, reported
in one line naming the flag, field or line and what would be valid (never a traceback); 130
interrupted; 141, silently, when the reader of stdout closed the pipe (`... | head`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence

from properties.deadline import call_timeout_named
from properties.profiles import PROFILE_ENV, draw_no_mined_constants
from schedspec_cli import check_trace, list_impls, prove, verify, version
from schedspec_cli.args import EXIT_READER_GONE, Parser, UsageError, reader_gone
from schedspec_cli.impls import NotAnAdapter
from schedspec_cli.loader import load_object, module_available
from spec.errors import ConfigError, SchedSpecError, SpecViolation

# commands whose own parser takes the rest of the line (listed in --help all the same)
PASS_THROUGH: dict[str, str] = {
    "parity": "batch parity (every mode at batch 1 and --batch vs sync at batch 1), golden "
    "agreement and leaks of a dLLM implementation (--impl; default the engine: engine extra)",
    "release-check": "is a parity JSON a release run? (--impl's report, CUDA, every case "
    "identical and golden, no leak)",
    "simulate": "the serving simulator: dllm | sbs | replicas | sweep (each takes --help)",
    "install-engines": "install the real engines (vllm, sglang, vidur, all) into the engine cache",
}
ENGINES = ("vllm", "sglang", "vidur", "all")


def cmd_bench(argv: list[str]) -> int:
    """`schedspec bench engine|conformance ...`: hand the rest of `argv` to that benchmark and
    return its status; `-h`/`--help` prints the usage (0); a missing or unknown benchmark
    raises `UsageError` (exit 2)."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: schedspec bench {engine,conformance} ... (each takes --help)")
        return 0
    if not argv:
        raise UsageError("schedspec bench: error: which benchmark? (valid: engine, conformance)")
    what, rest = argv[0], argv[1:]
    if what == "engine":
        from schedspec_cli.engine_cmds import bench_engine

        return bench_engine(rest)
    if what == "conformance":
        from schedspec_cli.bench_conformance import bench_main

        return bench_main(rest)
    raise UsageError(
        f"schedspec bench: error: unknown benchmark {what!r} (valid: engine, conformance)"
    )


def _engine_names(argv: list[str]) -> list[str]:
    """The engine names among `install-engines`' arguments: not its flags, nor the value of
    `--jobs N` (the installer parses the flags themselves)."""
    names: list[str] = []
    after_jobs = False
    for arg in argv:
        if not after_jobs and not arg.startswith("-"):
            names.append(arg)
        after_jobs = arg == "--jobs"
    return names


def cmd_install_engines(argv: list[str]) -> int:
    """`schedspec install-engines [NAME ...]`: refuse an unknown engine name (`UsageError`)
    and a build without `integrations.install` (`ConfigError`), both exit 2; else run the
    installer's `main(argv)` and return its status."""
    for name in _engine_names(argv):
        if name not in ENGINES:
            raise UsageError(
                f"schedspec install-engines: error: unknown engine {name!r} "
                f"(valid: {', '.join(ENGINES)})"
            )
    if not module_available("integrations.install"):
        raise ConfigError(
            "install-engines", " ".join(argv) or "all", "a build that ships integrations.install"
        )
    main = load_object("integrations.install:main", "install-engines")
    return int(main(argv))  # type: ignore[operator]


def _simulate(argv: list[str]) -> int:
    # output paths and matplotlib are checked by the simulator before anything runs
    main: Callable[[list[str]], int] = load_object(  # type: ignore[assignment]
        "schedspec_cli.simulate:simulate_main", "simulate"
    )
    try:
        return main(argv)
    except SystemExit as done:  # its argparse: usage errors already printed, exit 2
        return done.code if isinstance(done.code, int) else 2
    except (ValueError, OverflowError, MemoryError) as err:
        if isinstance(err, SchedSpecError):
            raise
        # a value the simulator's own flag checks let through (they live in schedspec_cli.simulate)
        raise UsageError(
            f"schedspec simulate: error: invalid input ({type(err).__name__}: {err}); "
            "see schedspec simulate --help for valid values"
        ) from None


def _dispatch(command: str) -> Callable[[list[str]], int]:
    if command == "parity":
        from schedspec_cli.engine_cmds import parity

        return parity
    if command == "release-check":
        from schedspec_cli.release import release_check_main

        return release_check_main
    if command == "simulate":
        return _simulate
    if command == "install-engines":
        return cmd_install_engines
    return cmd_bench


def cmd_verify(args: argparse.Namespace) -> int:
    """`schedspec verify`: with `--impl`, `verify.run`; without, the main job, once the flags,
    torch, Z3, matplotlib and the `--report` directory (default reports/verify) are checked.
    Returns 0 pass, 1 a failure; a refused flag or a missing dependency raises (exit 2)."""
    # a hang's message names the flag that sets the deadline here, not the Python way
    with call_timeout_named("--call-timeout"):
        return _verify(args)


def _verify(args: argparse.Namespace) -> int:
    if args.impl:
        return verify.run(args)
    from schedspec_cli.engine_cmds import require_torch
    from schedspec_cli.main_job import main_job
    from schedspec_cli.output import check_output_path
    from schedspec_cli.plots import require_matplotlib

    verify.check_scope(args)
    # the main job's steps need the engine and the solver, its report matplotlib: refuse
    # before the first step runs
    require_torch("verify")
    prove.require_z3("verify")
    require_matplotlib("verify", "matplotlib")
    report = "reports/verify" if args.report is None else args.report
    check_output_path("--report", report, directory=True)  # refuses '' (not the default)
    return main_job(
        report, args.examples, args.parity_prompts, args.parity_tokens, args.call_timeout
    )


def build_parser() -> Parser:
    """The `schedspec` parser: a subcommand per command with its handler as `func`. The
    pass-through commands (`PASS_THROUGH`, `bench`) are listed for `--help` only: `main`
    dispatches them before this parser runs, and they parse their own arguments."""
    p = Parser(
        prog="schedspec",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="exit status: 0 pass, 1 violation or mismatch, 2 usage or input error",
    )
    p.add_argument("--version", action="version", version=f"schedspec {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    v = sub.add_parser(
        "verify",
        help="with --impl: the conformance suite on those implementations (dLLM or AR); "
        "without: the main job (proofs, conformance on every built-in but the real engines, "
        "parity, report)",
        epilog=f"${PROFILE_ENV} is not read: it picks the Hypothesis profile of pytest runs "
        "(properties.profiles); a verify run is set by its flags alone (--examples, --seed, "
        "--call-timeout), so that the same command draws the same programs anywhere. The "
        "table's examples column counts every program run: the --examples drawn, a few of "
        "Hypothesis's own, and after a failure those run while shrinking it (so a failing run "
        "may count several times --examples); steps counts their rounds or steps",
    )
    verify.add_arguments(v)
    v.set_defaults(func=cmd_verify)

    li = sub.add_parser(
        "list-impls", help="built-in implementations: family, engine, target, profile"
    )
    list_impls.add_arguments(li)
    li.set_defaults(func=list_impls.run)

    ct = sub.add_parser("check-trace", help="check a JSON Lines event log (dLLM or AR)")
    check_trace.add_arguments(ct)
    ct.set_defaults(func=check_trace.run)

    pr = sub.add_parser("prove", help="run the Z3 proofs")
    prove.add_arguments(pr)
    pr.set_defaults(func=prove.run)

    sub.add_parser("bench", help="benchmarks: engine | conformance (each takes --help)")
    for name, text in PASS_THROUGH.items():
        said = text if text.endswith("takes --help)") else text + " (takes --help)"
        sub.add_parser(name, help=said)
    return p


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def escape_unprintable_output() -> None:
    """Text a log or an implementation hands us may hold what the terminal's encoding cannot
    write (a lone surrogate from `"\\ud800"` in JSON): printed as an escape, never a
    UnicodeEncodeError after the verdict was reached."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):  # closed, or not a text stream
                reconfigure(errors="backslashreplace")


def entry() -> None:
    """The `schedspec` console script: `main`, then exit with its status even where the
    implementation left threads of its own running (an engine's workers), which the
    interpreter would otherwise wait for after the verdict, for ever (after a traceback too:
    a bug of ours must not hang the command either)."""
    try:
        code = main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    except BaseException:  # a traceback is a bug; it is printed, and the command still ends
        traceback.print_exc()
        code = 1
    lingering = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if lingering:
        names = ", ".join(t.name for t in lingering[:3])
        print(
            f"schedspec: {len(lingering)} thread(s) the implementation started still run "
            f"({names}); exiting with status {code} without waiting for them",
            file=sys.stderr,
        )
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (0 pass, 1 violation, 2 usage/input error)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    escape_unprintable_output()
    # The commands that run Hypothesis (verify, bench conformance) draw the same programs for
    # the same command, from a checkout or an installed wheel and whatever an adapter's module
    # holds: Hypothesis mines constants only from modules outside site-packages.
    draw_no_mined_constants()
    try:
        if args_list and (args_list[0] in PASS_THROUGH or args_list[0] == "bench"):
            return _dispatch(args_list[0])(args_list[1:])
        args = build_parser().parse_args(args_list)
        code: int = args.func(args)
        return code
    except UsageError as err:
        print(_one_line(str(err)), file=sys.stderr)
        return 2
    except SpecViolation as err:  # a violation outside a suite run (e.g. a replayed workload)
        print(f"schedspec: violation: {err}", file=sys.stderr)
        return 1
    except (SchedSpecError, NotAnAdapter) as err:
        print(f"schedspec: error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return reader_gone()
    except OSError as err:  # a path the checks could not foresee (disk full, permissions)
        where = f" {err.filename}:" if err.filename else ""
        print(f"schedspec: error:{where} {_one_line(err.strerror or str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("schedspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    entry()


__all__ = ["EXIT_READER_GONE", "build_parser", "entry", "main"]
