"""The one progress printer: a single, rewritten line on stderr, only when it is a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable


class Progress:
    """`update(text)` rewrites the line; `done()` ends it. Silent when stderr is not a tty (or
    there is none: descriptor 2 closed at start)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.active: bool = sys.stderr is not None and sys.stderr.isatty()
        self._shown = False

    def update(self, text: str) -> None:
        """Rewrite the line as `label: text` (text padded to 60); nothing when inactive."""
        if self.active:
            sys.stderr.write(f"\r{self.label}: {text:<60}")
            sys.stderr.flush()
            self._shown = True

    def done(self) -> None:
        """End a shown line with a newline (nothing when none is shown)."""
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._shown = False

    def examples(self, total: int) -> Callable[[int, int], None]:
        """A callback `(examples, steps)` for the conformance machines' step counter."""

        def show(examples: int, steps: int) -> None:
            self.update(f"{min(examples, total)}/{total} examples, {steps} steps")

        return show

    def message(self) -> Callable[[str], None]:
        """A callback taking free text (the proof suite's progress)."""
        return self.update


def log(msg: str) -> None:
    """A progress message that stays (long commands: what they are doing now); nothing without
    a stderr (`print` would send it to stdout, the table's)."""
    if sys.stderr is not None:
        print(f"[schedspec] {msg}", file=sys.stderr, flush=True)


__all__ = ["Progress", "log"]
