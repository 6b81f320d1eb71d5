"""`schedspec install-engines [vllm|sglang|vidur|all] [--force] [--prune]`: install the pinned
engines.

Each engine's `MANIFEST` (an `integrations.manifest.EngineManifest`, exported by
`integrations.<engine>`, imported lazily so a missing engine package costs nothing) is installed
into `MANIFEST.directory` (`<cache>/<engine>-<version>-<pins>`, `<pins>` a digest of its
requirements and of the layout), the packages into its `site-packages/`:

1. every package with `pip install --no-deps --no-compile --target` (a package marked
   `deps=True` without `--no-deps`), each into its own staging directory (`--jobs` pip
   processes at a time, 4 by default) that is then merged into the engine's `site-packages/`
   in the manifest's order — so two packages sharing a namespace directory (`google/`, `bin/`)
   both land, which a second plain `pip install --target` into the same directory would skip;
2. `python -c "import <import_check>"` with that `site-packages/` on PYTHONPATH and the
   manifest's environment, with this interpreter (the project's venv, whose torch is used),
   writing bytecode even where $PYTHONDONTWRITEBYTECODE is set: the modules an adapter's
   import reaches are compiled once, here, and only those (vLLM's import check reaches 1,605
   of its install's 9,206 modules; pip compiling them all was about 30 % of the three default
   engines' install time);
3. the stamp (`.schedspec-installed`), written last, listing every requirement installed: a
   directory without a stamp listing exactly the manifest's requirements is an incomplete
   install, removed and redone. A complete one is reused ("cached") unless `--force`.

Installs of the same engine for other pins (another checkout's, or one from before a `git pull`
moved a pin), and one in a directory an older schedspec used (`<cache>/<engine>-<version>`, or
the packages at the top of the directory, before `site-packages/`), live in other directories
and are left alone: another environment may use them.
Each is named with what its pins differ in and its size; `--prune` removes them.

A per-engine lock file next to the directory serialises concurrent installers (two pytest
workers, two shells). `--prune` leaves a pruned install's lock file: an installer may be
waiting on it, and one that created a new file meanwhile would run beside it.

Exit codes: 0 installed or cached; 1 a pip install or the import check failed (naming the
package and pip's last line); 2 usage: an unknown engine, one whose adapter package is not part
of this checkout, or an engine cache that cannot be written.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from integrations.manifest import EngineManifest, Package, cache_root, stamped_requirements
from spec.errors import ConfigError, SchedSpecError

#: pip processes staging an engine's packages at a time: its packages are mostly small wheels
#: whose install is pip's own start-up, so a few overlap well even on two cores
DEFAULT_JOBS = 4

# engine name -> the module exporting its MANIFEST
ENGINE_MODULES: Mapping[str, str] = {
    "vllm": "integrations.vllm",
    "sglang": "integrations.sglang",
    "vidur": "integrations.vidur",
}

Printer = Callable[[str], None]


class UnknownEngine(ConfigError):
    """An engine name that is not one of ours, or whose adapter package is absent."""

    def __init__(self, name: str, valid: str) -> None:
        super().__init__("engine", name, valid)


class InstallFailed(SchedSpecError):
    """A pip install or the import check failed; names the package and pip's last line."""

    def __init__(self, engine: str, what: str, last_line: str) -> None:
        self.engine = engine
        self.what = what
        self.last_line = last_line
        super().__init__(f"{engine}: {what} failed: {last_line}")


@dataclass(frozen=True, slots=True)
class InstallResult:
    """What `install` did for one engine."""

    engine: str
    directory: Path
    cached: bool
    seconds: float


def resolve(names: Sequence[str], modules: Mapping[str, str] = ENGINE_MODULES) -> list[str]:
    """The engine names `names` asks for, in order, without duplicates.

    `all` means every engine whose adapter package is present in this checkout. A name that is
    not an engine raises `UnknownEngine`.
    """
    valid = ", ".join([*modules, "all"])
    wanted: list[str] = []
    for name in names or ["all"]:
        if name == "all":
            wanted.extend(n for n in modules if _present(modules[n]))
        elif name in modules:
            wanted.append(name)
        else:
            raise UnknownEngine(name, f"one of {valid}")
    return list(dict.fromkeys(wanted))


def load_manifest(name: str, modules: Mapping[str, str] = ENGINE_MODULES) -> EngineManifest:
    """`<module>:MANIFEST` of engine `name`; `UnknownEngine` when its package is absent."""
    module_name = modules[name]
    if not _present(module_name):
        raise UnknownEngine(
            name, f"an engine whose adapter package {module_name} is part of this checkout"
        )
    module = importlib.import_module(module_name)
    manifest = getattr(module, "MANIFEST", None)
    if not isinstance(manifest, EngineManifest):
        raise UnknownEngine(name, f"{module_name}.MANIFEST to be an EngineManifest")
    return manifest


