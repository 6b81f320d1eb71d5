"""Candidate fixes for SGLang 0.5.23's dLLM scheduler path, made as edits of SGLang's own files
and applied to the running process so that the suite and the findings' programs validate the
edited code itself.

Each fix answers one finding of docs/engines/sglang.md ("SGLang 0.5.23", Findings); the five of
`FIXES`, together, let the dLLM suite run with no pool headroom and fewer rows than seats:

- `refused-stays-incoming` (the ragged row's cause): `process_dllm_incoming_reqs` runs
  `init_next_round_input` before the adder decides, which moves the request to a staging phase;
  a request the adder refuses keeps the round state it had, so it is offered again as incoming.
- `worst-case-estimate` (an idle engine runs a round admitting nothing though a request fits):
  the adder counts a dLLM request as what it can claim in all, its prompt and max_new_tokens in
  whole blocks, less its prefix, and admits an exact fit (a request with `ignore_eos` too,
  which SGLang otherwise estimates on a path of its own, `add_one_req_ignore_eos`); and it
  charges an admitted dLLM request no page for allocation rounding (`per_req_token_overhead`),
  which a page-aligned block never needs, so a round admits every request that fits, not one
  page's worth fewer each.
- `reserve-future-blocks` (KV pressure overcommits, then `Prefill out of memory`): an incoming
  request is admitted only when the free KV, less what the requests holding a row can still
  claim, covers its own claim.
- `decode-fallback` (a refused prefill request starves the decode request): when the prefill
  pass forms no batch, the requests holding a row and the incoming ones queued ahead of the
  first prefill request decode instead (PREFILL_FIRST's order kept).
- `whole-staged-blocks` (staging truncates a running request's block): a staged request's next
  block is whole or waits, checked against the KV the pass leaves free and charged only the KV
  it newly takes.

Two more, outside the set: `decode-fallback-any-order`, the fallback's first version, which
offers every decode request and is refuted by the suite (a shorter prompt passes a whole prompt
block); and `cap-fallback-budget`, a fix of the ragged row's symptom
(`_get_dllm_remain_tokens` keeping its block-size cap when its budget is used up).

And one for an ordered queue (priority scheduling, `--schedule-policy lof`), which the five
leave as it is:

- `priority-window` (a fetched request keeps its place against a later arrival sorted ahead of
  it: a higher priority, or under lof a longer output): whenever `calc_priority` orders the
  queue (`--enable-priority-scheduling`, or a schedule policy other than FCFS), the requests
  the dLLM manager holds without a row (fetched by `_fetch_waiting_reqs`, never admitted) go
  back to the head of the waiting queue before `calc_priority` sorts it, so they are sorted
  again with later arrivals and the window is the head of the queue's order every round (at
  the head, where they were: lof's stable sort then keeps ties in arrival order; the priority
  sort breaks ties by entry time anyway). Under FCFS nothing changes.

`SGLANG_FIXES` holds all eight (an `integrations.patches.FixSet`): `.fixed_sources(names)`
makes the chosen fixes' edits to the installed files' text (`FixDoesNotApply` if a place they
edit is missing), `.as_diff(names)` gives them as one patch (`scripts/engine_fixes_diff.py
sglang` prints it), and `.applied(names)`, here `sglang_fixed(names)`, runs the edited files,
each as a module of its own, and puts the methods the fixes change or add on SGLang's classes
for the duration of the block (new module-level names go on SGLang's modules, and the methods
read SGLang's own module globals, so its enums and classes stay the ones everything else
uses). Nothing of SGLang's is stored here but the passages a fix anchors on.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager

from integrations.patches import EngineFix, FixSet, KnownFix
from integrations.sglang.engine import import_engine, quiet_stubbed_imports
from integrations.sglang.witness import staged_block_cut, staged_without_a_row

POLICY = "sglang.srt.managers.schedule_policy"
MIXIN = "sglang.srt.dllm.mixin.scheduler"
#: The files the fixes edit, in the order they are run (the mixin imports from the policy).
MODULES = (POLICY, MIXIN)


# ---------------------------------------------------------------- shared by two fixes
_CLAIM = (
    POLICY,
    "\n\nclass PrefillAdder:\n",
    '''

def dllm_claim_tokens(req: Req, block_size: int) -> int:
    """The KV a dLLM request can claim in all: its prompt and max_new_tokens,
    in whole blocks (its mask blocks are part of max_new_tokens)."""
    total = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
    return -(-total // block_size) * block_size


class PrefillAdder:
''',
)

# ---------------------------------------------------------------- refused-stays-incoming
_REFUSED = (
    (
        MIXIN,
        "logger = logging.getLogger(__name__)\n",
        "logger = logging.getLogger(__name__)\n"
        "\n"
        "# What init_next_round_input changes on a request before the adder decides.\n"
        "_DLLM_ROUND_STATE = (\n"
        '    "dllm_phase",\n'
        '    "dllm_block_offset",\n'
        '    "dllm_initialized",\n'
        '    "full_untruncated_fill_ids",\n'
        '    "extend_end",\n'
        ")\n",
    ),
    (
        MIXIN,
        "            # Prepare and add request\n"
        "            req.init_next_round_input(self.tree_cache)\n"
        "            res = adder.add_one_req(\n"
        "                req,\n"
        "                has_chunked_req=True,\n"
        "                truncation_align_size=self.truncation_align_size,\n"
        "            )\n",
        "            # Prepare and add request. A refused request keeps the round state\n"
        "            # it had, so it is offered again as incoming, not as staging.\n"
        "            saved = {name: getattr(req, name) for name in _DLLM_ROUND_STATE}\n"
        "            req.init_next_round_input(self.tree_cache)\n"
        "            res = adder.add_one_req(\n"
        "                req,\n"
        "                has_chunked_req=True,\n"
        "                truncation_align_size=self.truncation_align_size,\n"
        "            )\n"
        "            if all(admitted is not req for admitted in adder.can_run_list):\n"
        "                for name, value in saved.items():\n"
        "                    setattr(req, name, value)\n",
    ),
)

# ---------------------------------------------------------------- worst-case-estimate
_ESTIMATE = (
    _CLAIM,
    (
        POLICY,
        '        """Select a prefill shape without allocating or publishing cached KV."""\n',
        '        """Select a prefill shape without allocating or publishing cached KV."""\n'
        "        if self.dllm_config is not None:\n"
        "            # A dLLM request claims at most its prompt and max_new_tokens in\n"
        "            # whole blocks, less its prefix: a block-aligned request needs no\n"
        "            # extra page. Minus one: the budget admits total_tokens < remaining,\n"
        "            # and an exact fit must be admitted.\n"
        "            total_tokens = (\n"
        "                dllm_claim_tokens(req, self.dllm_config.block_size) - req.prefix_len - 1\n"
        "            )\n",
    ),
    (
        POLICY,
        '        if req.sampling_params.ignore_eos and getattr(self.tree_cache, "disable", True):\n'
        "            return self.add_one_req_ignore_eos(req)\n",
        "        # A dLLM request is estimated at its worst case (below) whether or not it\n"
        "        # ignores EOS: the ignore-EOS path's own estimate refuses one that fits.\n"
        "        if (\n"
        "            req.sampling_params.ignore_eos\n"
        '            and getattr(self.tree_cache, "disable", True)\n'
        "            and self.dllm_config is None\n"
        "        ):\n"
        "            return self.add_one_req_ignore_eos(req)\n",
    ),
    (
        POLICY,
        "            else self.page_size\n        )\n",
        "            else self.page_size\n"
        "        )\n"
        "        if self.dllm_config is not None and not self.kv_shard_granule:\n"
        "            # dLLM allocates whole blocks, page-aligned: an admission needs no\n"
        "            # rounding page, so it is charged what it allocates.\n"
        "            self.per_req_token_overhead = 0\n",
    ),
)

# ---------------------------------------------------------------- reserve-future-blocks
_RESERVE = (
    _CLAIM,
    (
        MIXIN,
        "from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder\n",
        "from sglang.srt.managers.schedule_policy import (\n"
        "    AddReqResult,\n"
        "    PrefillAdder,\n"
        "    dllm_claim_tokens,\n"
        ")\n",
    ),
    (
        MIXIN,
        "    def process_dllm_incoming_reqs(\n",
        "    def _dllm_kv_free_after_reservations(self: Scheduler) -> int:\n"
        '        """Free KV (evictable cache included) less what the requests holding a\n'
        '        row can still claim."""\n'
        "        block_size = self.dllm_config.block_size\n"
        "        claimed = sum(\n"
        "            dllm_claim_tokens(req, block_size) - req.kv.kv_allocated_len\n"
        "            for req in self.dllm_manager.waiting_queue\n"
        "            if req.kv.req_pool_idx is not None\n"
        "        )\n"
        "        # cached blocks the radix cache can evict are free to an allocation\n"
        "        free = self.token_to_kv_pool_allocator.available_size()\n"
        "        free += self.tree_cache.full_evictable_size()\n"
        "        return free - claimed\n"
        "\n"
        "    def process_dllm_incoming_reqs(\n",
    ),
    (
        MIXIN,
        "        res = AddReqResult.CONTINUE\n"
        "        for req in reqs:\n"
        "            # Check if batch is full\n",
        "        res = AddReqResult.CONTINUE\n"
        "        # What the running requests can still claim stays theirs: admit a\n"
        "        # request only when the rest covers its own claim.\n"
        "        free = self._dllm_kv_free_after_reservations()\n"
        "        for req in reqs:\n"
        "            claim = dllm_claim_tokens(req, self.dllm_config.block_size)\n"
        "            if claim > free:\n"
        "                res = AddReqResult.NO_TOKEN\n"
        "                break\n"
        "            free -= claim\n"
        "\n"
        "            # Check if batch is full\n",
    ),
)


