"""Fuzz the command line: random argv for the commands, each run as a user would run it.

    .venv/bin/python scripts/fuzz_cli.py [--runs 300] [--seed 0] [--timeout 25] \
        [--commands "simulate sweep,check-trace"] [--schedspec PATH] [--json out/fuzz-cli.json]

Why: every command promises exit 0 (pass), 1 (a violation or mismatch) or 2 with one line (a
usage or input error), and never a traceback, on anything a user can type. The tests check the
inputs someone thought of; this draws the rest. A run is bad when it exits outside {0, 1, 2} or
prints "Traceback" on stderr; each bad argv is printed so it can be replayed as it is.

Each run takes one command (`COMMANDS`, or `--commands`), reads its options from its own
`--help` (so new flags are fuzzed as soon as they exist), and gives it one to three of them
(none to three to a command with a positional argument), spelled `--flag value` or
`--flag=value`: half the time a plausible value for that flag (one of its choices, or a value of
the kind its name suggests), else an edge value (0, -1, nan, an empty string, a huge number, a
directory, a missing or an empty file, `module:attribute`, ...). A positional argument gets,
half the time, a real input (a recorded dLLM or AR event log, a parity report:
`recorded_inputs`), a third of those times damaged by one to three edits (`damage`: a field
retyped or deleted, a line dropped or two swapped, the file cut short), else an edge value. A
third of the runs are plausible ones instead: two to four options, plausible values only,
undamaged real inputs, so that options meet each other in the command's checks rather than the
first edge value ending the run at its usage error. `verify` always gets an `--impl` (the main
job takes a minute) and `verify` and `bench conformance` at most 3 examples unless the draw sets
them. Every run happens in one scratch directory, in a subprocess limited to `--timeout`
seconds; a run past it is counted, not failed (a long simulation is not a bug).

Prints a table per command (runs, plausible runs, exit statuses, timeouts, bad runs) and writes
JSON with every bad argv. Exit status: 0 when no run was bad, 1 otherwise, 2 on a usage error.
Not a test: a run of a few hundred argvs takes minutes (docs/release.md records one).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from schedspec_cli.output import output_file, write_json

COMMANDS = (
    "verify",
    "check-trace",
    "prove",
    "bench engine",
    "bench conformance",
    "parity",
    "release-check",
    "simulate dllm",
    "simulate sbs",
    "simulate replicas",
    "simulate sweep",
    "list-impls",
)
EDGE = (
    "0", "-1", "1", "2", "1e9", "nan", "inf", "", " ", "abc", "1,2", "0.5", "-0.5", "1-2", "2-1",
    "99999999999999999999", "x:y", "-", "a,,b", "{DIR}", "{FILE}", "{EMPTY}", "{JSON}",
    "/nonexistent/x/y",
)  # fmt: skip
# (pattern on the flag's name, plausible values): the first pattern that matches is used
PLAUSIBLE = (
    (r"examples|requests|seats|prompts|repeats|replicas|max-batch|bound|units|instances|"
     r"num-cpus|threads|max-running|batch$|gen-blocks", ("1", "2", "3", "4", "16")),
    (r"qps|burst|forward$|overhead|cost|batch-time|turn-ms|timeout", ("0.5", "1", "2", "0")),
    (r"^--(prefill|decode)$", ("4", "2-8", "1", "200")),
    (r"tokens|model-len|budget", ("8", "16", "32", "128", "4096")),
    (r"impl|profile|twin", ("reference-dllm", "vllm-v1", "engine", "sglang-dllm-order",
                            "reference-dllm-joint", "vidur-vllm", "reference.seeded_bugs:nothing")),
    (r"algorithm", ("LowConfidence", "JointThreshold", "all")),
    (r"device", ("cpu", "cuda", "cuda:1")),
    (r"json|trace|csv|report|calibration|accept|config|arrivals", ("out.json", "o/x.json",
                                                                    "{JSON}", "{FILE}")),
    (r"plots", ("plotsdir", "{FILE}")),
    (r"scheduler", ("simple", "vidur-vllm", "vllm-v1", "simple,vidur-sarathi")),
    (r"family", ("dllm", "ar")),
    (r"mode", ("sync", "fdfo", "sync,fdfo")),
    (r"parity", ("always", "bs1", "never")),
    (r"block-size|page-size", ("2", "4", "8", "16")),
    (r"seed", ("0", "7")),
)  # fmt: skip
GROUP = re.compile(r"\[([^\[\]]+)\]")  # one bracketed item of a usage line


@dataclass(frozen=True, slots=True)
class Option:
    flag: str
    takes_value: bool
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    """A command's options and positional arguments, read from its `--help`."""

    options: tuple[Option, ...]
    positionals: int


