"""vLLM's CPU encoder-cache offload (`ECCPUConnector`, role `ec_both`) in the engine-core loop:
the connector attached to the scheduler, the worker's side of it, and the rules it must keep.

With an EC connector the scheduler may load an item's encoder output instead of running the
encoder: `_try_schedule_encoder_inputs` asks `has_cache_item(identifier)` and, if so, books the
item in the GPU encoder cache as an *external load* (no encoder compute budget, never in
`scheduled_encoder_inputs`). `ECCPUConnector` keeps a CPU region of blocks (one row of the
encoder's output a block, here) with an `EmbeddingCache` over it: every item the GPU cache
allocates that the region does not hold gets blocks and a *save* (`update_state_after_alloc`,
producer side); an item whose save the worker reported done is *ready*, and an external load of
it is *pinned* until the worker reports the load done (consumer side). The step's saves and
loads reach the worker in `SchedulerOutput.ec_connector_metadata`; the worker loads before the
encoder runs and saves what the encoder computed in the step (`ActiveECConnector.
maybe_get_output` saves exactly the entries the step added to the runner's encoder cache),
then reports both in `ModelRunnerOutput.ec_connector_output`.

`EncoderOffload` plays the worker (`EncoderRunner` calls it between the frees and the step's
encoder runs, and after them): it keeps what each CPU block holds, loads into and saves from
the runner's encoder cache as the metadata says, reports completions in the step's own output
(a synchronous copy), and checks:

- `ec_load_content`: every load names blocks that hold the item it names, saved by the worker
  (a load of blocks another item's save took, or of a save that never landed, would hand the
  model another image's features or garbage);
- `ec_save_lands`: every save names an item the encoder runs in its step (the worker saves
  only those: any other save never lands, and its entry stays not ready, holding its blocks
  and keeping `has_pending_push_work` true, for good);

and `ec_offload_settled`: once no request is left and no step is in flight, no entry of the
region is pinned or waiting for a save, and the connector has no push work left (vLLM's engine
keeps stepping while it has: it would never idle).

The region's shared-memory file is released as soon as the connector is built: the scheduler
side keeps only the block book, and the worker's content is modelled here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from integrations.vllm.adapter import environment_variable
from integrations.vllm.core_loop import EngineCoreViolation

OFFLOAD_RULES = ("ec_load_content", "ec_save_lands", "ec_offload_settled")

#: the encoder output's width, so that one block of the region holds one row (one embedding)
WIDTH = 64


def attach(sched: Any, cpu_blocks: int) -> Any:
    """Build vLLM's `ECCPUConnector` (role `ec_both`, no NIXL) with a region of `cpu_blocks`
    rows of encoder output, as vLLM's `Scheduler.__init__` builds it from
    `ec_transfer_config`, and set it on `sched`. Returns the connector."""
    ec_config = importlib.import_module("vllm.config.ec_transfer")
    factory = importlib.import_module("vllm.distributed.ec_transfer.ec_connector.factory")
    base = importlib.import_module("vllm.distributed.ec_transfer.ec_connector.base")
    vllm_config = sched.vllm_config
    row_bytes = WIDTH * int(vllm_config.model_config.dtype.itemsize)
    config = ec_config.ECTransferConfig(
        ec_connector="ECCPUConnector",
        ec_role="ec_both",
        ec_connector_extra_config={"ec_cpu_bytes": cpu_blocks * row_bytes},
    )
    # what `measure_encoder_output_widths` records at startup from a dummy encode
    config.mm_encoder_output_widths = {"image": WIDTH}
    vllm_config.ec_transfer_config = config
    # `ECCPUConnector` refuses the V1 model runner; the worker here is neither
    with environment_variable("VLLM_USE_V2_MODEL_RUNNER", "1"):
        connector = factory.ECConnectorFactory.create_connector(
            config=vllm_config, role=base.ECConnectorRole.SCHEDULER
        )
    connector.connector_scheduler._region.cleanup()
    sched.ec_connector = connector
    return connector


class OffloadCounts(Protocol):
    """Where the worker counts its saves and loads (`EncoderCounts`)."""

    encoder_saves: int
    encoder_loads: int


@dataclass
class _Step:
    """The worker's completion reports for one scheduler output. The loop builds a step's
    runner output before it rebuilds the runner's cache from the step (and after, for a step
    whose sampling waited), so the report holds these lists, filled by whichever comes later."""

    saves: list[str] = field(default_factory=list)
    loads: list[int] = field(default_factory=list)
    reported: bool = False
    applied: bool = False


class EncoderOffload:
    """The worker's side of `ECCPUConnector` and the rules above, for scheduler `sched` (its
    `ec_connector` set by `attach`); its saves and loads counted in `counts`."""

    def __init__(self, sched: Any, counts: OffloadCounts) -> None:
        self.sched: Any = sched
        self.connector: Any = sched.ec_connector
        self.counts: OffloadCounts = counts
        #: block -> the item whose save the worker wrote there
        self.blocks: dict[int, str] = {}
        #: id(scheduler output) -> what its step reports
        self._reports: dict[int, _Step] = {}

    def load(self, out: Any, cache: dict[str, int], where: str) -> None:
        """Load the step's loads into the runner's `cache` (identifier -> embeddings), each
        checked against what the region's blocks hold (`ec_load_content`)."""
        meta = out.ec_connector_metadata
        step = self._step(out)
        for mm_hash, (transfer_id, block_ids, shape) in meta.loads.items():
            holders = {self.blocks.get(b) for b in block_ids}
            if holders != {mm_hash}:
                held = {b: self.blocks.get(b) for b in block_ids}
                raise EngineCoreViolation(
                    "ec_load_content",
                    f"{where}: the connector loads {mm_hash!r} from CPU blocks {list(block_ids)}, "
                    f"which hold {held} (None: no save landed there); the model would read "
                    "another item's encoder output",
                )
            cache[mm_hash] = int(shape[0])
            step.loads.append(int(transfer_id))
            self.counts.encoder_loads += 1

    def save(self, out: Any, ran: set[str], where: str) -> None:
        """Save what the step's encoder `ran` (identifiers) where the metadata says; a save of
        anything else never lands (`ec_save_lands`)."""
        meta = out.ec_connector_metadata
        step = self._step(out, applied=True)
        for mm_hash, block_ids in meta.saves.items():
            if mm_hash not in ran:
                raise EngineCoreViolation(
                    "ec_save_lands",
                    f"{where}: the connector saves {mm_hash!r} to CPU blocks {list(block_ids)}, "
                    f"but the encoder does not run it in this step (it runs {sorted(ran)}): the "
                    "worker saves only what the step computed, so the save never lands and the "
                    f"entry holds {len(block_ids)} blocks, never ready, for good",
                )
            for b in block_ids:
                self.blocks[b] = mm_hash
            step.saves.append(mm_hash)
            self.counts.encoder_saves += 1

    def report(self, out: Any, outputs: Any) -> Any:
        """The step's `ECConnectorOutput` (its saves and loads done), for its runner output."""
        step = self._step(out, reported=True)
        common = importlib.import_module("vllm.distributed.ec_transfer.ec_connector.cpu.common")
        meta = common.ECCPUWorkerMetadata(completed_saves=step.saves, completed_loads=step.loads)
        return outputs.ECConnectorOutput(ec_connector_worker_meta=meta)

    def _step(self, out: Any, *, reported: bool = False, applied: bool = False) -> _Step:
        """`out`'s step, marked reported or applied; forgotten once both."""
        step = self._reports.setdefault(id(out), _Step())
        step.reported |= reported
        step.applied |= applied
        if step.reported and step.applied:
            del self._reports[id(out)]
        return step

    def held(self) -> dict[str, str]:
        """The region's entries no eviction may take: pinned by a load, or waiting for a save."""
        cache = self.connector.connector_scheduler._cache
        return {
            key: ("pinned" if entry.ready else "not ready")
            for key, entry in cache._entries.items()
            if not entry.evictable
        }

    def check_settled(self, where: str) -> None:
        """`ec_offload_settled`, once no request is left and no step is in flight (every save
        and load the worker did is reported): nothing held, no push work."""
        held = self.held()
        if held or self.connector.has_pending_push_work():
            raise EngineCoreViolation(
                "ec_offload_settled",
                f"{where}: no request is left and no step is in flight, but CPU encoder cache "
                f"entries are held: {held} (pinned: a load never reported done; not ready: a "
                "save that never landed); the connector reports push work for good, so the "
                "engine keeps stepping and never idles",
            )


__all__ = ["OFFLOAD_RULES", "WIDTH", "EncoderOffload", "OffloadCounts", "attach"]