# ---------------------------------------------------------------- decode-fallback
def _fallback(offered: str) -> tuple[tuple[str, str, str], ...]:
    """The fallback to the decode batch when the prefill pass forms none, offering `offered`."""
    pass_ = (
        "            self._process_batch_by_phase(\n"
        "                adder,\n"
        "                prefill_reqs,\n"
        "                DllmReqPhase.STAGING_PREFILL,\n"
        "                DllmReqPhase.INCOMING_PREFILL,\n"
        "                running_batch=running_batch,\n"
        "            )\n"
    )
    return (
        (
            MIXIN,
            pass_,
            pass_ + "            if not adder.can_run_list:\n"
            "                # The prefill pass formed no batch: decode instead, so a\n"
            "                # request that cannot start does not stall the running ones.\n"
            "                self._process_batch_by_phase(\n"
            "                    adder,\n"
            f"                    {offered},\n"
            "                    DllmReqPhase.STAGING_DECODE,\n"
            "                    DllmReqPhase.INCOMING_DECODE,\n"
            "                    running_batch=running_batch,\n"
            "                )\n"
            "                return ForwardMode.DLLM_EXTEND\n",
        ),
    )


_IN_ORDER = (
    MIXIN,
    "    def _process_batch_by_phase(\n",
    "    def _dllm_decode_fallback_reqs(self: Scheduler) -> List[Req]:\n"
    '        """The decode requests a fallback offers: those holding a row, and the\n'
    "        incoming ones queued ahead of the first prefill request (PREFILL_FIRST\n"
    '        lets a whole prompt block pass shorter prompts, never the reverse)."""\n'
    "        queue = self.dllm_manager.waiting_queue\n"
    "        first_prefill = next(\n"
    "            (i for i, req in enumerate(queue) if req.is_dllm_prefill()), len(queue)\n"
    "        )\n"
    "        return [\n"
    "            req\n"
    "            for i, req in enumerate(queue)\n"
    "            if not req.is_dllm_prefill()\n"
    "            and (req.dllm_phase == DllmReqPhase.STAGING_DECODE or i < first_prefill)\n"
    "        ]\n"
    "\n"
    "    def _process_batch_by_phase(\n",
)