def read_usage(help_text: str) -> Usage:
    """The options of the usage line (`[--flag]`, `[--flag METAVAR]`, `[--flag {a,b}]`) and how
    many positional arguments the "positional arguments:" section lists (subcommand lists
    aside: a command named here is already a leaf)."""
    usage = help_text.split("\n\n", 1)[0]
    options = []
    flat = re.sub(r" \[[^\[\]]*\.\.\.\]", "", " ".join(usage.split()))  # nargs: [X ...]
    for group in GROUP.findall(flat):
        for part in group.split(" | "):  # a mutually exclusive group: [--a | --b X]
            flag, _, metavar = part.strip().partition(" ")
            if not flag.startswith("--") or flag == "--help":
                continue
            choices = tuple(metavar[1:-1].split(",")) if metavar.startswith("{") else ()
            options.append(Option(flag, bool(metavar), choices))
    positionals = 0
    section = help_text.split("positional arguments:", 1)
    if len(section) == 2:
        for line in section[1].split("\n\n", 1)[0].splitlines():
            if re.match(r"^  [a-z]", line):
                positionals += 1
    return Usage(tuple(options), positionals)


def recorded_inputs(workdir: Path) -> list[str]:
    """Real inputs for positional arguments, written into `workdir`: a dLLM event log (the
    reference scheduler, FDFO, two requests), an AR one (the vLLM v1 re-implementation) and a
    parity report (`parity --impl reference-dllm`, two prompts): so `check-trace` and
    `release-check` get past their readers, where the options then matter."""
    import io

    from properties.ar.harness import ArHarness
    from properties.harness import Harness
    from reference.ar.vllm_v1 import make_vllm_v1
    from reference.dllm import make_scheduler
    from spec import DllmConfig, Mode, RequestSpec
    from spec.ar.config import ArConfig, ArRequest
    from spec.ar.trace import write_ar_trace
    from spec.trace import config_to_dict, write_events

    cfg = DllmConfig(block_size=2, page_size=4, kv_pages=4, max_context=8, mode=Mode.FDFO)
    dllm = Harness(make_scheduler, cfg)
    dllm.submit(RequestSpec("a", (1, 2, 3), 3))
    dllm.submit(RequestSpec("b", (4,), 2))
    dllm.drain()
    buf = io.StringIO()
    write_events(dllm.events, buf)
    (workdir / "dllm.jsonl").write_text(
        json.dumps(config_to_dict(cfg)) + "\n" + buf.getvalue(), encoding="utf-8"
    )
    ar_cfg = ArConfig(
        block_size=2, num_blocks=7, max_num_batched_tokens=6, max_num_seqs=3, max_model_len=10
    )
    ar = ArHarness(make_vllm_v1, ar_cfg)
    ar.submit(ArRequest("r0", 3, 2, prompt=(1, 2, 3)))
    ar.drain()
    with (workdir / "ar.jsonl").open("w", encoding="utf-8") as out:
        write_ar_trace(ar.events, out, ar_cfg)
    report = workdir / "parity.json"
    argv = ["parity", "--impl", "reference-dllm", "--prompts", "2", "--max-new-tokens", "8"]
    subprocess.run(
        [str(Path(sys.executable).parent / "schedspec"), *argv, "--json", str(report)],
        capture_output=True,
        check=False,
    )
    return [str(workdir / n) for n in ("dllm.jsonl", "ar.jsonl", "parity.json")]


