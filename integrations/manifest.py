"""Pinned engine installs: what each engine needs on a CPU machine, and where it lives.

Each engine is installed with `pip install --no-deps --target DIR` (its wheel plus the minimal
pure-Python packages it imports), never with a CUDA torch: the project's own torch 2.13.0 CPU
build is used. Each engine gets its own directory, `<cache>/<engine>-<version>`, so engines with
conflicting pins never share one; `activate` puts exactly that directory on `sys.path`.

The cache root is `$SCHEDSPEC_ENGINE_CACHE`, else `~/.cache/schedspec/engines`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from spec.errors import ConfigError

INSTALL_COMMAND = "schedspec install-engines"


class EngineNotInstalled(ConfigError):
    """A real engine was asked for but is not installed; says the command that installs it."""

    def __init__(self, engine: str, directory: Path) -> None:
        super().__init__(
            "impl",
            engine,
            f"an installed engine: run `{INSTALL_COMMAND} {engine}` (installs into {directory})",
        )


@dataclass(frozen=True, slots=True)
class Package:
    """One pip requirement, installed with --no-deps unless `deps`."""

    name: str
    version: str = ""  # "" = the newest that pip resolves
    deps: bool = False

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}" if self.version else self.name


@dataclass(frozen=True, slots=True)
class EngineManifest:
    """What one engine needs. `import_check` is imported after install to confirm it works."""

    engine: str
    version: str
    packages: tuple[Package, ...]
    import_check: str
    env: tuple[tuple[str, str], ...] = ()

    @property
    def directory(self) -> Path:
        return cache_root() / f"{self.engine}-{self.version}"

    @property
    def stamp(self) -> Path:
        """Written last by the installer: its presence means the install completed."""
        return self.directory / ".schedspec-installed"

    def installed(self) -> bool:
        return self.stamp.is_file()

    def activate(self) -> None:
        """Make the engine importable in this process (idempotent).

        Raises `EngineNotInstalled` naming the install command when it is not installed.
        """
        if not self.installed():
            raise EngineNotInstalled(self.engine, self.directory)
        for key, value in self.env:
            os.environ.setdefault(key, value)
        path = str(self.directory)
        if path not in sys.path:
            sys.path.insert(0, path)


def cache_root() -> Path:
    """The project's engine cache: $SCHEDSPEC_ENGINE_CACHE or ~/.cache/schedspec/engines."""
    env = os.environ.get("SCHEDSPEC_ENGINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "schedspec" / "engines"


__all__ = [
    "INSTALL_COMMAND",
    "EngineManifest",
    "EngineNotInstalled",
    "Package",
    "cache_root",
]
