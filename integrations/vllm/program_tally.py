"""What a check over generated programs saw, for the engine-core check scripts: per rule the
seeds that broke it and its first message, and per loop (sync, async) the summed path counts of
the programs that passed both."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.custom_scheduler import (
    SCHEDULER_VARIABLE,
    is_scheduler_cls_error,
    selected_scheduler_cls,
)
from integrations.vllm.manifest import DEFAULT_VERSION, VERSION_VARIABLE, VLLM_VERSION
from spec.errors import ConfigError

MODES = ("sync", "async")


def add_program_arguments(parser: argparse.ArgumentParser, default_programs: int) -> None:
    """The options every engine-core check script takes: `--programs` (seeds 0..N-1) and
    `--pipeline-parallel` (stages of the asynchronous loop)."""
    parser.add_argument(
        "--programs", type=int, default=default_programs, help="generated programs (seeds)"
    )
    add_pipeline_argument(parser)


def add_pipeline_argument(parser: argparse.ArgumentParser) -> None:
    """`--pipeline-parallel`: pipeline stages of the asynchronous loop (default 1)."""
    parser.add_argument(
        "--pipeline-parallel",
        type=int,
        default=1,
        metavar="P",
        help="pipeline stages of the asynchronous loop (default 1)",
    )


def parse_program_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse `argv`, refusing (exit 2, one line) a count or a stage number below 1."""
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("--programs: must be >= 1")
    if args.pipeline_parallel < 1:
        parser.error("--pipeline-parallel: must be >= 1")
    return args


def release_selector() -> str:
    """What a printed command starts with to run on the loaded vLLM release and scheduler
    class: empty for the default release and vLLM's own class, else the variables that select
    them ("SCHEDSPEC_VLLM_VERSION=0.34.0 ", "SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.Mine "), so
    the command pasted in a fresh shell checks what the run checked."""
    words = [] if VLLM_VERSION == DEFAULT_VERSION else [f"{VERSION_VARIABLE}={VLLM_VERSION}"]
    chosen = selected_scheduler_cls()
    if chosen is not None:
        words.append(f"{SCHEDULER_VARIABLE}={shlex.quote(chosen)}")
    return "".join(f"{word} " for word in words)


def engine_words() -> str | None:
    """The vLLM a script checks, when a scheduler class of the user's runs in it
    (`SCHEDSPEC_VLLM_SCHEDULER_CLS`), as `schedspec verify` names it ("vllm 0.33.0,
    scheduler_cls my_sched.Mine"); None when vLLM's own class runs."""
    chosen = selected_scheduler_cls()
    return None if chosen is None else f"vllm {VLLM_VERSION}, scheduler_cls {chosen}"


def refuse_scheduler_cls(prog: str, err: Exception) -> int:
    """A script's exit on the user's scheduler class (`is_scheduler_cls_error`): one line on
    stderr, `prog: error: ...`, and 2."""
    print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
    return 2


def shrink_commands(
    script: str, failures: Mapping[str, list[int]], argv: Sequence[str] | None
) -> list[str]:
    """For each rule broken (a tally's failure label: "rule, mode loop", or the rule alone
    when the loops ran as one), the `script` command that shrinks its first failing program
    under the check's own options (`argv`, or the process's, less `--programs` and `--json`),
    in that loop if the label names one."""
    given = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for arg in given:
        if skip:
            skip = False
            continue
        if arg in ("--programs", "--json"):
            skip = True
            continue
        if not arg.startswith(("--programs=", "--json=")):
            kept.append(arg)
    options = " ".join(kept)
    release = release_selector()
    lines = []
    for label, seeds in sorted(failures.items()):
        rule, _, loop = label.partition(", ")
        where = f" --loop {loop.split()[0]}" if loop else ""
        lines.append(
            f"shrink [{label}]: {release}.venv/bin/python {script} --seed {seeds[0]}{where} "
            f"--rule {rule}" + (f" {options}" if options else "")
        )
    return lines


