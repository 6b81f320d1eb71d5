"""The `schedspec` command line: the composition root of the project.

This is the only package that imports `spec`, `reference`, `properties` and (lazily) `gpu` and
`integrations` together; the others stay independent libraries (a static test enforces it).
Entry point: `schedspec_cli.main:entry` (`main`, then the exit).
"""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    try:
        return metadata.version("schedspec")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"
