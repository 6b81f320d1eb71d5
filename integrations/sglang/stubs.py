"""In-process stand-ins for SGLang's plumbing imports (never its scheduling code).

SGLang 0.5.23's scheduler modules import a serving stack at module level: GPU kernels
(triton), IPC (zmq), HTTP (fastapi, uvicorn), tokenizers (transformers) and similar. None of
them is called on the path the adapter drives (scheduler -> adder -> batch -> pools -> worker
hook -> algorithm -> result processing), so `importing()` registers a meta-path finder that
answers those imports, and only those, with permissive placeholder modules. It is active only
while the adapter imports SGLang (`importing()`), after the engine's directory is on sys.path.

A placeholder attribute is a class (so `class X(transformers.PretrainedConfig)` works), calling
it returns an instance, decorating with it returns the function unchanged (`@triton.jit`), and
every attribute of an instance or class is again a placeholder. A placeholder is never a
scheduling decision: if the driven path ever *used* one, the run would fail, not silently pass.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

# Top-level packages answered with placeholders (plumbing only; see the module docstring).
STUBBED: tuple[str, ...] = (
    "triton",  # GPU kernels (module-level @triton.jit)
    "zmq",  # IPC between tokenizer, scheduler and detokenizer processes
    "transformers",  # model configs and tokenizers (no model is loaded)
    "fastapi",  # HTTP server
    "uvicorn",
    "starlette",
    "requests",
    "aiohttp",
    "openai",  # OpenAI-compatible API types
    "pydantic",  # API schemas
    "pydantic_core",
    "partial_json_parser",  # function-call parsing
    "huggingface_hub",  # model downloads
    "IPython",
    "setproctitle",
    "tvm_ffi",  # JIT kernel bindings
    "torchvision",  # multimodal preprocessing
    "sentencepiece",
    "compressed_tensors",  # quantization configs
    "gguf",
    "einops",
)


# Dunder attributes that SGLang's import-time patches read from stubbed classes.
_EMPTY_DUNDERS = frozenset({"__class_validators__"})


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name in _EMPTY_DUNDERS:
            return []
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Member(f"{cls.__name__}.{name}")

    def __getitem__(cls, item: object) -> Any:
        return cls

    def __setitem__(cls, key: object, value: object) -> None:
        pass

    def __contains__(cls, item: object) -> bool:
        return False

    def __or__(cls, other: object) -> Any:
        return cls

    def __ror__(cls, other: object) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:
        return iter(())


class _Inert:
    """Container protocol of a placeholder: indexing returns itself, writes are dropped, it
    contains and yields nothing."""

    def __getitem__(self, item: object) -> Any:
        return self

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def __contains__(self, item: object) -> bool:
        return False

    def __iter__(self) -> Iterator[Any]:
        return iter(())


class _Stub(_Inert, metaclass=_StubMeta):
    """A placeholder: subclassable, callable, a pass-through decorator."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], type):
            return args[0]  # used as a decorator: keep the function
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:  # e.g. `class K(TypedDictStub, total=False)`
        super().__init_subclass__()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # `@triton.jit(...)`: keep the function
        return _Member(f"{type(self).__name__}()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Member(f"{type(self).__name__}.{name}")

    def __bool__(self) -> bool:
        return False


# Device probing through these raises, as triton's does on a machine without a GPU, so SGLang
# takes its own CPU fallback (`try: triton.runtime.driver.active... except: "cpu"`).
_RAISING = frozenset({"driver"})


class PlaceholderCalled(RuntimeError):
    """A stubbed plumbing function was called: the driven path used something it must not."""


class _Member(_Inert):
    """An attribute of a placeholder: chains further attributes and calls (a pass-through
    decorator when given one function); device probes raise `PlaceholderCalled`."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Member(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        if any(part in _RAISING for part in self._name.split(".")):
            raise PlaceholderCalled(f"{self._name}() is a schedspec placeholder (no device)")
        return _Member(f"{self._name}()")

    def __len__(self) -> int:
        return 0

    def __or__(self, other: object) -> Any:
        return self

    def __ror__(self, other: object) -> Any:
        return self

    def __bool__(self) -> bool:
        return False


def _make_class(name: str) -> type:
    return _StubMeta(name.rsplit(".", 1)[-1], (_Stub,), {"__module__": "schedspec_stub"})


class _StubModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package: submodules are stubbed too
        self.__file__ = f"<schedspec stub {name}>"
        self.__version__ = "3.5.0"  # read by version checks at import time (e.g. triton >= 3)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _make_class(name)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = frozenset(roots)
        self.loader = _Loader()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=True)
        return None


def _no_compile(*args: Any, **kwargs: Any) -> Any:
    """`torch.compile` stand-in while SGLang imports: module-level `@torch.compile(...)` would
    pull in torch's inductor, which then mistakes the triton placeholder for a real triton.
    The decorated kernels are not on the driven path."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


_answered: set[str] = set()


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """Answer the plumbing imports with placeholders, and keep `torch.compile` a pass-through,
    only for the duration of the block (SGLang's imports).

    Afterwards the finder is removed and the placeholder modules leave `sys.modules`: SGLang's
    modules keep the references they bound, and any other code in the process (another engine,
    the torch engine) imports the real packages, or gets ImportError, as without SGLang.

    Placeholders answer every stubbed package whether or not it is installed (the finder goes
    first, and real modules already imported are hidden for the block and put back after):
    SGLang's import must not depend on what else the environment holds — a real pydantic (Ray
    brings one) next to placeholder openai types cannot build SGLang's API schemas.
    """
    import torch

    finder = _Finder(STUBBED)
    hidden = {
        name: module
        for name, module in sys.modules.items()
        if name.split(".", 1)[0] in finder.roots
    }
    for name in hidden:
        del sys.modules[name]
    sys.meta_path.insert(0, finder)
    saved = torch.compile
    torch.compile = _no_compile
    try:
        yield
    finally:
        torch.compile = saved
        sys.meta_path.remove(finder)
        for name, module in list(sys.modules.items()):
            if isinstance(module, _StubModule):
                _answered.add(name)
                del sys.modules[name]
        sys.modules.update(hidden)
        _forget_triton_probes()


def _forget_triton_probes() -> None:
    """torch caches "is triton installed" (`torch.utils._triton`, functools caches) the first
    time it asks; if that happened while the placeholder answered, clear those caches so the
    rest of the process sees the truth (no triton on this CPU build)."""
    try:
        probes = importlib.import_module("torch.utils._triton")
    except ImportError:
        return
    for value in vars(probes).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()


def stubbed_modules() -> list[str]:
    """Names of the modules answered with placeholders so far (for docs and diagnostics)."""
    return sorted(_answered)