@dataclass
class ProgramTally:
    """Fed one program at a time (`check` or `check_each`); `keys` are the run counts summed per
    loop."""

    keys: tuple[str, ...]
    failures: dict[str, list[int]] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)
    totals: dict[str, Counter[str]] = field(
        default_factory=lambda: {mode: Counter() for mode in MODES}
    )
    programs: int = 0
    refused: list[int] = field(default_factory=list)  # seeds whose configuration vLLM refused
    refusal: str = ""  # the first refusal's message

    def check(self, seed: int, run_both: Callable[[], tuple[Any, Any]]) -> None:
        """Run program `seed` through both loops (`run_both`, which stops at the first
        violation) and record what it did; a failure is recorded under its rule."""
        self.programs += 1
        try:
            runs = run_both()
        except EngineCoreViolation as err:
            self._fail(err.rule, seed, err.detail)
            return
        for mode, run in zip(MODES, runs, strict=True):
            self.totals[mode].update({k: getattr(run, k) for k in self.keys})

    def check_each(self, seed: int, run: Callable[[bool], Any]) -> None:
        """Run program `seed` through each loop on its own (`run(async_scheduling)`), so that
        a failure of the synchronous loop does not hide the asynchronous loop's verdict. A
        failure is recorded under "rule, mode loop"; the counts are added only when both
        loops pass, as `check` adds them. A program whose configuration vLLM refuses to build
        (`ConfigError`, e.g. a budget no larger than a drafter's lookahead) is recorded as
        refused, neither passed nor failed; one about the user's scheduler class
        (`SCHEDSPEC_VLLM_SCHEDULER_CLS`) propagates, for the script to stop on."""
        self.programs += 1
        runs = []
        for mode in MODES:
            try:
                runs.append(run(mode == "async"))
            except EngineCoreViolation as err:
                self._fail(f"{err.rule}, {mode} loop", seed, err.detail)
            except ConfigError as err:
                if is_scheduler_cls_error(err):
                    raise  # the user's class, not vLLM's refusal: the script stops (exit 2)
                self.refused.append(seed)
                self.refusal = self.refusal or str(err)
                return
        if len(runs) == len(MODES):
            for mode, done in zip(MODES, runs, strict=True):
                self.totals[mode].update({k: getattr(done, k) for k in self.keys})

    def _fail(self, label: str, seed: int, detail: str) -> None:
        self.failures.setdefault(label, []).append(seed)
        self.first.setdefault(label, detail)

    @property
    def passed(self) -> int:
        """Programs checked that broke no rule in either loop (refused ones not counted)."""
        failed: set[int] = set(self.refused)
        for seeds in self.failures.values():
            failed.update(seeds)
        return self.programs - len(failed)

    def report(self, meaning: Mapping[str, str], width: int) -> list[str]:
        """The table of path counts (one line per key, `meaning` its label) and one line per
        rule broken, with its first seeds and message."""
        lines = [f"{'':{width}} {'sync':>8} {'async':>8}"]
        for key in self.keys:
            sync, asynchronous = self.totals["sync"][key], self.totals["async"][key]
            lines.append(f"{meaning[key]:{width}} {sync:8d} {asynchronous:8d}")
        for rule, seeds in sorted(self.failures.items()):
            lines.append(
                f"FAIL [{rule}] {len(seeds)} programs, first seeds {seeds[:5]}: {self.first[rule]}"
            )
        if self.refused:
            lines.append(
                f"refused by vLLM: {len(self.refused)} programs, first seeds "
                f"{self.refused[:5]}: {self.refusal}"
            )
        return lines

    def json_fields(self) -> dict[str, object]:
        """`failures` (per rule: seeds and first message), `counts` (per loop) and `refused`
        (the seeds whose configuration vLLM refused)."""
        return {
            "failures": {r: {"seeds": s, "first": self.first[r]} for r, s in self.failures.items()},
            "counts": {mode: dict(c) for mode, c in self.totals.items()},
            "refused": list(self.refused),
        }


__all__ = [
    "MODES",
    "ProgramTally",
    "add_pipeline_argument",
    "add_program_arguments",
    "engine_words",
    "parse_program_arguments",
    "refuse_scheduler_cls",
    "release_selector",
    "shrink_commands",
]