# ---------------------------------------------------------------- whole-staged-blocks
_WHOLE = (
    (
        POLICY,
        "    def add_dllm_staging_req(self, req: Req):\n"
        "        assert self.dllm_config is not None\n",
        "    def _add_whole_dllm_staging_block(self, req: Req):\n"
        '        """A staged request\'s next block, whole or not at all: checked against\n'
        "        the KV this pass leaves free and charged only the KV it newly takes (a\n"
        "        block kept in place takes none). Its later blocks are not charged again:\n"
        '        they were counted when it was admitted."""\n'
        "        extend = min(\n"
        "            len(req.full_untruncated_fill_ids) - req.prefix_len, self.dllm_block_size\n"
        "        )\n"
        "        end = req.prefix_len + extend\n"
        "        held = req.kv.kv_allocated_len if req.kv.holds_kv else 0\n"
        "        new_kv = max(0, self.ceil_paged_tokens(end) - self.ceil_paged_tokens(held))\n"
        "        if (\n"
        "            extend <= 0\n"
        "            or extend > self.rem_dllm_tokens\n"
        "            or new_kv > self.rem_total_tokens\n"
        "        ):\n"
        "            return AddReqResult.NO_TOKEN\n"
        "        req.extend_end = end\n"
        "        self.can_run_list.append(req)\n"
        "        self.rem_dllm_tokens -= self.ceil_paged_tokens(extend)\n"
        "        self.memory_budget.total_offset += new_kv\n"
        "        self.memory_budget.current_offset += new_kv\n"
        "        return AddReqResult.CONTINUE\n"
        "\n"
        "    def add_dllm_staging_req(self, req: Req):\n"
        "        assert self.dllm_config is not None\n"
        "        if not self.dllm_config.requires_separate_context_encoding:\n"
        "            return self._add_whole_dllm_staging_block(req)\n",
    ),
)

