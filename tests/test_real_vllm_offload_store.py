"""The content-addressed KV store (`integrations.vllm.offload_store.OffloadStore`): it holds what
finished requests stored, by block hash, and puts a lookup off while a block of its hit is
being stored or loaded for another request, as vLLM's offloading connector does; and vLLM's
connector path over it, in both loops of the engine core.

Needs vLLM installed (`schedspec install-engines vllm`) for the loop tests; skipped with
SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.engine_core import (
    EngineCoreLoop,
    LoopOptions,
    core_program,
    run_loop,
)
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES, apply_kv_load_fixes
from integrations.vllm.offload_store import OffloadStore
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script

#: What `RemoteKv.execute` builds its report with (vLLM's `KVConnectorOutput`, by keywords).
_OUTPUTS = SimpleNamespace(KVConnectorOutput=lambda **fields: SimpleNamespace(**fields))


class _Req:
    """A request as the store reads it: an id, a prompt of `prompt` tokens with nothing
    generated, all computed, its full blocks' hashes, and a status (a finished one stopped)."""

    def __init__(self, rid: str, prompt: int, hashes: list[bytes]) -> None:
        self.request_id: str = rid
        self.num_prompt_tokens: int = prompt
        self.num_tokens: int = prompt
        self.num_computed_tokens: int = prompt
        self.block_hashes: list[bytes] = hashes
        self.status = SimpleNamespace(name="FINISHED_STOPPED")


def _drain(store: OffloadStore, kind: str, rid: str) -> None:
    """Run the store's worker until the `kind` transfer of `rid` is reported."""
    for _ in range(10):
        if (kind, rid) not in store.in_flight:
            return
        store.execute(store.metadata(), _OUTPUTS)
    raise AssertionError(f"the {kind} of {rid!r} was never reported")


def test_the_store_holds_what_was_stored_and_puts_lookups_off_while_busy() -> None:
    """Blocks of 2: r0's 4-token prompt (two full blocks) is stored when it finishes. While
    its store job runs, r1 (the same two blocks, then a fifth token) is told "ask again later";
    once it is done, r1 hits both blocks. While r1 loads them, r2 (the same prompt) is put off
    too; once r1's load is reported, r2 hits them. A request whose first block the store does
    not hold misses at once, busy blocks or not."""
    store = OffloadStore(0, 2, sync_loads=False)
    shared = [b"h0", b"h1"]
    r0, r1, r2 = _Req("r0", 4, shared), _Req("r1", 5, shared), _Req("r2", 5, shared)
    other = _Req("r3", 4, [b"x0", b"h1"])
    assert store.lookup(r1, 0) == 0
    assert store.finished(r0, [10, 11])
    assert store.lookup(r1, 0) is None and store.put_off_storing == 1
    assert "r1" in store.asked_later
    assert store.lookup(other, 0) == 0
    _drain(store, "send", "r0")
    assert list(store.stored) == shared
    assert store.lookup(r1, 0) == 4 and "r1" not in store.asked_later
    store.allocated(r1, [20, 21, 22], 4)
    assert store.lookup(r2, 0) is None and store.put_off_loading == 1
    assert store.lookup(r2, 2) is None  # the second block is still being loaded
    _drain(store, "load", "r1")
    assert store.lookup(r2, 0) == 4
    assert store.counts.lookups_put_off == 3


def test_a_one_token_prompt_is_never_a_whole_hit() -> None:
    """As `RemoteKv.matched` explains, vLLM would load a whole one-token prompt for ever."""
    store = OffloadStore(0, 1, sync_loads=False)
    store.stored[b"h0"] = None
    assert store.remote_tokens(_Req("r0", 1, [b"h0"])) == 0
    assert store.remote_tokens(_Req("r1", 2, [b"h0", b"h1"])) == 1


def test_a_store_offers_only_blocks_the_store_neither_holds_nor_is_storing() -> None:
    """As the manager's `prepare_store` keeps only new blocks: r1, finishing with r0's blocks
    still being stored, sends nothing (vLLM frees its blocks at once); r2 stores only its third
    block; a request whose last token is not computed offers only its computed full blocks."""
    store = OffloadStore(0, 2, sync_loads=False)
    assert store.finished(_Req("r0", 4, [b"h0", b"h1"]), [10, 11])
    assert store.storing == {"r0": (b"h0", b"h1")}
    assert not store.finished(_Req("r1", 4, [b"h0", b"h1"]), [12, 13])
    assert ("send", "r1") not in store.in_flight
    _drain(store, "send", "r0")
    assert store.finished(_Req("r2", 6, [b"h0", b"h1", b"h2"]), [14, 15, 16])
    assert store.storing == {"r2": (b"h2",)}
    partial = _Req("r3", 4, [b"h3", b"h4"])
    partial.num_computed_tokens = 3
    assert store.finished(partial, [17, 18])
    assert store.storing["r3"] == (b"h3",) and store.counts.sends == 3


