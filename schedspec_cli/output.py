"""The one JSON writer, the one table renderer, and output-path checks made before any work.

A long run must not lose its results to a bad `--json` path found at the end, so every command
calls `check_output_path` for each output flag while validating its arguments.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from spec.errors import ConfigError


def check_output_path(
    flag: str,
    path: str | None,
    *,
    directory: bool = False,
    inputs: Sequence[tuple[str, str | None]] = (),
) -> None:
    """Raise `ConfigError(flag, ...)` unless `path` can be written (a file, or with `directory`
    a directory), creating nothing, and is none of `inputs` ((flag, path) of what the command
    reads: writing there would destroy the input). None passes (the output was not asked
    for)."""
    if path is None:
        return
    if not path.strip() or "\x00" in path:
        raise ConfigError(flag, path, "a directory path" if directory else "a file path")
    p = Path(path)
    for read_by, read in inputs:
        if read is not None and read != "-" and _same_file(p, Path(read)):
            raise ConfigError(
                flag, path, f"another path than {read_by}'s, which it would overwrite"
            )
    if directory:
        if p.exists() and not p.is_dir():
            raise ConfigError(flag, path, "a directory (this is an existing file)")
    elif p.is_dir():
        raise ConfigError(flag, path, "a file path (this is a directory)")
    # the nearest existing ancestor must be a writable directory
    parent = p if directory else p.parent
    parent = parent if str(parent) else Path(".")
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(flag, path, f"a path under a directory ({parent} is a file)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(flag, path, f"a path where files can be written ({parent} is not)")


def _same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` name one file (a link or another spelling included)."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def output_file(text: str) -> Path:
    """An argparse type for a script's output flag: a file path `check_output_path` accepts,
    checked when the arguments are parsed (before a long run, not when its results are
    written); the writer creates missing parent directories."""
    return _checked_path(text, directory=False)


def output_dir(text: str) -> Path:
    """An argparse type for a script's output directory, checked as `output_file` checks a
    file (an existing file, or a path under one, is refused); the run creates it."""
    return _checked_path(text, directory=True)


def _checked_path(text: str, *, directory: bool) -> Path:
    try:
        check_output_path("path", text, directory=directory)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {err.valid}") from None
    return Path(text)


def write_json(path: str | Path | None, payload: object) -> None:
    """Write `payload` as indented JSON (parents created); nothing when `path` is None."""
    if path is None or path == "":
        return
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    except OSError as err:  # a full disk says no path of its own: name the one written
        if err.filename is None:
            err.filename = str(out)
        raise


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with a dashed rule under the headers."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


__all__ = ["check_output_path", "output_dir", "output_file", "table", "write_json"]