# ---------------------------------------------------------------- cap-fallback-budget
_CAP = (
    (
        POLICY,
        "        if _rem_tokens <= 0:\n            _rem_tokens = self.rem_dllm_tokens\n",
        "        if _rem_tokens <= 0:\n"
        "            # Still at most one block: a short prompt's fill ids are the prompt\n"
        "            # and a whole mask block, which must not make one row.\n"
        "            _rem_tokens = min(self.rem_dllm_tokens, self.dllm_block_size)\n",
    ),
)

# ---------------------------------------------------------------- priority-window
_PRIORITY_WINDOW = (
    (
        MIXIN,
        "        running_bs = len(running_batch.reqs)\n"
        "        self.policy.calc_priority(self.waiting_queue)\n",
        "        running_bs = len(running_batch.reqs)\n"
        '        if self.enable_priority_scheduling or self.policy.policy.value != "fcfs":\n'
        "            # The queue has an order of its own (priority, lof, ...): requests\n"
        "            # fetched but never admitted are sorted again with later arrivals, which\n"
        "            # may take their place in the window. They go back to the head, where\n"
        "            # they were, so a stable sort keeps ties in arrival order.\n"
        "            self.waiting_queue[:0] = self.dllm_manager.pop_unadmitted_reqs()\n"
        "        self.policy.calc_priority(self.waiting_queue)\n",
    ),
    (
        MIXIN,
        "    def filter_finished_reqs(self) -> None:\n",
        "    def pop_unadmitted_reqs(self) -> List[Req]:\n"
        '        """Remove and return the waiting requests that hold no row (never admitted)."""\n'
        "        unadmitted = [req for req in self.waiting_queue if not req.kv.holds_kv]\n"
        "        self.waiting_queue = [req for req in self.waiting_queue if req.kv.holds_kv]\n"
        "        return unadmitted\n"
        "\n"
        "    def filter_finished_reqs(self) -> None:\n",
    ),
)

_INCOMING = (MIXIN, "SchedulerDllmMixin.process_dllm_incoming_reqs")
_BATCHES = (MIXIN, "SchedulerDllmMixin._process_dllm_batches")