def install(
    manifest: EngineManifest,
    *,
    force: bool = False,
    prune: bool = False,
    python: str = sys.executable,
    jobs: int = DEFAULT_JOBS,
    out: Printer = print,
) -> InstallResult:
    """Install `manifest` into its directory (see the module docstring); reuse a complete one.
    Then name each install of the engine for other pins, or remove it with `prune`.

    `jobs` pip processes install the packages at a time (at least 1).

    Raises `InstallFailed` when pip or the import check fails; the stamp is then not written.
    Raises `ConfigError` for `jobs` below 1.
    """
    if jobs < 1:
        raise ConfigError("jobs", jobs, "a whole number of pip processes, at least 1")
    result = _install(manifest, force=force, python=python, jobs=jobs, out=out)
    for other in manifest.other_installs():
        _report_other(manifest, other, prune=prune, out=out)
    return result


def _install(
    manifest: EngineManifest, *, force: bool, python: str, jobs: int, out: Printer
) -> InstallResult:
    """Install `manifest` unless a complete install is there (and not `force`)."""
    tag = f"[{manifest.engine}]"
    start = time.monotonic()
    directory = manifest.directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _locked(_lock_of(directory)):
        if manifest.installed() and not force:
            out(f"{tag} cached: {directory}")
            modified = manifest.modified_sources()
            if modified:  # patched by hand: still this install, but say so (--force redoes it)
                shown = ", ".join(modified[:5]) + (", ..." if len(modified) > 5 else "")
                out(
                    f"{tag} note: {len(modified)} of its sources differ from the "
                    f"{manifest.engine} {manifest.version} release ({shown}); `--force` "
                    "reinstalls the release"
                )
            return InstallResult(manifest.engine, directory, True, time.monotonic() - start)
        if directory.exists():  # an incomplete install, or --force
            shutil.rmtree(directory)
        staging = directory.with_name(directory.name + ".staging")
        if staging.exists():
            shutil.rmtree(staging)
        manifest.site_packages.mkdir(parents=True)
        total = len(manifest.packages)
        at_once = min(jobs, total)
        out(f"{tag} installing {total} package(s) into {directory} ({at_once} at a time)")
        try:
            _stage_and_merge(manifest, staging, python=python, jobs=jobs, out=out)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        t0 = time.monotonic()
        _import_check(python, manifest)
        out(f"{tag} import {manifest.import_check} ok {time.monotonic() - t0:.1f}s")
        seconds = time.monotonic() - start
        manifest.stamp.write_text(
            json.dumps(
                {
                    "engine": manifest.engine,
                    "version": manifest.version,
                    "packages": list(manifest.requirements),
                    "python": sys.version.split()[0],
                    "seconds": round(seconds, 1),
                },
                indent=1,
            )
            + "\n",
            encoding="utf-8",
        )
    out(f"{tag} installed in {seconds:.1f}s")
    return InstallResult(manifest.engine, directory, False, seconds)


def _stage_and_merge(
    manifest: EngineManifest, staging: Path, *, python: str, jobs: int, out: Printer
) -> None:
    """pip-install every package of `manifest` into its own staging directory, `jobs` pip
    processes at a time, and merge each into `site-packages/` in the manifest's order (so a
    later package's file wins, whatever finished first). Most of an engine's packages are
    small wheels whose install is pip's own start-up, which is why they overlap well.

    On a failure, raises the `InstallFailed` of the first failing package in the manifest's
    order; packages not yet started are not started."""
    tag = f"[{manifest.engine}]"
    total = len(manifest.packages)

    def stage(i: int, package: Package) -> float:
        t0 = time.monotonic()
        _pip_install(python, package, staging / str(i), manifest.engine)
        return time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(stage, i, p) for i, p in enumerate(manifest.packages, 1)]
        try:
            for i, (package, future) in enumerate(zip(manifest.packages, futures, strict=True), 1):
                seconds = future.result()
                _merge(staging / str(i), manifest.site_packages)
                out(f"{tag} ({i}/{total}) {package.requirement} {seconds:.1f}s")
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _report_other(manifest: EngineManifest, other: Path, *, prune: bool, out: Printer) -> None:
    """One line on an install of the engine for other pins: what its pins differ in and its
    size, and either that it was removed (`prune`) or how to remove it."""
    tag = f"[{manifest.engine}]"
    recorded = stamped_requirements(other) or ()
    what = f"{other} ({_pin_changes(manifest.requirements, recorded)}, {_megabytes(other)} MB)"
    if not prune:
        out(
            f"{tag} the cache also holds another install of {manifest.engine}: {what}; another "
            "environment may use it (--prune removes it)"
        )
        return
    with _locked(_lock_of(other)):
        if other.exists():
            shutil.rmtree(other)
    out(f"{tag} pruned another install of {manifest.engine}: {what}")