def _stored(store: OffloadStore, rid: str, hashes: list[bytes]) -> None:
    """Have request `rid` (one 2-token block per hash) store `hashes`, and drain its send."""
    assert store.finished(_Req(rid, 2 * len(hashes), hashes), range(len(hashes)))
    _drain(store, "send", rid)


def _loading(store: OffloadStore, rid: str, hashes: list[bytes]) -> None:
    """Have request `rid` (a prompt of `hashes`' blocks and one token more) hit them all and
    start loading them (allocated: pinned until its load is reported)."""
    request = _Req(rid, 2 * len(hashes) + 1, hashes)
    assert store.lookup(request, 0) == 2 * len(hashes)
    store.allocated(request, range(100, 100 + len(hashes) + 1), 2 * len(hashes))


def test_a_full_store_evicts_its_least_recently_used_blocks() -> None:
    """Three blocks of room: a0 a1 (r0) then b0 (r1) are stored; r2's load of a0 a1 makes
    them the most recently used, so c0 (r3) evicts b0, and c0 is then the newest."""
    store = OffloadStore(0, 2, sync_loads=False, capacity=3)
    _stored(store, "r0", [b"a0", b"a1"])
    _stored(store, "r1", [b"b0"])
    assert list(store.stored) == [b"a0", b"a1", b"b0"]
    _loading(store, "r2", [b"a0", b"a1"])
    _drain(store, "load", "r2")
    assert list(store.stored) == [b"b0", b"a0", b"a1"]
    _stored(store, "r3", [b"c0"])
    assert list(store.stored) == [b"a0", b"a1", b"c0"]
    assert store.counts.blocks_evicted == 1 and store.counts.stores_refused == 0


def test_a_store_never_evicts_a_pinned_or_offered_block_and_refuses_instead() -> None:
    """Two blocks of room, both held: while r1 loads them they are pinned, so r2's c0 is
    refused (nothing evicted, nothing sent); once the load is reported, r3's c0 evicts a0.
    With one block of room holding a1, r4 offering a1 and d0 is refused too: a1 is its own
    offer (the manager's `prepare_store` protects it)."""
    store = OffloadStore(0, 2, sync_loads=False, capacity=2)
    _stored(store, "r0", [b"a0", b"a1"])
    _loading(store, "r1", [b"a0", b"a1"])
    assert not store.finished(_Req("r2", 2, [b"c0"]), [7])
    assert store.counts.stores_refused == 1 and list(store.stored) == [b"a0", b"a1"]
    assert ("send", "r2") not in store.in_flight
    _drain(store, "load", "r1")
    _stored(store, "r3", [b"c0"])
    assert list(store.stored) == [b"a1", b"c0"] and store.counts.blocks_evicted == 1
    small = OffloadStore(0, 2, sync_loads=False, capacity=1)
    _stored(small, "r0", [b"a1"])
    assert not small.finished(_Req("r4", 4, [b"a1", b"d0"]), [8, 9])
    assert small.counts.stores_refused == 1 and list(small.stored) == [b"a1"]


@pytest.mark.parametrize("capacity", [0, -1, True, 2.5])
def test_a_capacity_is_a_positive_block_count(capacity: Any) -> None:
    with pytest.raises(ConfigError, match=r"kv_store_blocks.*an int >= 1"):
        OffloadStore(0, 2, capacity=capacity)


@pytest.fixture
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.mark.usefixtures("_vllm")
def test_connector_programs_over_the_offload_store_pass_with_the_fixes() -> None:
    """The first 60 programs, those with prefix caching (only they share prompts), in
    both loops over the offload store, every fix made: they pass, and vLLM loads what earlier
    requests stored and is told to ask again later."""
    totals = {"loads": 0, "lookups_put_off": 0, "sends": 0}
    for seed in range(60):
        program = core_program(seed)
        if not program.config.enable_prefix_caching:
            continue
        options = LoopOptions(kv_connector="recompute", kv_store="offload", fix=apply_kv_load_fixes)
        for async_scheduling in (False, True):
            run = run_loop(program, async_scheduling=async_scheduling, options=options)
            for name in totals:
                totals[name] += getattr(run, name)
    assert all(totals.values()), totals


