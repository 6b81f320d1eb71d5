"""The content-addressed KV store (`integrations.vllm.offload_store.OffloadStore`): it holds what
finished requests stored, by block hash, and puts a lookup off while a block of its hit is
being stored or loaded for another request, as vLLM's offloading connector does; and vLLM's
connector path over it, in both loops of the engine core.

Needs vLLM installed (`schedspec install-engines vllm`) for the loop tests; skipped with
SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

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
from integrations.vllm.kv_load_fixes import apply_kv_load_fixes
from integrations.vllm.offload_store import OffloadStore
from spec.ar.config import ArConfig
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script

#: What `RemoteKv.execute` builds its report with (vLLM's `KVConnectorOutput`, by keywords).
_OUTPUTS = SimpleNamespace(KVConnectorOutput=lambda **fields: SimpleNamespace(**fields))


class _Req:
    """A request as the store reads it: an id, a prompt of `prompt` tokens with nothing
    generated, its full blocks' hashes, and a status (a finished one stopped)."""

    def __init__(self, rid: str, prompt: int, hashes: list[bytes]) -> None:
        self.request_id: str = rid
        self.num_prompt_tokens: int = prompt
        self.num_tokens: int = prompt
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
    assert store.stored == set(shared)
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
    store.stored.add(b"h0")
    assert store.remote_tokens(_Req("r0", 1, [b"h0"])) == 0
    assert store.remote_tokens(_Req("r1", 2, [b"h0", b"h1"])) == 1


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
@pytest.mark.parametrize(
    ("store", "flags", "match"),
    [
        ("nfs", {}, "invalid kv_store='nfs': one of draws, offload"),
        ("offload", {"kv_pending_lookups": True}, "draws with kv_pending_lookups or kv_role"),
        ("offload", {"kv_role": "kv_producer"}, "draws with kv_pending_lookups or kv_role"),
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
