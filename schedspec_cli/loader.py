"""The one import-string loader: `package.module:attribute` -> the object.

The current directory is importable, as users expect from a command-line tool: `--impl
my_module:make` finds `my_module.py` in the directory the command runs in, without PYTHONPATH.
Every failure is a `ConfigError` naming the flag and what would be valid.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from properties.deadline import CallDeadlineExceeded, call_deadline, call_timeout_set
from properties.raised import describe_raised
from spec.errors import ConfigError, SchedSpecError


class MissingDependency(ConfigError):
    """A command needs a package this environment lacks (exit 2): the message says who needs
    what and how to install it. A `ConfigError` (field: who needs it; value: the package), so
    every handler of bad configuration handles it, with a sentence of its own."""

    def __init__(self, needed_by: str, package: str, install: str) -> None:
        self.field: str = needed_by
        self.value: object = package
        self.valid: str = install
        Exception.__init__(
            self, f"{needed_by} needs {package}, which is not installed here: {install}"
        )


def cwd_importable() -> None:
    """The current directory on `sys.path`, as a user's `module:attribute` is looked up: the
    module beside the command imports without PYTHONPATH."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def split_target(target: str, flag: str = "impl") -> tuple[str, str]:
    """('package.module', 'attribute') of a `package.module:attribute` string."""
    module, sep, attr = target.partition(":")
    if not sep or not module.strip() or not attr.strip() or ":" in attr:
        raise ConfigError(flag, target, "'package.module:attribute'")
    return module, attr


#: A real engine's top-level package -> what loads it in this process ('module:function': it
#: activates the engine's install and imports what its adapters import) and, for Vidur, the
#: placeholders its scheduler modules need while they import ('module:context manager').
ENGINE_LOADERS: dict[str, tuple[str, str | None]] = {
    "vllm": ("integrations.vllm.adapter:load_vllm", None),
    "sglang": ("integrations.sglang.engine:import_engine", None),
    "vidur": ("integrations.vidur.engine:load", "integrations.vidur.engine:stubbed_imports"),
}


def _engine_missing(err: ImportError) -> str | None:
    """The real engine `err` says is not importable (its install not yet activated), if any."""
    name = err.name if isinstance(err, ModuleNotFoundError) else None
    root = (name or "").split(".")[0]
    return root if root in ENGINE_LOADERS else None


def _engines_imported_by(module_name: str) -> list[str]:
    """The real engines the source of `module_name` imports anywhere in it, read, not run (an
    empty list for a module already imported or whose source is not a readable .py file)."""
    if module_name in sys.modules:
        return []
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return []
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return []
    try:
        tree = ast.parse(Path(origin).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []  # the import itself reports what is wrong
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in ENGINE_LOADERS and root not in found:
                found.append(root)
    return found


#: How long importing a module `--impl` or `--twin` names may take (a torch or an engine import
#: takes seconds on a slow machine; one that never returns is refused past this).
IMPORT_TIMEOUT_S = 300.0


def _import_with_engines(module_name: str, engines: list[str]) -> ModuleType:
    """Load each of `engines` (its install first on the path, its modules imported), then
    import `module_name` with their import-time placeholders in place."""
    with contextlib.ExitStack() as stack:
        for engine in engines:
            loader, importing = ENGINE_LOADERS[engine]
            _cast_call(_load_attribute(loader))()
            if importing is not None:
                stack.enter_context(_cast_call(_load_attribute(importing))())
        # the user's own import, the engines loaded: under a deadline of its own (an import that
        # never returns would hang every command; one of torch takes seconds, past a short
        # --call-timeout)
        with call_timeout_set(IMPORT_TIMEOUT_S), call_deadline(f"importing {module_name}"):
            return importlib.import_module(module_name)


def _load_attribute(target: str) -> object:
    """The attribute of one of the project's own modules (`package.module:attribute`)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _cast_call(obj: object) -> Callable[[], Any]:
    """`obj` as the callable without arguments the project's own tables name it as."""
    if not callable(obj):
        raise TypeError(f"{obj!r} is not callable")
    return cast(Callable[[], Any], obj)


def _import_user_module(module_name: str, target: str, flag: str) -> ModuleType:
    """Import the user's module after the real engines it imports are loaded: those its source
    names (so it binds the install's engine, not a checkout on the path), then, should the
    import still miss one (imported indirectly), that one and again. An engine's own error
    (not installed, not importable here) is named by `target`."""
    from integrations.manifest import EngineNotInstalled

    engines = _engines_imported_by(module_name)
    try:
        try:
            return _import_with_engines(module_name, engines)
        except ImportError as err:
            engine = _engine_missing(err)
            if engine is None or engine in engines:
                raise
            return _import_with_engines(module_name, [*engines, engine])
    except EngineNotInstalled as missing:
        raise missing.wanted_by(target) from None
    except ConfigError as err:
        if err.field == "impl" and err.value in ENGINE_LOADERS:  # the engine's, not the user's
            raise ConfigError(flag, target, err.valid) from None
        raise


def load_object(target: str, flag: str = "impl") -> object:
    """Import `package.module` (from the current directory too) and return its `attribute`.

    A module that imports a real engine (vLLM, SGLang, Vidur) is imported after the engine's
    install is loaded (`ENGINE_LOADERS`), as the engine's own built-ins import it: it binds
    the install's engine even with a checkout of the engine on the path. An engine not
    installed is `EngineNotInstalled` naming the install command and `target`."""
    module_name, attr = split_target(target, flag)
    cwd_importable()
    try:
        module = _import_user_module(module_name, target, flag)
    except ImportError as err:
        raise ConfigError(flag, target, f"an importable module ({err})") from None
    except SyntaxError as err:
        raise ConfigError(
            flag, target, f"a module that compiles ({err.msg}, line {err.lineno})"
        ) from None
    except SchedSpecError:
        raise  # a typed error the module raised on purpose (an engine's release setting): one line
    except CallDeadlineExceeded as hang:
        raise ConfigError(
            flag,
            target,
            f"a module that imports (its import had not returned after {hang.seconds:g} s: "
            "does it run a loop or wait at import?)",
        ) from None
    except (Exception, SystemExit) as err:
        # the user's module ran code at import that failed (or called sys.exit): their bug,
        # named with where it happened, not a traceback of ours nor a stray exit status
        raise ConfigError(
            flag, target, f"a module that imports (importing it raised {describe_raised(err)})"
        ) from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                flag, target, f"an attribute of {module_name} (no {part!r} there)"
            ) from None
        except (Exception, SystemExit) as err:  # a module __getattr__ or a property that fails
            raise ConfigError(
                flag,
                target,
                f"an attribute that can be read (reading {part!r} raised {describe_raised(err)})",
            ) from None
    return obj


def module_available(module_name: str) -> bool:
    """Whether `module_name` can be imported here (without importing it). A namespace package
    (a folder without `__init__.py`, as Ray's session folder /tmp/ray is, found on the path from
    the current directory) is no installed package: not available."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


__all__ = ["MissingDependency", "load_object", "module_available", "split_target"]
