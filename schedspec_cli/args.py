"""Argument types and the parser every command uses: typed, bounded, one line on error.

`argparse` reports a bad value as `argument --flag: ...`; `Parser.error` turns that into one
line on stderr and exit status 2 (the usage message is for `--help`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from properties.deadline import DEFAULT_CALL_TIMEOUT_S
from spec.errors import ConfigError

# bounds that keep a command finite on a laptop; a larger value is an input error, not a hang
MAX_EXAMPLES = 1_000_000
MAX_COUNT = 1_000_000
MAX_CALL_TIMEOUT_S = 86_400  # a day: any longer is a typo
MAX_SEED = 2**64 - 1  # Hypothesis takes any integer; 64 bits is what a CI passes


# 128 + SIGPIPE: what a shell reports for a writer whose reader went away (`git log | head`)
EXIT_READER_GONE = 141


def reader_gone() -> int:
    """stdout's reader closed the pipe (`schedspec ... | head`): nobody is left to read a
    message, so exit quietly with the shell's SIGPIPE status. stdout is pointed at the null
    device first, or the interpreter's flush at exit fails once more and prints a warning."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # stdout without a file descriptor (captured in a test)
        pass
    return EXIT_READER_GONE


class UsageError(Exception):
    """A command-line usage error: the message is one line, the exit status 2."""


def add_call_timeout(p: argparse.ArgumentParser, what: str) -> None:
    """`--call-timeout SECONDS` on `p`: the deadline per call (`properties.deadline`), `what`
    saying which calls it bounds and what a hang then is."""
    p.add_argument(
        "--call-timeout",
        type=int_in(0, MAX_CALL_TIMEOUT_S),
        default=int(DEFAULT_CALL_TIMEOUT_S),
        metavar="SECONDS",
        help=f"{what} (default {int(DEFAULT_CALL_TIMEOUT_S)}; 0: no limit)",
    )


def run_script(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """A script's `main`: `run` on `parser`'s parse of `argv`; a usage error (`UsageError`, from
    a `Parser`) is one line on stderr and `SystemExit(2)`, as argparse's own; stdout's reader
    gone (`script | head`) is a quiet `EXIT_READER_GONE`, as for `schedspec`."""
    try:
        return run(parser.parse_args(argv))
    except UsageError as err:
        print(" ".join(str(err).split()), file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:
        return reader_gone()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2 (via `UsageError`)."""

    def error(self, message: str) -> NoReturn:
        """Raise `UsageError` with `prog: error: message` (the top level prints it, exits 2)."""
        raise UsageError(f"{self.prog}: error: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        """Write `message` to stderr (when given) and raise `SystemExit(status)`, as argparse
        does after `--help` or `--version`."""
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


def given_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations of the options that `argv` gives explicitly; a default is not given,
    an option given with its default value is. (argparse fills in a default only where the
    namespace lacks the attribute, so parsing into a namespace of Nones leaves the rest None.)"""
    dests = {a.dest for a in parser._actions if a.dest != argparse.SUPPRESS}
    parsed = parser.parse_args(list(argv), namespace=argparse.Namespace(**dict.fromkeys(dests)))
    return {d for d in dests if getattr(parsed, d) is not None}


def flag_of(dest: str) -> str:
    """The command-line flag of an argparse destination: `parity_prompts` -> `--parity-prompts`."""
    return "--" + dest.replace("_", "-")


def refuse_ignored(args: argparse.Namespace, dests: Sequence[str], why: str) -> None:
    """A flag the run would ignore is an input error: if `dests` (destinations the user gave)
    is not empty, name the first with its value, say `why`, and list every flag to drop."""
    if not dests:
        return
    value = getattr(args, dests[0])
    shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    drop = ", ".join(map(flag_of, dests))
    raise ConfigError(flag_of(dests[0]), shown, f"{why}; drop {drop}")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an integer (valid: {low}..{high})"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range (valid: {low}..{high})")
        return value

    parse.__name__ = "integer"
    return parse


def positive(high: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: an integer in [1, high]."""
    return int_in(1, high)


def non_empty_text(text: str) -> str:
    """An argparse type: `text` unchanged unless it is blank or holds a NUL character."""
    if not text.strip() or "\x00" in text:
        raise argparse.ArgumentTypeError("must be a non-empty string")
    return text


__all__ = [
    "MAX_CALL_TIMEOUT_S",
    "MAX_COUNT",
    "MAX_EXAMPLES",
    "Parser",
    "UsageError",
    "add_call_timeout",
    "flag_of",
    "given_dests",
    "int_in",
    "non_empty_text",
    "positive",
    "refuse_ignored",
    "run_script",
]