ODD_VALUES: tuple[object, ...] = (
    None,
    True,
    -1,
    0,
    2**70,
    1.5,
    float("inf"),
    "",
    "x",
    [],
    [1, "a"],
    {},
    {"a": 1},
)


def damage(text: str, rng: random.Random) -> str:
    """`text` (JSON lines, or one JSON document) after one to three edits, each one of: a
    field of a JSON object set to a value of another kind (`ODD_VALUES`) or deleted, a line
    dropped, two lines swapped, or the text cut at a random character. What a log cut by a
    crash, edited by hand or written by a buggy logger looks like to a reader."""
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        if not lines:
            break
        edit = rng.choice(("retype", "delete", "drop", "swap", "cut"))
        i = rng.randrange(len(lines))
        if edit in ("retype", "delete"):
            try:
                record = json.loads(lines[i])
            except ValueError:
                continue
            if not isinstance(record, dict) or not record:
                continue
            key = rng.choice(sorted(record))
            if edit == "retype":
                record[key] = rng.choice(ODD_VALUES)
            else:
                del record[key]
            lines[i] = json.dumps(record)
        elif edit == "drop":
            del lines[i]
        elif edit == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            cut = "\n".join(lines)
            lines = cut[: rng.randrange(len(cut) + 1)].splitlines()
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class Tally:
    runs: int = 0
    plausible: int = 0  # runs drawn with real inputs and plausible values only
    exits: Counter[int] = field(default_factory=Counter)
    timeouts: int = 0
    bad: list[dict[str, object]] = field(default_factory=list)


