"""The release's device checks in one run, most important first, within a time budget.

    python3 scripts/device_run.py --out DIR [--budget-s 540] [--device cuda] [--only NAME ...]
        [--dry-run]

A session lent a GPU machine has a few minutes of it, start-up included, so the checks that
docs/release.md lists run here as one prepared command: the release gate's parity on every
shipped prompt and its `release-check`, the device unit tests, the gate's parity with the
engine's prefix cache on, the benchmark with SGLang's rows-released baseline on both
workloads, the forward-time bound, the conformance suite with the engine serving on the
device, and the soak. Each step is the command release.md names,
`schedspec` run as `python -m schedspec_cli.main` with the checkout on `PYTHONPATH` (a device
machine may have no package registry to build the `.venv` from, as in the recorded H200 runs).

A step writes its output to DIR/<step>.log and its JSON to DIR. Before it starts, its expected
time (its wall time on an H200, docs/release.md) must fit the budget left, else it is skipped;
a step that runs past three times its expected time (at least a minute more) is stopped and
counts as failed (exit 124). DIR/summary.json and the printed table give each step's exit
code, wall seconds and command.

Exit 0 when every step ran and passed, 1 when one failed or was skipped, 2 on a bad flag or a
device that is not available (one line).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The checkout itself, not an installed copy: a lent machine may have no `.venv` (see above).
sys.path.insert(0, str(ROOT))
from schedspec_cli.loader import MissingDependency, module_available  # noqa: E402
from schedspec_cli.output import output_dir  # noqa: E402
from spec.errors import ConfigError  # noqa: E402

SCHEDSPEC = (sys.executable, "-m", "schedspec_cli.main")
# every step's expected time, under a lent machine's 600 s per command
DEFAULT_BUDGET_S = 540.0


@dataclass(frozen=True, slots=True)
class Step:
    """One check: its name (the log's and the JSON's stem), its command with `{out}` for the
    output directory and `{device}` for the device, and its expected wall seconds."""

    name: str
    command: tuple[str, ...]
    expected_s: float

    def argv(self, out: Path, device: str) -> list[str]:
        """The command with the output directory and the device filled in."""
        return [part.format(out=out, device=device) for part in self.command]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a step did: its exit code (None when skipped; 124 when stopped) and wall time."""

    name: str
    command: str
    returncode: int | None
    wall_s: float
    skipped: bool

    @property
    def passed(self) -> bool:
        """Ran and exited 0."""
        return not self.skipped and self.returncode == 0


def _schedspec(*args: str) -> tuple[str, ...]:
    return (*SCHEDSPEC, *args)


def _bench(name: str, flags: tuple[str, ...], expected_s: float) -> Step:
    """`bench engine` on the device at 4 and 16 seats with `flags`, its JSON named after the
    step."""
    return Step(
        name,
        _schedspec(
            "bench", "engine", "--device", "{device}", "--max-running", "4", "16", *flags,
            "--json", f"{{out}}/engine-{name}.json",
        ),
        expected_s,
    )  # fmt: skip