REFUSED_STAYS_INCOMING = EngineFix(
    "refused-stays-incoming",
    _REFUSED,
    (_INCOMING,),
    "ragged rows: a request the adder refuses keeps its incoming state",
)
WORST_CASE_ESTIMATE = EngineFix(
    "worst-case-estimate",
    _ESTIMATE,
    (
        (POLICY, "PrefillAdder._select_prefill_admission"),
        (POLICY, "PrefillAdder.add_one_req"),
        (POLICY, "PrefillAdder.__init__"),
    ),
    "an idle engine admits nothing: estimate a request as its prompt and max_new_tokens in "
    "whole blocks (with or without ignore_eos), admit an exact fit, and charge no rounding page",
)
RESERVE_FUTURE_BLOCKS = EngineFix(
    "reserve-future-blocks",
    _RESERVE,
    ((MIXIN, "SchedulerDllmMixin._dllm_kv_free_after_reservations"), _INCOMING),
    "KV pressure: admit only while the free KV, less what the running requests can still "
    "claim, covers the request's claim",
)
DECODE_FALLBACK = EngineFix(
    "decode-fallback",
    (_IN_ORDER, *_fallback("self._dllm_decode_fallback_reqs()")),
    ((MIXIN, "SchedulerDllmMixin._dllm_decode_fallback_reqs"), _BATCHES),
    "starvation: when the prefill pass forms no batch, decode the requests holding a row and "
    "the incoming ones ahead of the first prefill request",
)
WHOLE_STAGED_BLOCKS = EngineFix(
    "whole-staged-blocks",
    _WHOLE,
    (
        (POLICY, "PrefillAdder._add_whole_dllm_staging_block"),
        (POLICY, "PrefillAdder.add_dllm_staging_req"),
    ),
    "staging truncation: a staged request's next block is whole or waits",
)
DECODE_FALLBACK_ANY_ORDER = EngineFix(
    "decode-fallback-any-order",
    _fallback("self.dllm_manager.get_decode_requests()"),
    (_BATCHES,),
    "refuted (fcfs_admission): decode-fallback offering every decode request",
)
CAP_FALLBACK_BUDGET = EngineFix(
    "cap-fallback-budget",
    _CAP,
    ((POLICY, "PrefillAdder._get_dllm_remain_tokens"),),
    "the ragged rows' symptom: _get_dllm_remain_tokens keeps its block-size cap",
)

PRIORITY_WINDOW = EngineFix(
    "priority-window",
    _PRIORITY_WINDOW,
    (
        (MIXIN, "SchedulerDllmMixin.get_new_batch_dllm"),
        (MIXIN, "DllmManager.pop_unadmitted_reqs"),
    ),
    "priority inversion: under priority scheduling or lof (any order calc_priority applies), "
    "requests fetched but never admitted are sorted again with later arrivals every round",
)

#: The five fixes that, together, let the suite run with no pool headroom, in the order their
#: edits are made.
FIXES = (
    REFUSED_STAYS_INCOMING,
    WORST_CASE_ESTIMATE,
    RESERVE_FUTURE_BLOCKS,
    DECODE_FALLBACK,
    WHOLE_STAGED_BLOCKS,
)
FIX_NAMES = tuple(fix.name for fix in FIXES)


#: Every fix: the five, then the refuted fallback, the symptom fix and the priority fix.
SGLANG_FIXES = FixSet(
    engine="SGLang 0.5.23",
    modules=MODULES,
    fixes=(*FIXES, DECODE_FALLBACK_ANY_ORDER, CAP_FALLBACK_BUDGET, PRIORITY_WINDOW),
    exclusive=(frozenset({DECODE_FALLBACK.name, DECODE_FALLBACK_ANY_ORDER.name}),),
    load=import_engine,
    importing=quiet_stubbed_imports,
)


#: The rules each finding's fix removes a failure of, in the dLLM suite (docs/engines/sglang.md's
#: findings table): the idle engine and the starved decode request break `progress`, the
#: overcommitted pool `Prefill out of memory` (`implementation_error`) or, with both running
#: requests waiting for a block, `progress`; the ragged row and the truncated staged block
#: `whole_block_alloc`, and a staging pass of one-token blocks, which has nothing to truncate,
#: allocates past the free KV (`Out of memory`, `implementation_error`); the sticky window of
#: an ordered queue `fcfs_admission`.
FINDING_RULES: dict[str, frozenset[str]] = {
    # the staging path a refused request re-enters by lacks the incoming path's checks: its
    # row is prompt + a whole mask block, past the estimate that refused it it overcommits the
    # KV, and with fewer rows than seats it takes a row there is not
    REFUSED_STAYS_INCOMING.name: frozenset({"whole_block_alloc", "implementation_error"}),
    # with `--twin sglang-dllm-order`, whose estimate admits a request that fits, the idle
    # engine's refusal shows first as the twin admitting more
    WORST_CASE_ESTIMATE.name: frozenset({"progress", "twin_decisions"}),
    RESERVE_FUTURE_BLOCKS.name: frozenset({"implementation_error", "progress"}),
    DECODE_FALLBACK.name: frozenset({"progress"}),
    # inside the declared headroom too; truncated to nothing, a ready block waits a round,
    # which a decision twin of SGLang's order (`--twin sglang-dllm-order`) does not do
    WHOLE_STAGED_BLOCKS.name: frozenset(
        {"whole_block_alloc", "implementation_error", "twin_decisions"}
    ),
    PRIORITY_WINDOW.name: frozenset({"fcfs_admission"}),
}