def main(argv: Sequence[str] | None = None, *, modules: Mapping[str, str] = ENGINE_MODULES) -> int:
    """The `install-engines` command. Returns the exit code (0 ok, 1 install failed, 2 usage)."""
    parser = _Parser(
        prog="schedspec install-engines",
        description="Install the pinned real engines (CPU) into the project's engine cache "
        "($SCHEDSPEC_ENGINE_CACHE, else ~/.cache/schedspec/engines); a complete install is reused.",
    )
    parser.add_argument(
        "engines",
        nargs="*",
        metavar="ENGINE",
        help=f"engines to install: {', '.join(modules)} or all (default: all)",
    )
    parser.add_argument(
        "--force", action="store_true", help="reinstall even when a complete install exists"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"pip processes installing an engine's packages at a time (default {DEFAULT_JOBS})",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="remove the cache's installs of these engines for other pins (another checkout's, "
        "or one from before the pins changed); without it they are only named",
    )
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except _UsageError as exc:
        print(f"schedspec install-engines: error: {exc} (see --help)", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return 0 if exc.code in (0, None) else 2
    start = time.monotonic()
    try:
        if args.jobs < 1:
            raise ConfigError("--jobs", args.jobs, "a whole number of pip processes, at least 1")
        names = resolve(args.engines, modules)
        manifests = [load_manifest(n, modules) for n in names]
    except ConfigError as exc:
        print(f"schedspec install-engines: error: {exc}", file=sys.stderr)
        return 2
    if not manifests:
        print("schedspec install-engines: no engine adapters in this checkout", file=sys.stderr)
        return 2
    for manifest in manifests:
        try:
            install(manifest, force=args.force, prune=args.prune, jobs=args.jobs)
        except InstallFailed as exc:
            print(f"schedspec install-engines: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # the cache itself: missing parent, read-only, not a directory
            print(f"schedspec install-engines: {_unusable_cache(exc)}", file=sys.stderr)
            return 2
    print(f"install-engines: {', '.join(names)} ready in {time.monotonic() - start:.1f}s")
    return 0


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """One line for a usage error, not argparse's two-line usage dump."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _unusable_cache(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return (
        f"{where}{exc.strerror or exc}: the engine cache ({cache_root()}) must be a directory "
        "this user can write; set SCHEDSPEC_ENGINE_CACHE to one"
    )


def _pin_changes(ours: Sequence[str], theirs: Sequence[str]) -> str:
    """What another install's requirements have that the manifest's do not, and the reverse,
    for one line."""
    if tuple(ours) == tuple(theirs):  # named by an older schedspec, before pins named directories
        return "the same pins, in an older schedspec's directory"
    extra = [r for r in theirs if r not in ours]
    lacking = [r for r in ours if r not in theirs]
    parts = [f"it pins {', '.join(extra)}"] if extra else []
    parts += [f"not {', '.join(lacking)}"] if lacking else []
    return "; ".join(parts) or "the same packages in another order"


def _megabytes(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return round(total / 1e6)


def _lock_of(directory: Path) -> Path:
    return directory.with_name(directory.name + ".lock")


def _present(module_name: str) -> bool:
    if module_name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pip_install(python: str, package: Package, target: Path, engine: str) -> None:
    cmd = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--no-compile",  # the import check compiles what is imported (see the docstring)
        "--target",
        str(target),
    ]
    if not package.deps:
        cmd.append("--no-deps")
    cmd.append(package.requirement)
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise InstallFailed(
            engine, f"pip install {package.requirement}", _last_line(res.stderr + res.stdout)
        )


def _import_check(python: str, manifest: EngineManifest) -> None:
    env = dict(os.environ)
    env.update(manifest.env)
    # pip compiled nothing: this import writes the bytecode of every module it reaches
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(manifest.site_packages) + (os.pathsep + old if old else "")
    res = subprocess.run(
        [python, "-c", f"import {manifest.import_check}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if res.returncode != 0:
        raise InstallFailed(
            manifest.engine,
            f"import check `import {manifest.import_check}`",
            _last_line(res.stderr + res.stdout),
        )


def _merge(src: Path, dst: Path) -> None:
    """Move the tree `src` into `dst`, merging directories both have; a later file wins."""
    if not src.exists():
        return
    for entry in src.iterdir():
        there = dst / entry.name
        if entry.is_dir() and not entry.is_symlink() and there.is_dir():
            _merge(entry, there)
        else:
            if there.is_dir() and not there.is_symlink():
                shutil.rmtree(there)
            elif there.exists() or there.is_symlink():
                there.unlink()
            shutil.move(str(entry), str(there))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "DEFAULT_JOBS",
    "ENGINE_MODULES",
    "InstallFailed",
    "InstallResult",
    "UnknownEngine",
    "install",
    "load_manifest",
    "main",
    "resolve",
]
