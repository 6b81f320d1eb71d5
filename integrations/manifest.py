"""Pinned engine installs: what each engine needs on a CPU machine, and where it lives.

Each engine is installed with `pip install --no-deps --target DIR` (its wheel plus the minimal
pure-Python packages it imports), never with a CUDA torch: the project's own torch 2.13.0 CPU
build is used. Each engine gets its own directory, `<cache>/<engine>-<version>-<pins>`, where
`<pins>` is a digest of every requirement the manifest pins (and of the install's layout):
engines with conflicting pins never share one, and neither do two checkouts (two environments)
that pin one engine differently, so installing for one never undoes the other's install.

The packages go into that directory's `site-packages/` (`EngineManifest.site_packages`), which
`activate` puts on `sys.path`. The name says what the code is, third-party code, to the tools
that tell it from the user's own by its path. Hypothesis is one: it mines constants from the
source of every loaded module it takes for the user's (any path without `/site-packages/`
outside the interpreter's own directories) to use in generated inputs. An engine installed
elsewhere made the suite's generated programs depend on the engine's source (two Vidur
releases got different programs from one seed) and made the first run of a process parse
every loaded module of vLLM or SGLang (1,674 and 1,119 files; 9 s and 7.5 s on a 2-core
machine before Hypothesis's cache of them in `.hypothesis/constants` is filled).

The cache root is `$SCHEDSPEC_ENGINE_CACHE`, else `~/.cache/schedspec/engines`.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import importlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spec.errors import ConfigError

INSTALL_COMMAND = "schedspec install-engines"
STAMP = ".schedspec-installed"  # written last by the installer: an install is complete
# The packages' directory inside an install: named as third-party code is (module docstring).
LAYOUT = "site-packages"


class EngineNotInstalled(ConfigError):
    """A real engine was asked for but is not installed for the manifest's pins; says the
    command, and names the installs for other pins the cache holds (`others`)."""

    def __init__(
        self,
        engine: str,
        directory: Path,
        *,
        others: tuple[Path, ...] = (),
        wanted_by: str | None = None,
    ) -> None:
        self.engine = engine
        self.directory = directory
        self.others = others
        state = (
            f"installed only for other pins, in {', '.join(map(str, others))}"
            if others
            else "not installed"
        )
        # a release chosen by its variable is installed under the same variable
        variable = f"SCHEDSPEC_{engine.upper()}_VERSION"
        chosen = os.environ.get(variable, "").strip()
        command = f"{variable}={chosen} " if chosen else ""
        super().__init__(
            "impl",
            wanted_by or engine,
            f"an installed engine ({engine} is {state}): run `{command}{INSTALL_COMMAND} "
            f"{engine}` (installs into {directory})",
        )

    def wanted_by(self, impl: str) -> EngineNotInstalled:
        """The same error, naming the implementation `impl` that needs the engine."""
        return EngineNotInstalled(self.engine, self.directory, others=self.others, wanted_by=impl)


class EngineImportFailed(ConfigError):
    """An installed engine does not import in this Python environment: a package it needs is
    missing here. The cache is shared by every environment of the user, and the install's
    import check ran in the environment that installed it; this one may lack what that one had.
    Says what failed and the command that reinstalls and re-checks the engine here."""

    def __init__(self, engine: str, directory: Path, error: ImportError) -> None:
        self.error = error
        if error.name == "torch":  # never in the engine's directory: it runs on ours
            fix = (
                f"{engine} runs on this environment's torch: install it first, "
                "pip install torch==2.13.0 (the engine extra, schedspec[engine])"
            )
        else:
            fix = (
                f"run `{INSTALL_COMMAND} {engine} --force` with this environment's schedspec, "
                "which installs it again and checks the import with this interpreter"
            )
        super().__init__(
            "impl",
            engine,
            f"an engine that imports in this Python environment ({engine} is installed in "
            f"{directory}, but importing it here failed: {type(error).__name__}: {error}): " + fix,
        )


@dataclass(frozen=True, slots=True)
class Package:
    """One pip requirement, installed with --no-deps unless `deps`."""

    name: str
    version: str = ""  # "" = the newest that pip resolves
    deps: bool = False

    @property
    def requirement(self) -> str:
        """The pip requirement: `name==version`, or the bare name when no version is pinned."""
        return f"{self.name}=={self.version}" if self.version else self.name


@dataclass(frozen=True, slots=True)
class EngineManifest:
    """What one engine needs. `import_check` is imported after install to confirm it works;
    `runs_on_torch`: the engine imports the environment's torch (never installed with it)."""

    engine: str
    version: str
    packages: tuple[Package, ...]
    import_check: str
    env: tuple[tuple[str, str], ...] = ()
    # Imports torch, which its directory never holds: it runs on the environment's (the
    # project's engine extra), so without torch an install is there but cannot run.
    runs_on_torch: bool = False
    # (built-in name, why): implementations of the engine this release does not ship
    unavailable: tuple[tuple[str, str], ...] = ()
    # 'module:function' called by `load` after the import check, with the built-in about to
    # run (or None): a setting of the engine's adapters checked up front (the scheduler class
    # of `SCHEDSPEC_VLLM_SCHEDULER_CLS`, `SCHEDSPEC_VIDUR_SCHEDULER_CLS`); raises ConfigError
    load_check: str = ""
    # path prefixes, inside the engine's own distribution, of the sources its adapters drive:
    # `modified_sources` compares them with the hashes of the release's wheel (its RECORD)
    sources: tuple[str, ...] = ()

    @property
    def pins(self) -> str:
        """A digest of `requirements` and of `LAYOUT` (10 hex digits): what names this
        install's directory, so an install of an older layout is another directory."""
        key = "\n".join((*self.requirements, f"layout: {LAYOUT}"))
        return hashlib.sha256(key.encode()).hexdigest()[:10]

    @property
    def directory(self) -> Path:
        """The install's own directory: its `site_packages`, its stamp, and what an adapter
        keeps beside the packages (vLLM's weightless model directories and cache)."""
        return cache_root() / f"{self.engine}-{self.version}-{self.pins}"

    @property
    def site_packages(self) -> Path:
        """Where the packages are installed: what `activate` puts on `sys.path`."""
        return self.directory / LAYOUT

    @property
    def stamp(self) -> Path:
        """Written last by the installer: its presence means the install completed."""
        return self.directory / STAMP

    @property
    def requirements(self) -> tuple[str, ...]:
        """The pip requirement of every package, in install order (what the stamp records)."""
        return tuple(p.requirement for p in self.packages)

    def installed(self) -> bool:
        """A complete install of exactly these packages: the stamp exists and lists them.

        A stamp that cannot be read, or that lists other packages, is not this manifest's
        install (an interrupted install; a directory someone edited by hand).
        """
        return self.installed_requirements() == self.requirements

    def installed_requirements(self) -> tuple[str, ...] | None:
        """The requirements the stamp records; None without a readable stamp."""
        return stamped_requirements(self.directory)

    def other_installs(self) -> tuple[Path, ...]:
        """The cache's complete installs of this engine for other pins, sorted: another
        checkout's (which pins the engine differently), or one made before the pins changed
        (after a `git pull`), or one of the layout before pins named the directory."""
        try:
            entries = list(cache_root().iterdir())
        except OSError:
            return ()
        return tuple(
            sorted(
                d
                for d in entries
                if d.name.startswith(f"{self.engine}-")
                and d != self.directory
                and stamped_engine(d) == self.engine
            )
        )

    def require(self) -> None:
        """Raise `EngineNotInstalled` naming the install command when the engine is not
        installed for the manifest's pins (naming any install for other pins)."""
        if not self.installed():
            raise EngineNotInstalled(self.engine, self.directory, others=self.other_installs())

    def why_unavailable(self, name: str) -> str | None:
        """Why this release of the engine does not ship the built-in implementation `name`
        (`unavailable`); None when it does."""
        return dict(self.unavailable).get(name)

    def require_shipped(self, name: str) -> None:
        """Raise a `ConfigError` saying why when this release does not ship `name`."""
        why = self.why_unavailable(name)
        if why is not None:
            raise ConfigError("impl", name, why)

    def activate(self) -> None:
        """Make the engine importable in this process (idempotent); `require`s it first."""
        self.require()
        for key, value in self.env:
            os.environ.setdefault(key, value)
        path = str(self.site_packages)
        if path not in sys.path:
            sys.path.insert(0, path)

    @contextlib.contextmanager
    def importing(self) -> Iterator[None]:
        """Around an adapter's import of the activated engine: an `ImportError` (a module the
        engine needs that this environment lacks) becomes `EngineImportFailed`, a typed error
        naming the module and the fix, instead of an exception in the middle of a run."""
        try:
            yield
        except ImportError as err:
            raise EngineImportFailed(self.engine, self.directory, err) from err

    def load(self, builtin: str | None = None) -> None:
        """`activate`, then import the install's import check in this process: what a command
        does before it runs the engine, so a missing module is one typed error up front
        (`EngineNotInstalled` or `EngineImportFailed`), not a failure of the suite's run.
        Then `load_check`, given `builtin`, the built-in about to run (None: any)."""
        self.activate()
        with self.importing():
            importlib.import_module(self.import_check)
        if self.load_check:
            module, _, function = self.load_check.partition(":")
            getattr(importlib.import_module(module), function)(builtin)

    def shadowed(self) -> str | None:
        """Where another copy of the engine's package (named as the engine: `vllm`,
        `sglang`, `vidur`) is importable from this process's path apart from the install: a
        checkout on `PYTHONPATH`, a copy in the environment's own site-packages. The install
        comes first on `sys.path` once activated, so that copy is not the one checked; a report
        says so rather than let a user believe their copy passed. None when there is none."""
        install = self.site_packages.resolve()
        others = [p for p in sys.path if p and Path(p).resolve() != install]
        try:
            found = importlib.machinery.PathFinder.find_spec(self.engine, others)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        where = list(found.submodule_search_locations or []) or [found.origin or ""]
        return where[0] or None

    def modified_sources(self) -> tuple[str, ...]:
        """The files under `sources` that differ from the release's wheel, or that are gone:
        each file's sha256 against the one pip recorded from the wheel (the distribution's
        `RECORD`), sorted. An install patched by hand (to check a change to the engine) is
        still the release's install to `installed`; this says what was changed, so a report
        cannot pass a patched engine off as the release. Empty without `sources`, or without
        a readable RECORD that lists them (nothing to compare with)."""
        if not self.sources:
            return ()
        return _differing(self.site_packages, self.sources)


