"""Candidate fixes for the findings in Vidur 0.0.25's replica schedulers, made as edits of
Vidur's own files (`vidur/scheduler/replica_scheduler/`) and applied to the running process
so that the suite and the findings' programs validate the edited code itself.

One fix per finding of docs/engines/vidur.md ("Vidur", Findings):

- `ft-free-at-batch-end`: FasterTransformer frees a batch's memory when the whole batch has
  ended (`on_batch_end`), as FasterTransformer does and its profile declares
  (`free_at_batch_end`), but only the requests of the batch that ends: one that finished
  earlier was dropped when the batch was formed again (`_generate_next_batch_from_preempted`)
  and its ids never reach `_pending_free_map`, so its blocks are never freed. Carry them there,
  freed with the batch.
- `ft-free-on-finish` (an alternative, exclusive with the one above): free each request as it
  ends, which also drops the batch-end hold. It conforms (the declaration allows a hold and
  demands none) and decides as the twin with one stage, but not in a pipeline, where the hold
  changes what a new static batch admits while another is in flight.
- `reservation-ceil`: the max_model_len reservation of Orca and FasterTransformer is
  `max_tokens // block_size` (`BaseReplicaScheduler.__init__`), a block short when max_tokens is
  not a multiple of the block size; reserve the ceiling.
- `orca-batch-context`: Orca's `_get_next_batch` computes the attention context of a request
  it admits and never records it (`num_kv_tokens`), so the batch lists fewer contexts than
  requests and Vidur's time predictor, pairing them with `zip`, leaves those prefills out of the
  batch's attention time (`batch_context`, `integrations.vidur.batch_context`); record it.
- `lightllm-admit-at-peak`: LightLLM admits only while the peak need is `< num_blocks`
  (`_can_allocate_request`); a peak that equals the pool fits, so admit at `<=`.
- `lightllm-one-token-peak`: LightLLM counts a request not yet scheduled as holding prompt + 1
  tokens (`_get_tuple_tokens`), even when its only output needs no KV; count the + 1 only when
  a second output follows.
- `vllm-decode-block` (no finding: an idealisation the decision twins follow): Vidur's vLLM
  scheduler demands one free block for every running request (`_can_allocate_request`), as
  vLLM v0's `can_append_slot` does, which its profile declares (`preemption_may_empty_step`);
  demand only the block `_allocate_request` will take (one when the processed tokens outgrew
  the blocks held, else none).
- `micro-batch-floor`: Vidur's vLLM, Sarathi and Mnemosyne split `batch_size_cap` over the stages
  with a floor division, so with fewer seats than stages a micro-batch holds no request and
  nothing is ever scheduled; hold at least one (`integrations.vidur.pipeline` runs the stages).
- `mnemosyne-prefill-assert` (0.0.25 only): Mnemosyne asserts a prefill is incomplete whenever
  it counts processed tokens without sequence pipeline parallelism, which fails at the end of
  every prefill; drop the assertion, as 0.0.26 did.
- `mnemosyne-skip-frees`: Mnemosyne allocates a new request's whole prompt, then skips it when
  the batch has no tokens left for it, leaving it queued with the blocks; free them then.
- `mnemosyne-batch-order`: a `KVParallelBatch` lists its requests in a set's order (their
  addresses), which Mnemosyne's decode queue inherits; keep the order they were added in.
- `kvp-last-group-zero`: with KV parallelism, Mnemosyne tests the group it chose for a
  request's last, partial share with `if last_kvp_group_id:`, so group 0 reads as none chosen:
  the request is allocated one group short, its last share in the wrong group (fewer blocks
  than its prefill); test `is not None` (`integrations.vidur.pipeline` runs KV parallelism).
- `kvp-no-victim`: with KV parallelism, Mnemosyne makes room for a decode by restarting a
  queued request that holds blocks in the decode's last group; when none does, its loop never
  ends (the simulator hangs); restart the request itself then, as when the queue is empty.

`VIDUR_FIXES` (an `integrations.patches.FixSet`) makes the edits (`.fixed_sources`), gives them
as one patch (`.as_diff`, printed by `scripts/engine_fixes_diff.py vidur`), and runs Vidur with
them for the duration of a block (`.applied`, here `vidur_fixed(names)`). `FIXES_OF[kind]`
names the fixes a scheduler's findings need, and the edits under which it is compared with its
decision twin (vLLM's `vllm-decode-block`). Nothing of Vidur's is stored here but the
passages a fix anchors on.

On 0.0.26 (`SCHEDSPEC_VIDUR_VERSION`), `VIDUR_FIXES` holds `reservation-ceil` and
`vllm-decode-block` with 0.0.26's names for the block and pool sizes (`fixes_for`),
`orca-batch-context` and `micro-batch-floor` as they are, and the four
Mnemosyne fixes its code still needs: the other three fixes' schedulers are gone there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from contextlib import AbstractContextManager

from integrations.patches import EngineFix, FixSet, KnownFix
from integrations.vidur.engine import stubbed_imports
from integrations.vidur.manifest import DEFAULT_VERSION, VIDUR_VERSION

PACKAGE = "vidur.scheduler.replica_scheduler"
BASE = f"{PACKAGE}.base_replica_scheduler"
FT = f"{PACKAGE}.faster_transformer_replica_scheduler"
LIGHTLLM = f"{PACKAGE}.lightllm_replica_scheduler"
VLLM = f"{PACKAGE}.vllm_replica_scheduler"
SARATHI = f"{PACKAGE}.sarathi_replica_scheduler"
ORCA = f"{PACKAGE}.orca_replica_scheduler"
MNEMOSYNE = f"{PACKAGE}.mnemosyne_base_replica_scheduler"
KV_PARALLEL_BATCH = "vidur.entities.kv_parallel_batch"

FT_FREE_ON_FINISH = EngineFix(
    "ft-free-on-finish",
    (
        (
            FT,
            "        if batch.have_all_requests_completed:\n"
            "            # free memory for all requests at once\n"
            "            self.free_batch(batch)\n"
            "            self.free(*self._pending_free_map.pop(batch.id, []))\n"
            "        else:\n"
            "            self._preempted_batches.append(batch)\n",
            "        # free each request's memory as soon as it completes: a finished\n"
            "        # request must not hold blocks while the rest of its batch runs\n"
            "        for request in batch.requests:\n"
            "            if request.completed:\n"
            "                self.free(request.id)\n"
            "        if not batch.have_all_requests_completed:\n"
            "            self._preempted_batches.append(batch)\n",
        ),
    ),
    ((FT, "FasterTransformerReplicaScheduler.on_batch_end"),),
    "FasterTransformer: free each request as it finishes, not when its whole batch has",
)

FT_FREE_AT_BATCH_END = EngineFix(
    "ft-free-at-batch-end",
    (
        (
            FT,
            "        if not requests:\n"
            "            return\n"
            "\n"
            "        return Batch(self._replica_id, requests, num_q_tokens, num_kv_tokens)\n"
            "\n"
            "    def _get_next_batch(",
            "        if not requests:\n"
            "            return\n"
            "\n"
            "        # a request that finished keeps its blocks until the whole batch ends: carry\n"
            "        # its id to the batch formed again, whose end frees it (`on_batch_end`)\n"
            "        batch = Batch(self._replica_id, requests, num_q_tokens, num_kv_tokens)\n"
            "        finished = [r.id for r in preempted_batch.requests if r.completed]\n"
            "        carried = self._pending_free_map.pop(preempted_batch.id, [])\n"
            "        self._pending_free_map[batch.id] = carried + finished\n"
            "        return batch\n"
            "\n"
            "    def _get_next_batch(",
        ),
    ),
    ((FT, "FasterTransformerReplicaScheduler._generate_next_batch_from_preempted"),),
    "FasterTransformer: free a request that finished before its batch mates at the batch's end",
)

RESERVATION_CEIL = EngineFix(
    "reservation-ceil",
    (
        (
            BASE,
            "        self._max_blocks_per_sequence = (\n"
            "            self._request_generator_config.max_tokens"
            " // self._replica_config.block_size\n"
            "        )\n",
            "        # the ceiling: a sequence of max_tokens must fit in its reservation\n"
            "        self._max_blocks_per_sequence = -(\n"
            "            -self._request_generator_config.max_tokens\n"
            "            // self._replica_config.block_size\n"
            "        )\n",
        ),
    ),
    ((BASE, "BaseReplicaScheduler.__init__"),),
    "Orca, FasterTransformer: reserve the ceiling of max_tokens / block_size, not the floor",
)

LIGHTLLM_ADMIT_AT_PEAK = EngineFix(
    "lightllm-admit-at-peak",
    (
        (
            LIGHTLLM,
            "        return need_max_token_num < self._config.num_blocks\n",
            "        return need_max_token_num <= self._config.num_blocks\n",
        ),
    ),
    ((LIGHTLLM, "LightLLMReplicaScheduler._can_allocate_request"),),
    "LightLLM: admit a request whose peak equals the pool (<=, not <)",
)

LIGHTLLM_ONE_TOKEN_PEAK = EngineFix(
    "lightllm-one-token-peak",
    (
        (
            LIGHTLLM,
            "        else:\n"
            "            num_processed_tokens = request.num_prefill_tokens + 1\n"
            "            remaining_tokens = request.num_decode_tokens - 1 - 1\n",
            "        elif request.num_decode_tokens > 1:\n"
            "            num_processed_tokens = request.num_prefill_tokens + 1\n"
            "            remaining_tokens = request.num_decode_tokens - 1 - 1\n"
            "        else:\n"
            "            # its only output token is never fed back: it needs no KV\n"
            "            num_processed_tokens = request.num_prefill_tokens\n"
            "            remaining_tokens = 0\n",
        ),
    ),
    ((LIGHTLLM, "LightLLMReplicaScheduler._get_tuple_tokens"),),
    "LightLLM: a one-token request's peak is its prompt (its only output needs no KV)",
)

VLLM_DECODE_BLOCK = EngineFix(
    "vllm-decode-block",
    (
        (
            VLLM,
            "        # vllm requires at least one block to be available\n"
            "        return self._config.num_blocks - self._num_allocated_blocks >= 1\n",
            "        # a running request needs a block only when its tokens outgrew its\n"
            "        # blocks (what _allocate_request will take)\n"
            "        num_tokens_reserved = (\n"
            "            self._allocation_map[request.id] * self._replica_config.block_size\n"
            "        )\n"
            "        num_required_blocks = (\n"
            "            1 if request.num_processed_tokens > num_tokens_reserved else 0\n"
            "        )\n"
            "        return (\n"
            "            self._config.num_blocks - self._num_allocated_blocks"
            " >= num_required_blocks\n"
            "        )\n",
        ),
    ),
    ((VLLM, "VLLMReplicaScheduler._can_allocate_request"),),
    "vLLM: a running request needs a free block only when its tokens outgrew its blocks",
)


MNEMOSYNE_SKIP_FREES = EngineFix(
    "mnemosyne-skip-frees",
    (
        (
            MNEMOSYNE,
            "            if next_num_q_tokens == 0:\n",
            "            if next_num_q_tokens == 0:\n"
            "                if is_new_request:\n"
            "                    # no tokens for it in this batch: it stays queued, so it\n"
            "                    # must not keep the blocks just allocated to it\n"
            "                    self.free(request.id)\n",
        ),
    ),
    ((MNEMOSYNE, "MnemosyneBaseReplicaScheduler._add_prefill_requests"),),
    "Mnemosyne: a new request the batch has no tokens for gives back the blocks just taken",
)


_MICRO_BATCH_LINE = (
    "        self._max_micro_batch_size = self._config.batch_size_cap // self._num_stages\n"
)
_MICRO_BATCH_FLOOR = (
    "        # at least one request a micro-batch: with fewer seats than stages the floor\n"
    "        # division gives 0, and no batch could ever be formed\n"
    "        self._max_micro_batch_size = max(\n"
    "            1, self._config.batch_size_cap // self._num_stages\n"
    "        )\n"
)

MICRO_BATCH_FLOOR = EngineFix(
    "micro-batch-floor",
    (
        (VLLM, _MICRO_BATCH_LINE, _MICRO_BATCH_FLOOR),
        (SARATHI, _MICRO_BATCH_LINE, _MICRO_BATCH_FLOOR),
        (MNEMOSYNE, _MICRO_BATCH_LINE, _MICRO_BATCH_FLOOR),
    ),
    (
        (VLLM, "VLLMReplicaScheduler.__init__"),
        (SARATHI, "SarathiReplicaScheduler.__init__"),
        (MNEMOSYNE, "MnemosyneBaseReplicaScheduler.__init__"),
    ),
    "vLLM, Sarathi, Mnemosyne: a micro-batch holds at least one request when "
    "batch_size_cap < stages",
)

ORCA_BATCH_CONTEXT = EngineFix(
    "orca-batch-context",
    (
        (
            ORCA,
            "            num_q_tokens.append(next_num_q_tokens)\n\n        if not requests:\n",
            "            num_q_tokens.append(next_num_q_tokens)\n"
            "            # the predictor pairs num_kv_tokens with the requests: one each\n"
            "            num_kv_tokens.append(next_num_kv_tokens)\n"
            "\n"
            "        if not requests:\n",
        ),
    ),
    ((ORCA, "OrcaReplicaScheduler._get_next_batch"),),
    "Orca: record the attention context of a request it admits (num_kv_tokens), as of a decode",
)

MNEMOSYNE_PREFILL_ASSERT = EngineFix(
    "mnemosyne-prefill-assert",
    (
        (
            MNEMOSYNE,
            "        else:\n"
            "            assert not request.is_prefill_complete\n"
            "            return request.num_processed_tokens\n",
            "        else:\n"
            "            # a request's prefill completes without sequence pipeline parallelism\n"
            "            # too (on_batch_end reads its processed tokens then)\n"
            "            return request.num_processed_tokens\n",
        ),
    ),
    ((MNEMOSYNE, "MnemosyneBaseReplicaScheduler._get_num_processed_tokens"),),
    "Mnemosyne (0.0.25): drop the assertion that fails at the end of every prefill "
    "(0.0.26 dropped it too)",
)

KVP_LAST_GROUP_ZERO = EngineFix(
    "kvp-last-group-zero",
    (
        (
            MNEMOSYNE,
            "        if last_kvp_group_id:\n",
            "        # group 0 may be the last group's: test for none chosen, not for 0\n"
            "        if last_kvp_group_id is not None:\n",
        ),
    ),
    ((MNEMOSYNE, "MnemosyneBaseReplicaScheduler._allocate_request"),),
    "Mnemosyne: with KV parallelism, a request's last, partial share may go to group 0",
)

KVP_NO_VICTIM = EngineFix(
    "kvp-no-victim",
    (
        (
            MNEMOSYNE,
            "                    could_ensure_memory = True\n"
            "                    break\n"
            "            else:\n",
            "                    could_ensure_memory = True\n"
            "                    break\n"
            "                else:\n"
            "                    # no queued request holds blocks in that group, so no restart\n"
            "                    # frees one there: restart the request itself, as when the\n"
            "                    # queue is empty (else this loop never ends)\n"
            "                    request.restart()\n"
            "                    self.free(request.id)\n"
            "                    self.add_request(request)\n"
            "                    could_ensure_memory = False\n"
            "                    break\n"
            "            else:\n",
        ),
    ),
    ((MNEMOSYNE, "MnemosyneBaseReplicaScheduler._ensure_can_append_slot"),),
    "Mnemosyne: with KV parallelism, a decode whose last group no queued request holds "
    "restarts itself instead of looping for ever",
)

MNEMOSYNE_BATCH_ORDER = EngineFix(
    "mnemosyne-batch-order",
    (
        (
            KV_PARALLEL_BATCH,
            "        self._requests = list(\n"
            "            set(sum([x.requests for x in self._batch_mapping.values()], []))\n"
            "        )\n",
            "        # without duplicates, in the order the scheduler added them: a set's\n"
            "        # order follows the objects' addresses, which differ from run to run\n"
            "        self._requests = list(\n"
            "            dict.fromkeys(\n"
            "                sum([x.requests for x in self._batch_mapping.values()], [])\n"
            "            )\n"
            "        )\n",
        ),
    ),
    ((KV_PARALLEL_BATCH, "KVParallelBatch.__init__"),),
    "Mnemosyne: a KV-parallel batch keeps its requests in the order they were added",
)


def _load_vidur() -> object:
    from integrations.vidur.engine import load

    return load()


# 0.0.26 reads the block size and the pool size from its CacheConfig: the same lines otherwise
_CACHE_CONFIG_RENAMES = (
    ("self._replica_config.block_size", "self._cache_config.block_size"),
    ("self._config.num_blocks", "self._cache_config.num_blocks"),
)


def _for_cache_config(fix: EngineFix) -> EngineFix:
    """`fix` with its anchors and edits renamed as 0.0.26 names the block and pool sizes."""

    def renamed(text: str) -> str:
        for old, new in _CACHE_CONFIG_RENAMES:
            text = text.replace(old, new)
        return text

    edits = tuple((module, renamed(old), renamed(new)) for module, old, new in fix.edits)
    return dataclasses.replace(fix, edits=edits)


def fixes_for(version: str) -> FixSet:
    """The fixes of Vidur `version` (one of `KINDS_OF`): all thirteen on 0.0.25; on 0.0.26, which
    dropped LightLLM and FasterTransformer, the two whose schedulers remain, renamed,
    `orca-batch-context`, `micro-batch-floor` and Mnemosyne's four (0.0.26 dropped the prefill
    assertion itself)."""
    if version == DEFAULT_VERSION:
        return FixSet(
            engine=f"Vidur {version}",
            modules=(BASE, FT, LIGHTLLM, VLLM, SARATHI, ORCA, MNEMOSYNE, KV_PARALLEL_BATCH),
            fixes=(
                FT_FREE_AT_BATCH_END,
                FT_FREE_ON_FINISH,
                RESERVATION_CEIL,
                ORCA_BATCH_CONTEXT,
                LIGHTLLM_ADMIT_AT_PEAK,
                LIGHTLLM_ONE_TOKEN_PEAK,
                VLLM_DECODE_BLOCK,
                MICRO_BATCH_FLOOR,
                MNEMOSYNE_PREFILL_ASSERT,
                # 0.0.25 forms the prefills in `_get_next_batch` itself
                dataclasses.replace(
                    MNEMOSYNE_SKIP_FREES,
                    methods=((MNEMOSYNE, "MnemosyneBaseReplicaScheduler._get_next_batch"),),
                ),
                MNEMOSYNE_BATCH_ORDER,
                KVP_LAST_GROUP_ZERO,
                KVP_NO_VICTIM,
            ),
            # both mend FasterTransformer's frees: the second frees at the finish what the
            # first carries to the batch's end (Vidur's `free` of a freed id is a KeyError)
            exclusive=(frozenset({FT_FREE_AT_BATCH_END.name, FT_FREE_ON_FINISH.name}),),
            load=_load_vidur,
            importing=stubbed_imports,
        )
    return FixSet(
        engine=f"Vidur {version}",
        modules=(BASE, VLLM, SARATHI, ORCA, MNEMOSYNE, KV_PARALLEL_BATCH),
        fixes=(
            _for_cache_config(RESERVATION_CEIL),
            ORCA_BATCH_CONTEXT,
            _for_cache_config(VLLM_DECODE_BLOCK),
            MICRO_BATCH_FLOOR,
            MNEMOSYNE_SKIP_FREES,
            MNEMOSYNE_BATCH_ORDER,
            KVP_LAST_GROUP_ZERO,
            KVP_NO_VICTIM,
        ),
        exclusive=(),
        load=_load_vidur,
        importing=stubbed_imports,
    )


#: The fixes of the release this process runs (`SCHEDSPEC_VIDUR_VERSION`).
VIDUR_FIXES = fixes_for(VIDUR_VERSION)

#: What `scripts/engine_fixes_diff.py vidur` prints by default: every fix but `ft-free-on-finish`,
#: the alternative that edits what `ft-free-at-batch-end`, FasterTransformer's finding's fix,
#: edits.
DEFAULT_FIXES: tuple[str, ...] = tuple(
    name for name in VIDUR_FIXES.names if name != FT_FREE_ON_FINISH.name
)

#: The fixes each scheduler's findings need (Sarathi has none), and for vLLM the idealisation
#: its decision twins follow (`vllm-decode-block`; the release's restart is declared).
FIXES_OF: dict[str, tuple[str, ...]] = {
    "vllm": (VLLM_DECODE_BLOCK.name,),
    "sarathi": (),
    "orca": (RESERVATION_CEIL.name, ORCA_BATCH_CONTEXT.name),
    "lightllm": (LIGHTLLM_ADMIT_AT_PEAK.name, LIGHTLLM_ONE_TOKEN_PEAK.name),
    "ft": (FT_FREE_AT_BATCH_END.name, RESERVATION_CEIL.name),
    # the prefill assertion is 0.0.25's alone (0.0.26 dropped it itself)
    "mnemosyne": tuple(
        fix.name
        for fix in (MNEMOSYNE_PREFILL_ASSERT, MNEMOSYNE_SKIP_FREES, MNEMOSYNE_BATCH_ORDER)
        if fix.name in VIDUR_FIXES.names
    ),
}


#: The fixes a pipelined scheduler's findings need (`integrations.vidur.pipeline`): its
#: one-stage fixes, for Mnemosyne `kvp-last-group-zero` and `kvp-no-victim` (its KV parallelism
#: runs there), and for
#: vLLM, Sarathi and Mnemosyne `micro-batch-floor` (last).
PIPELINE_FIXES_OF: dict[str, tuple[str, ...]] = {
    "vllm": (*FIXES_OF["vllm"], MICRO_BATCH_FLOOR.name),
    "sarathi": (*FIXES_OF["sarathi"], MICRO_BATCH_FLOOR.name),
    "orca": FIXES_OF["orca"],
    "ft": FIXES_OF["ft"],
    "mnemosyne": (
        *FIXES_OF["mnemosyne"],
        KVP_LAST_GROUP_ZERO.name,
        KVP_NO_VICTIM.name,
        MICRO_BATCH_FLOOR.name,
    ),
}


#: The edits that are no finding's fix: idealisations the twins follow or an alternative.
NOT_FINDING_FIXES = frozenset(
    {
        VLLM_DECODE_BLOCK.name,
        LIGHTLLM_ADMIT_AT_PEAK.name,
        LIGHTLLM_ONE_TOKEN_PEAK.name,
        FT_FREE_ON_FINISH.name,
    }
)


#: The rules each finding's fix removes a failure of, in the one-stage AR suite (with a
#: decision twin, `twin_decisions` for a finding that changes what is scheduled or allocated).
FINDING_RULES: dict[str, frozenset[str]] = {
    FT_FREE_AT_BATCH_END.name: frozenset({"terminal_holds_nothing"}),
    RESERVATION_CEIL.name: frozenset({"kv_covers_scheduled", "twin_decisions"}),
    ORCA_BATCH_CONTEXT.name: frozenset({"batch_context"}),
    MNEMOSYNE_PREFILL_ASSERT.name: frozenset({"implementation_error"}),
    MNEMOSYNE_SKIP_FREES.name: frozenset({"waiting_holds_nothing"}),
    # the decode order follows the requests' addresses: another victim on a replay
    MNEMOSYNE_BATCH_ORDER.name: frozenset(
        {"preemption_victim", "nondeterministic", "twin_decisions"}
    ),
}


#: What a finding's failure says, for a rule any bug can break: Mnemosyne's
#: `implementation_error` is its prefill assertion, not any crash.
FINDING_MESSAGES: dict[str, str] = {
    "implementation_error": r"AssertionError: assert not request.is_prefill_complete"
}


def known_fixes(impl: str) -> tuple[KnownFix, ...]:
    """The fixes of the findings of built-in `impl` (`real-vidur-<kind>`) on the release this
    process runs, each with the rules its finding breaks, as `schedspec verify` tries them on
    a failure; none for another name."""
    kind = impl.removeprefix("real-vidur-")
    return VIDUR_FIXES.known(
        {
            name: FINDING_RULES[name]
            for name in FIXES_OF.get(kind, ())
            if name not in NOT_FINDING_FIXES and name in VIDUR_FIXES.names
        },
        by_design=[RESERVATION_CEIL.name],  # it reserves one block more: that is the fix
        messages=FINDING_MESSAGES,
    )


def vidur_fixed(names: Iterable[str]) -> AbstractContextManager[None]:
    """`with vidur_fixed(names):` runs Vidur with the named fixes (`FixSet.applied`)."""
    return VIDUR_FIXES.applied(names)


__all__ = [
    "DEFAULT_FIXES",
    "FINDING_MESSAGES",
    "FINDING_RULES",
    "FIXES_OF",
    "FT_FREE_AT_BATCH_END",
    "FT_FREE_ON_FINISH",
    "KVP_LAST_GROUP_ZERO",
    "KVP_NO_VICTIM",
    "LIGHTLLM_ADMIT_AT_PEAK",
    "LIGHTLLM_ONE_TOKEN_PEAK",
    "MICRO_BATCH_FLOOR",
    "MNEMOSYNE_BATCH_ORDER",
    "MNEMOSYNE_PREFILL_ASSERT",
    "MNEMOSYNE_SKIP_FREES",
    "NOT_FINDING_FIXES",
    "ORCA_BATCH_CONTEXT",
    "PIPELINE_FIXES_OF",
    "RESERVATION_CEIL",
    "VIDUR_FIXES",
    "VLLM_DECODE_BLOCK",
    "fixes_for",
    "known_fixes",
    "vidur_fixed",
]
