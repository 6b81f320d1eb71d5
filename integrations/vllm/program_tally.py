"""What a check over generated programs saw, for the engine-core check scripts: per rule the
seeds that broke it and its first message, and per loop (sync, async) the summed path counts of
the programs that passed both."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation

MODES = ("sync", "async")


def add_program_arguments(parser: argparse.ArgumentParser, default_programs: int) -> None:
    """The options every engine-core check script takes: `--programs` (seeds 0..N-1) and
    `--pipeline-parallel` (stages of the asynchronous loop)."""
    parser.add_argument(
        "--programs", type=int, default=default_programs, help="generated programs (seeds)"
    )
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


@dataclass
class ProgramTally:
    """Fed one program at a time (`check`); `keys` are the run counts summed per loop."""

    keys: tuple[str, ...]
    failures: dict[str, list[int]] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)
    totals: dict[str, Counter[str]] = field(
        default_factory=lambda: {mode: Counter() for mode in MODES}
    )
    programs: int = 0

    def check(self, seed: int, run_both: Callable[[], tuple[Any, Any]]) -> None:
        """Run program `seed` through both loops (`run_both`) and record what it did."""
        self.programs += 1
        try:
            runs = run_both()
        except EngineCoreViolation as err:
            self.failures.setdefault(err.rule, []).append(seed)
            self.first.setdefault(err.rule, err.detail)
            return
        for mode, run in zip(MODES, runs, strict=True):
            self.totals[mode].update({k: getattr(run, k) for k in self.keys})

    @property
    def passed(self) -> int:
        """Programs checked that broke no rule."""
        return self.programs - sum(len(seeds) for seeds in self.failures.values())

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
        return lines

    def json_fields(self) -> dict[str, object]:
        """`failures` (per rule: seeds and first message) and `counts` (per loop)."""
        return {
            "failures": {r: {"seeds": s, "first": self.first[r]} for r, s in self.failures.items()},
            "counts": {mode: dict(c) for mode, c in self.totals.items()},
        }


__all__ = ["MODES", "ProgramTally", "add_program_arguments", "parse_program_arguments"]
