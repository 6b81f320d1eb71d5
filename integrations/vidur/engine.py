"""Import Vidur's real replica scheduler classes, standing in for four unused imports.

Imported only by the factories, never by `integrations.vidur` itself; `load` activates the
install (puts its `site-packages/` on sys.path) before it imports Vidur.

Stub (the only one): `vidur.scheduler.replica_scheduler.*` imports, through
`vidur.execution_time_predictor` and `vidur.scheduler.global_scheduler`, the execution-time
predictors and the global schedulers, which import `sklearn`, `pandas`, `fasteners` and
`huggingface_hub` at module level. None of them is called by a replica scheduler (the adapter
gives the stage scheduler a constant execution time), so while Vidur's modules are imported a
meta-path finder answers those four top-level names with empty modules whose attributes are
placeholder classes; afterwards the finder and the placeholder modules are removed again, so
the rest of the process imports the real packages (if installed) as usual. Installing them
instead would add scipy, scikit-learn and pandas (about 150 MB) to the engine directory.
`load_event_loop` (for `integrations.vidur.pipeline`) also imports Vidur's event classes, whose
metrics store imports `plotly_express`, `wandb` and `ddsketch`: placeholders too
(`EVENT_LOOP_STUBBED_ROOTS`), never called, since the pipeline gives the events a metrics store
that records nothing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from integrations.vidur.manifest import KINDS_OF, MANIFEST, VIDUR_VERSION

STUBBED_ROOTS: tuple[str, ...] = ("sklearn", "pandas", "fasteners", "huggingface_hub")
# Vidur's event classes import its metrics store, which plots (plotly_express), logs to W&B
# (wandb) and keeps quantile sketches (ddsketch) at module level; the pipeline driver gives the
# events a metrics store that records nothing, so these are never called either
EVENT_LOOP_STUBBED_ROOTS: tuple[str, ...] = (*STUBBED_ROOTS, "plotly_express", "wandb", "ddsketch")


class _Placeholder(types.ModuleType):
    """An empty module: any attribute is a fresh placeholder class of that name."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = frozenset(roots)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@dataclass(frozen=True, slots=True)
class VidurClasses:
    """The real Vidur classes the adapter drives (untyped: Vidur ships no annotations)."""

    version: str
    schedulers: dict[str, Any]  # kind -> replica scheduler class (the kinds it ships)
    scheduler_configs: dict[str, Any]  # kind -> its scheduler config dataclass
    ReplicaConfig: Any
    CacheConfig: Any  # None before 0.0.26, where block size and pool size were elsewhere
    Replica: Any
    Request: Any
    SyntheticRequestGeneratorConfig: Any
    FixedRequestLengthGeneratorConfig: Any


_MODULES = {
    "vllm": ("vllm_replica_scheduler", "VLLMReplicaScheduler", "VllmSchedulerConfig"),
    "sarathi": ("sarathi_replica_scheduler", "SarathiReplicaScheduler", "SarathiSchedulerConfig"),
    "orca": ("orca_replica_scheduler", "OrcaReplicaScheduler", "OrcaSchedulerConfig"),
    "lightllm": (
        "lightllm_replica_scheduler",
        "LightLLMReplicaScheduler",
        "LightllmSchedulerConfig",
    ),
    "ft": (
        "faster_transformer_replica_scheduler",
        "FasterTransformerReplicaScheduler",
        "FasterTransformerSchedulerConfig",
    ),
    "mnemosyne": (
        "mnemosyne_fcfs_fixed_chunk_replica_scheduler",
        "MnemosyneFCFSFixedChunkReplicaScheduler",
        "MnemosyneFCFSFixedChunkSchedulerConfig",
    ),
}


@contextlib.contextmanager
def stubbed_imports(roots: Sequence[str] = STUBBED_ROOTS) -> Iterator[None]:
    """Within the block the placeholder modules answer the imports of `roots`; afterwards they
    leave `sys.modules`, so the rest of the process imports the real packages as usual."""
    finder = _StubFinder(roots)
    before = set(sys.modules)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if name.split(".")[0] in finder.roots:
                del sys.modules[name]


def load() -> VidurClasses:
    """Activate the install and import Vidur (the import once per process; the release
    `SCHEDSPEC_VIDUR_VERSION` selects) with the placeholder modules in place:
    `EngineNotInstalled` when it is not installed, on every call (a caller that points the
    engine cache elsewhere is told, even after an earlier import), `EngineImportFailed` when it
    does not import in this environment (a module it needs is missing here)."""
    MANIFEST.activate()
    return _import_classes()


@functools.cache
def _import_classes() -> VidurClasses:
    with MANIFEST.importing(), stubbed_imports():
        config = importlib.import_module("vidur.config")
        entities = importlib.import_module("vidur.entities")
        kinds = {k: v for k, v in _MODULES.items() if k in KINDS_OF[VIDUR_VERSION]}
        schedulers = {
            kind: getattr(
                importlib.import_module(f"vidur.scheduler.replica_scheduler.{module}"), cls
            )
            for kind, (module, cls, _) in kinds.items()
        }
    return VidurClasses(
        version=VIDUR_VERSION,
        schedulers=schedulers,
        scheduler_configs={kind: getattr(config, c) for kind, (_, _, c) in kinds.items()},
        ReplicaConfig=config.ReplicaConfig,
        CacheConfig=getattr(config, "CacheConfig", None),
        Replica=entities.Replica,
        Request=entities.Request,
        SyntheticRequestGeneratorConfig=config.SyntheticRequestGeneratorConfig,
        FixedRequestLengthGeneratorConfig=config.FixedRequestLengthGeneratorConfig,
    )


@dataclass(frozen=True, slots=True)
class VidurEventLoop:
    """Vidur's own event classes and global schedulers (untyped: Vidur ships no annotations)."""

    RequestArrivalEvent: Any  # the first event of a request; the rest follow from it
    global_schedulers: dict[str, Any]  # routing ("round_robin", "lor") -> its class
    replica_id: Any  # how Vidur names replica i: int, or 0.0.26's ReplicaId


@functools.cache
def load_event_loop() -> VidurEventLoop:
    """`load`, then Vidur's event classes (`vidur.events`) and its round-robin and
    least-outstanding-requests global schedulers, with placeholders for the metrics store's
    imports too (`EVENT_LOOP_STUBBED_ROOTS`)."""
    load()
    package = "vidur.scheduler.global_scheduler"
    with MANIFEST.importing(), stubbed_imports(EVENT_LOOP_STUBBED_ROOTS):
        events = importlib.import_module("vidur.events")
        round_robin = importlib.import_module(f"{package}.round_robin_global_scheduler")
        lor = importlib.import_module(f"{package}.lor_global_scheduler")
    return VidurEventLoop(
        RequestArrivalEvent=events.RequestArrivalEvent,
        global_schedulers={
            "round_robin": round_robin.RoundRobinGlobalScheduler,
            "lor": lor.LORGlobalScheduler,
        },
        replica_id=getattr(round_robin, "ReplicaId", int),  # 0.0.26 types its replica ids
    )


__all__ = [
    "EVENT_LOOP_STUBBED_ROOTS",
    "STUBBED_ROOTS",
    "VidurClasses",
    "VidurEventLoop",
    "load",
    "load_event_loop",
    "stubbed_imports",
]