# Most important first: a budget that runs out drops the tail. Expected seconds: the H200 runs
# of docs/release.md (the rows-released benches: the plain bench's time plus a fifth mode).
STEPS: tuple[Step, ...] = (
    Step(
        "parity",
        _schedspec(
            "parity", "--device", "{device}", "--algorithm", "all", "--max-new-tokens", "128",
            "--batch", "16", "--json", "{out}/parity.json",
        ),
        70,
    ),
    Step("release-check", _schedspec("release-check", "{out}/parity.json"), 5),
    Step(
        "device-tests",
        (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_engine_units.py", "tests/test_device_timer.py", "-k", "device"),
        10,
    ),
    Step(
        "parity-cached",
        _schedspec(
            "parity", "--device", "{device}", "--algorithm", "all", "--prompts", "4",
            "--max-new-tokens", "128", "--block-size", "8", "--page-size", "8",
            "--prefix-cache", "--json", "{out}/parity-cached.json",
        ),
        30,
    ),
    _bench("bench-rows", ("--repeats", "3", "--rows-released"), 60),
    _bench("bench-rows-128", ("--max-new-tokens", "128", "--repeats", "3", "--rows-released"), 95),
    Step(
        "forward-bound",
        _schedspec(
            "bench", "engine", "--device", "{device}", "--forward-bound", "--max-running", "4",
            "16", "--repeats", "5", "--json", "{out}/engine-forward-bound.json",
        ),
        50,
    ),
    Step(
        "verify-engine",
        _schedspec(
            "verify", "--impl", "engine", "--twin", "reference-dllm", "--examples", "3000",
            "--keep-going", "--json", "{out}/verify-engine.json",
        ),
        150,
    ),
    Step(
        "soak",
        (sys.executable, "scripts/soak_engine.py", "--device", "{device}", "--requests", "30000",
         "--every", "5000", "--json", "{out}/soak.json"),
        60,
    ),
)  # fmt: skip


def step_timeout(step: Step) -> float:
    """How long a step may run before it is stopped: three times its expected time, and at
    least a minute more than it."""
    return max(3 * step.expected_s, step.expected_s + 60)


def run_steps(
    steps: Sequence[Step],
    out: Path,
    device: str,
    budget_s: float,
    timeout: Callable[[Step], float] = step_timeout,
) -> list[StepResult]:
    """Run `steps` in order from the checkout's root, each step's output to out/<name>.log;
    skip a step whose expected time exceeds what is left of `budget_s`, stop one that runs
    past `timeout(step)` seconds (exit code 124)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    results: list[StepResult] = []
    start = time.monotonic()
    for step in steps:
        argv = step.argv(out, device)
        shown = " ".join(argv)
        left = budget_s - (time.monotonic() - start)
        if step.expected_s > left:
            results.append(StepResult(step.name, shown, None, 0.0, True))
            continue
        t0 = time.monotonic()
        with (out / f"{step.name}.log").open("w", encoding="utf-8") as log:
            try:
                code = subprocess.run(
                    argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    timeout=timeout(step), check=False,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = 124
                log.write(f"\n[device_run] stopped after {timeout(step):.0f} s\n")
        results.append(StepResult(step.name, shown, code, time.monotonic() - t0, False))
    return results


def _usable_device(device: str) -> str:
    """The device as the steps are given it, checked by the engine's own `resolve_device`
    (raises its `DeviceUnavailable`); imported here, so a dry run needs no torch. A Python
    without torch (a system `python3`) is a `MissingDependency`: the steps need the engine."""
    if not module_available("torch"):
        raise MissingDependency(
            f"the device checks ({sys.executable})",
            "torch",
            "run them with the project's environment, .venv/bin/python scripts/device_run.py, "
            "or pip install torch==2.13.0 here",
        )
    from gpu.engine import resolve_device

    return str(resolve_device(device))


def _print(results: Sequence[StepResult]) -> None:
    print(f"{'step':<16}{'exit':>6}{'wall s':>9}  command")
    for r in results:
        code = "skip" if r.skipped else str(r.returncode)
        print(f"{r.name:<16}{code:>6}{r.wall_s:>9.1f}  {r.command}")


#: What `--device` may name (whether it is there is checked when the steps run).
DEVICE_NAME = re.compile(r"cpu|cuda(:[0-9]+)?")


def _dry_run(steps: list[Step], out: Path, device: str, budget_s: float) -> None:
    """Print each step, its expected seconds and its command; a step that would not fit what
    is left of `budget_s` were every step to take its expected time is marked, as `run_steps`
    would skip it; then the total."""
    left = budget_s
    for s in steps:
        fits = s.expected_s <= left
        left -= s.expected_s if fits else 0
        mark = "" if fits else "  (skipped at this --budget-s)"
        print(f"{s.name:<16}{s.expected_s:>6.0f} s  {' '.join(s.argv(out, device))}{mark}")
    total = sum(s.expected_s for s in steps)
    print(f"{'total':<16}{total:>6.0f} s  (--budget-s {budget_s:g})")


def main(argv: list[str] | None = None) -> int:
    names = [s.name for s in STEPS]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        type=output_dir,
        default=os.environ.get("OUT", "out/device-run"),
        help="directory for the logs, JSON and summary.json (default: $OUT, else out/device-run)",
    )
    ap.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="seconds for all steps"
    )
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu for a trial run")
    ap.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=", ".join(names))
    ap.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    args = ap.parse_args(argv)
    if not math.isfinite(args.budget_s) or args.budget_s <= 0:
        print(f"--budget-s: a positive number of seconds, got {args.budget_s}", file=sys.stderr)
        return 2
    if DEVICE_NAME.fullmatch(args.device) is None:
        print(f"--device: cuda, cuda:N or cpu, got {args.device!r}", file=sys.stderr)
        return 2
    steps = [s for s in STEPS if args.only is None or s.name in args.only]
    out: Path = args.out.resolve()
    if args.dry_run:
        _dry_run(steps, out, args.device, args.budget_s)
        return 0
    try:
        device = _usable_device(args.device)
    except MissingDependency as err:
        print(f"device_run: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"--device: {err}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)  # checked when the flags were parsed
    results = run_steps(steps, out, device, args.budget_s)
    _print(results)
    summary = {
        "device": device,
        "budget_s": args.budget_s,
        "steps": [asdict(r) for r in results],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