#: What a finding's failure says, for a rule any bug can break: an `implementation_error` of
#: the five is SGLang running out of KV (`Prefill out of memory`, `Out of memory`) or, with
#: fewer rows than seats, of request rows (`alloc_req_slots runs out of memory`), not any crash.
FINDING_MESSAGES: dict[str, str] = {
    "implementation_error": (
        r"RuntimeError: ((Prefill )?[Oo]ut of memory|alloc_req_slots runs out of memory)"
    )
}

#: The fixes that change what the adder admits, by design: an exact fit earlier (the
#: estimate), an overcommit not at all (the reservation), a refused request not through the
#: staging path (kept incoming), a staged block charged only the KV it newly takes (whole
#: staged blocks, which leaves room for an admission sooner).
ADMIT_OTHERWISE = (
    WORST_CASE_ESTIMATE.name,
    RESERVE_FUTURE_BLOCKS.name,
    REFUSED_STAYS_INCOMING.name,
    WHOLE_STAGED_BLOCKS.name,
)

#: The findings whose mechanism a spy can see act in a failing run (`integrations.sglang.witness`):
#: a lead the verdict quotes beside a by-design fix's "probably", never a verdict of its own.
WITNESSES = {
    REFUSED_STAYS_INCOMING.name: staged_without_a_row,
    WHOLE_STAGED_BLOCKS.name: staged_block_cut,
}

#: Whose findings show in each built-in's space: the staging truncation everywhere (the
#: declared headroom does not keep it out: docs/engines/sglang.md's findings), the ordered queues'
#: sticky window (priority, lof), and, with no pool headroom and fewer rows than seats, all five.
_IN_SPACE = (WHOLE_STAGED_BLOCKS.name,)
_ORDERED = (PRIORITY_WINDOW.name, *_IN_SPACE)
_FINDINGS_OF: dict[str, tuple[str, ...]] = {
    "real-sglang-dllm": _IN_SPACE,
    "real-sglang-dllm-radix": _IN_SPACE,
    "real-sglang-dllm-lpm": _IN_SPACE,
    "real-sglang-dllm-priority": _ORDERED,
    "real-sglang-dllm-lof": _ORDERED,
    "real-sglang-dllm-priority-lof": _ORDERED,
    "real-sglang-dllm-under-pressure": FIX_NAMES,
}


def known_fixes(impl: str) -> tuple[KnownFix, ...]:
    """The fixes of the findings that show in built-in `impl`'s space (`real-sglang-dllm-*`),
    each with the rules its finding breaks, as `schedspec verify` tries them on a failure
    (inside the declared headroom only the staging truncation's, and the sticky window's for
    an ordered queue); none for another name."""
    return SGLANG_FIXES.known(
        {name: FINDING_RULES[name] for name in _FINDINGS_OF.get(impl, ())},
        by_design=ADMIT_OTHERWISE,
        messages=FINDING_MESSAGES,
        witnesses=WITNESSES,
    )


def fix_as_diff(names: Iterable[str] = FIX_NAMES) -> str:
    """The named fixes (default the five) as one unified diff of the installed SGLang's files
    (paths as `git apply -p1` in an SGLang checkout's `python/` directory wants)."""
    return SGLANG_FIXES.as_diff(names)


def sglang_fixed(names: Iterable[str]) -> AbstractContextManager[None]:
    """`with sglang_fixed(names):` runs SGLang with the named fixes (`FixSet.applied`)."""
    return SGLANG_FIXES.applied(names)


__all__ = [
    "ADMIT_OTHERWISE",
    "CAP_FALLBACK_BUDGET",
    "DECODE_FALLBACK",
    "DECODE_FALLBACK_ANY_ORDER",
    "FINDING_MESSAGES",
    "FINDING_RULES",
    "FIXES",
    "FIX_NAMES",
    "PRIORITY_WINDOW",
    "REFUSED_STAYS_INCOMING",
    "RESERVE_FUTURE_BLOCKS",
    "SGLANG_FIXES",
    "WHOLE_STAGED_BLOCKS",
    "WITNESSES",
    "WORST_CASE_ESTIMATE",
    "fix_as_diff",
    "known_fixes",
    "sglang_fixed",
]