def _differing(site: Path, prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """`EngineManifest.modified_sources` over the distributions installed in `site` (each
    `*.dist-info/RECORD` that lists a file under `prefixes`)."""
    changed: list[str] = []
    for record in sorted(site.glob("*.dist-info/RECORD")):
        try:
            rows = list(csv.reader(record.read_text(encoding="utf-8").splitlines()))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        for row in rows:
            if len(row) < 2 or not row[0].startswith(prefixes):
                continue
            if not row[1].startswith("sha256="):
                continue
            try:
                data = (site / row[0]).read_bytes()
            except OSError:
                changed.append(row[0])
                continue
            digest = hashlib.sha256(data).digest()
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != row[1][len("sha256=") :]:
                changed.append(row[0])
    return tuple(sorted(changed))


def selected_release(variable: str, name: str, releases: Iterable[str], default: str) -> str:
    """The release of engine `name` the environment variable `variable` selects, else
    `default`; a `ConfigError` naming `releases` (those the project drives) when it is
    another. One process imports one release of an engine (each is one package), so the choice
    is the process's, made when the engine's manifest module is imported."""
    supported = tuple(releases)
    version = os.environ.get(variable, "") or default
    if version not in supported:
        raise ConfigError(
            variable,
            version,
            f"a {name} release this project drives: {', '.join(supported)} (unset: {default})",
        )
    return version


def stamped_requirements(directory: Path) -> tuple[str, ...] | None:
    """The requirements the stamp in `directory` lists; None without a readable stamp."""
    return _requirements_of(_read_stamp(directory))


def stamped_engine(directory: Path) -> str | None:
    """The engine the stamp in `directory` names; None without a readable stamp."""
    stamp = _read_stamp(directory)
    engine = stamp.get("engine")
    return engine if isinstance(engine, str) and _requirements_of(stamp) else None


def _requirements_of(stamp: dict[str, object]) -> tuple[str, ...] | None:
    recorded = stamp.get("packages")
    if not isinstance(recorded, list) or not all(isinstance(r, str) for r in recorded):
        return None
    return tuple(recorded)


def _read_stamp(directory: Path) -> dict[str, object]:
    try:
        recorded = json.loads((directory / STAMP).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def cache_root() -> Path:
    """The project's engine cache: $SCHEDSPEC_ENGINE_CACHE or ~/.cache/schedspec/engines.

    Always absolute: a relative $SCHEDSPEC_ENGINE_CACHE is taken from the current directory
    here, so the `sys.path` entry `activate` adds still works after a `chdir`."""
    env = os.environ.get("SCHEDSPEC_ENGINE_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "schedspec" / "engines"
    return root.absolute()


__all__ = [
    "INSTALL_COMMAND",
    "LAYOUT",
    "STAMP",
    "EngineImportFailed",
    "EngineManifest",
    "EngineNotInstalled",
    "Package",
    "cache_root",
    "stamped_engine",
    "stamped_requirements",
]