@pytest.mark.usefixtures("_vllm")
def test_shared_prompt_programs_over_a_small_store_pass_with_the_fixes() -> None:
    """The first 40 shared-prompt programs (`integrations.vllm.shared_prompt_programs`) over a
    store of 4 blocks, every fix made, in both loops: they pass; programs without prefix
    caching load from the store too (their sharers have no prefix cache to hit), and the store
    evicts and refuses stores."""
    options = LoopOptions(
        kv_connector="recompute",
        kv_store="offload",
        kv_store_blocks=4,
        fix=apply_kv_load_fixes,
    )
    totals = {"blocks_evicted": 0, "stores_refused": 0, "unprefixed_loads": 0}
    for seed in range(40):
        program = shared_prompt_program(seed)
        for async_scheduling in (False, True):
            run = run_loop(program, async_scheduling=async_scheduling, options=options)
            totals["blocks_evicted"] += run.blocks_evicted
            totals["stores_refused"] += run.stores_refused
            if not program.config.enable_prefix_caching:
                totals["unprefixed_loads"] += run.loads
    assert all(totals.values()), totals


@pytest.mark.usefixtures("_vllm")
@pytest.mark.parametrize(
    ("store", "flags", "match"),
    [
        ("nfs", {}, "invalid kv_store='nfs': one of draws, offload"),
        ("offload", {"kv_pending_lookups": True}, "draws with kv_pending_lookups or kv_role"),
        ("offload", {"kv_role": "kv_producer"}, "draws with kv_pending_lookups or kv_role"),
        ("draws", {"kv_store_blocks": 4}, "None with kv_store='draws'"),
    ],
)
def test_an_unknown_or_mixed_store_is_refused(
    store: str, flags: dict[str, Any], match: str
) -> None:
    """`kv_store` is "draws" or "offload"; the offload store decides its own put-off lookups
    and loads, so neither drawn put-offs nor a producer-only role go with it."""
    config = ArConfig(block_size=2, num_blocks=20, max_model_len=32)
    with pytest.raises(ConfigError, match=match):
        EngineCoreLoop(
            config, async_scheduling=False, kv_connector="recompute", kv_store=store, **flags
        )


def test_the_check_script_refuses_an_offload_store_with_drawn_lookups(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A usage error, exit 2 with one line, before any program runs."""
    script = load_script("vllm_async_check")
    argv = ["--programs", "1", "--kv-connector", "recompute", "--kv-store", "offload"]
    with pytest.raises(SystemExit) as leaving:
        script.main([*argv, "--kv-pending-lookups"])
    assert leaving.value.code == 2
    assert "--kv-store offload puts lookups off itself" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--kv-store-blocks", "4"], ["--kv-store", "offload", "--kv-store-blocks", "0"]],
)
def test_the_check_script_refuses_a_capacity_without_an_offload_store(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    """A capacity is the offload store's, and at least one block: else exit 2, one line."""
    script = load_script("vllm_async_check")
    with pytest.raises(SystemExit) as leaving:
        script.main(["--programs", "1", "--kv-connector", "recompute", *flags])
    assert leaving.value.code == 2
    assert "--kv-store-blocks: an int >= 1, with --kv-store offload" in capsys.readouterr().err


@pytest.mark.usefixtures("_vllm")
def test_the_check_script_runs_shared_prompt_programs_over_a_small_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--programs-from shared-prompts --kv-store offload --kv-store-blocks 4`, every fix: the
    programs pass, the line says the store's size, and the JSON records it with the store's
    evictions and refusals."""
    script = load_script("vllm_async_check")
    fixes = [f"--fix={fix.name}" for fix in KV_LOAD_FIXES.fixes]
    out = tmp_path / "store.json"
    argv = ["--programs", "12", "--programs-from", "shared-prompts", "--kv-connector"]
    argv += ["recompute", "--kv-store", "offload", "--kv-store-blocks", "4", "--json", str(out)]
    assert script.main([*argv, *fixes]) == 0
    assert "an offload store of 4 blocks" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["programs_from"] == "shared-prompts" and data["kv_store_blocks"] == 4
    counts = data["counts"]["async"]
    assert counts["blocks_evicted"] > 0 and counts["stores_refused"] > 0, counts
