"""The one import-string loader: `package.module:attribute` -> the object.

The current directory is importable, as users expect from a command-line tool: `--impl
my_module:make` finds `my_module.py` in the directory the command runs in, without PYTHONPATH.
Every failure is a `ConfigError` naming the flag and what would be valid.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

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


def _cwd_importable() -> None:
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


def _import_after_loading(engine: str, module_name: str) -> object:
    """Load `engine` (its install: `EngineNotInstalled` names the install command), then
    import `module_name` again, which imports the engine at its top."""
    loader, importing = ENGINE_LOADERS[engine]
    _cast_call(_load_attribute(loader))()
    context = _cast_call(_load_attribute(importing))() if importing else contextlib.nullcontext()
    with context:
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


def load_object(target: str, flag: str = "impl") -> object:
    """Import `package.module` (from the current directory too) and return its `attribute`.

    A module that imports a real engine (vLLM, SGLang, Vidur) at its top is imported again
    after the engine's install is loaded (`ENGINE_LOADERS`), as the engine's own built-ins
    import it; an engine not installed is `EngineNotInstalled` naming the install command."""
    module_name, attr = split_target(target, flag)
    _cwd_importable()
    try:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            engine = _engine_missing(err)
            if engine is None:
                raise
            from integrations.manifest import EngineNotInstalled

            try:
                module = cast(ModuleType, _import_after_loading(engine, module_name))
            except EngineNotInstalled as missing:  # named by the target that needs it
                raise missing.wanted_by(target) from None
    except ImportError as err:
        raise ConfigError(flag, target, f"an importable module ({err})") from None
    except SyntaxError as err:
        raise ConfigError(
            flag, target, f"a module that compiles ({err.msg}, line {err.lineno})"
        ) from None
    except SchedSpecError:
        raise  # a typed error the module raised on purpose (an engine's release setting): one line
    except (Exception, SystemExit) as err:
        # the user's module ran code at import that failed (or called sys.exit): their bug,
        # named with where it happened, not a traceback of ours nor a stray exit status
        raise ConfigError(
            flag, target, f"a module that imports (importing it raised {describe_raised(err)})"
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(flag, target, f"an attribute of {module_name} (no {part!r} there)")
        obj = getattr(obj, part)
    return obj


def module_available(module_name: str) -> bool:
    """Whether `module_name` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False


__all__ = ["MissingDependency", "load_object", "module_available", "split_target"]