class Fuzzer:
    def __init__(self, schedspec: str, workdir: Path, seed: int, timeout: float) -> None:
        self.schedspec = schedspec
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.usages: dict[str, Usage] = {}
        files = {"{FILE}": "a-file.txt", "{EMPTY}": "empty.json", "{JSON}": "object.json"}
        for name, text in zip(files.values(), ("hello\n", "", '{"a": 1}\n'), strict=True):
            (workdir / name).write_text(text, encoding="utf-8")
        self.places = {**{k: str(workdir / v) for k, v in files.items()}, "{DIR}": str(workdir)}
        self.inputs = recorded_inputs(workdir)  # what a positional argument gets half the time
        self.damaged = 0  # damaged copies of them written so far

    def usage(self, command: str) -> Usage:
        if command not in self.usages:
            res = self._run([*command.split(), "--help"])
            if res is None or res.returncode != 0:
                raise SystemExit(f"fuzz_cli: error: `{command} --help` did not print its usage")
            self.usages[command] = read_usage(res.stdout)
        return self.usages[command]

    def value(self, option: Option) -> str:
        if self.rng.random() < 0.5:
            plausible = self._plausible(option)
            if plausible is not None:
                return plausible
        return self._edge()

    def _plausible(self, option: Option) -> str | None:
        """A plausible value for `option`: one of its choices, or of the values its name
        suggests (`PLAUSIBLE`); None when its name suggests none."""
        if option.choices:
            return self.rng.choice(option.choices)
        for pattern, values in PLAUSIBLE:
            if re.search(pattern, option.flag):
                return self._place(self.rng.choice(values))
        return None

    def _positional(self, *, plausible: bool = False) -> str:
        if not plausible and self.rng.random() < 0.5:
            return self._edge()
        real = Path(self.rng.choice(self.inputs))
        if not plausible and self.rng.random() < 1 / 3:
            self.damaged += 1
            copy = self.workdir / f"damaged-{self.damaged}{real.suffix}"
            copy.write_text(damage(real.read_text(encoding="utf-8"), self.rng), encoding="utf-8")
            return str(copy)
        return str(real)

    def _edge(self) -> str:
        return self._place(self.rng.choice(EDGE))

    def _place(self, value: str) -> str:
        return self.places.get(value, value)

    def argv(self, command: str, *, plausible: bool = False) -> list[str]:
        """One argv for `command`. A `plausible` one has only real inputs and plausible values
        and two to four options (an option with no plausible value is left out), so the options
        meet each other in the command's checks instead of the first edge value ending the
        run at its usage error."""
        usage = self.usage(command)
        argv = command.split()
        for _ in range(usage.positionals):
            argv.append(self._positional(plausible=plausible))
        fewest, most = (2, 4) if plausible else (0 if usage.positionals else 1, 3)
        for option in self.rng.sample(
            usage.options, min(len(usage.options), self.rng.randint(fewest, most))
        ):
            value = self._plausible(option) if plausible else self.value(option)
            if not option.takes_value:
                argv.append(option.flag)
            elif value is None:
                continue
            elif self.rng.random() < 0.3:
                argv.append(f"{option.flag}={value}")
            else:
                argv += [option.flag, value]
        named = {a.split("=")[0] for a in argv}
        if command == "verify" and "--impl" not in named:
            argv += ["--impl", "reference-dllm"]
        if command in ("verify", "bench conformance") and "--examples" not in named:
            argv += ["--examples", "3"]
        return argv

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                [self.schedspec, *argv],
                cwd=self.workdir,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None

    def fuzz(self, commands: list[str], runs: int) -> dict[str, Tally]:
        tallies = {c: Tally() for c in commands}
        for _ in range(runs):
            command = self.rng.choice(commands)
            plausible = self.rng.random() < 1 / 3
            argv = self.argv(command, plausible=plausible)
            tally = tallies[command]
            tally.runs += 1
            tally.plausible += plausible
            res = self._run(argv)
            if res is None:
                tally.timeouts += 1
                continue
            tally.exits[res.returncode] += 1
            if res.returncode not in (0, 1, 2) or "Traceback" in res.stderr:
                last = res.stderr.strip().splitlines()[-1:] or [""]
                tally.bad.append({"argv": argv, "exit": res.returncode, "last_line": last[0]})
                print(f"BAD exit {res.returncode}: schedspec {' '.join(argv)}", flush=True)
                print(f"    {last[0][:300]}", flush=True)
        return tallies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=300, help="argvs to run (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=25.0, help="seconds per run (default 25)")
    p.add_argument("--commands", help=f"comma-separated, of: {', '.join(COMMANDS)} (default all)")
    p.add_argument("--schedspec", help="the command to fuzz (default: this venv's schedspec)")
    p.add_argument("--json", type=output_file, help="write the tallies and every bad argv here")
    args = p.parse_args(argv)
    commands = list(COMMANDS) if args.commands is None else args.commands.split(",")
    if args.runs < 1 or args.timeout <= 0 or not all(c.strip() for c in commands):
        p.error("--runs must be >= 1, --timeout > 0 and --commands a list of commands")
    # runs happen in a scratch directory: a path is made absolute, a bare name found on PATH
    schedspec = args.schedspec or str(Path(sys.executable).parent / "schedspec")
    found = shutil.which(str(Path(schedspec).absolute()) if "/" in schedspec else schedspec)
    if found is None:
        p.error(f"--schedspec {schedspec!r}: no such executable")
    schedspec = found
    with tempfile.TemporaryDirectory(prefix="fuzz-cli-") as tmp:
        tallies = Fuzzer(schedspec, Path(tmp), args.seed, args.timeout).fuzz(commands, args.runs)
    print(f"{'command':<20} {'runs':>5} {'plausible':>9} {'exit 0':>7} {'exit 1':>7} "
          f"{'exit 2':>7} {'timeouts':>9} {'bad':>4}")  # fmt: skip
    for command, t in tallies.items():
        print(f"{command:<20} {t.runs:>5} {t.plausible:>9} {t.exits[0]:>7} {t.exits[1]:>7} "
              f"{t.exits[2]:>7} {t.timeouts:>9} {len(t.bad):>4}")  # fmt: skip
    bad = [b for t in tallies.values() for b in t.bad]
    if args.json:
        payload = {
            "runs": args.runs,
            "seed": args.seed,
            "timeout_s": args.timeout,
            "commands": {
                c: {"runs": t.runs, "plausible": t.plausible, "exits": dict(t.exits),
                    "timeouts": t.timeouts, "bad": t.bad}
                for c, t in tallies.items()
            },
        }  # fmt: skip
        write_json(args.json, payload)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
