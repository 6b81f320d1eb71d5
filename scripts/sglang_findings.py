"""SGLang 0.5.23's open dLLM findings as programs, run on the installed SGLang, and recorded for
docs/upstream-reports.md.

    .venv/bin/python scripts/sglang_findings.py [--finding KEY ...] [--record] [--list]

Each finding (`FINDINGS`) is a small program of the spec's operations (`Submit`, `Round`,
`Drain`) on a `DllmConfig`, run through its built-in (`real-sglang-dllm-under-pressure`, whose
profile's space holds the pools and rows of seven; the priority and lof inversions through
`real-sglang-dllm-priority` and `real-sglang-dllm-lof`) as released, where it must break
`rule` with a message holding `says`, and then under each set of `lifted_by` fixes
(`integrations.sglang.fixes`, edits of SGLang's own files), where it must pass to the end of
the run (drain, golden outputs, parity with solo sync). For each it prints the program, what
the adapter did on SGLang's scheduler in SGLang's own calls (the transcript a failing
`verify` prints) with each decision of SGLang's `PrefillAdder` noted inside the call that made
it, the violation, and each fix set's outcome (a failing one's violation); with `--record` it
also writes `docs/shrunk/sglang-KEY.json` for each finding that reproduced, which
`scripts/upstream_reports.py` renders without SGLang.

On an install changed by hand (to try a change of one's own) it says so first, naming the
files that differ from the release, and labels each run "as installed" instead of "as
released"; a fix set whose edits that install's files do not take is "NOT APPLIED", which is
not as stated; `--record` refuses such an install, as a record is of the release.

Exit 0 when every finding run reproduces as stated (broken as released, lifted by its fixes),
1 when one does not (what it did instead is printed; nothing recorded for it), 2 (one line on
stderr) for a usage error such as an unknown flag or KEY, a `--record` place that cannot be
written, `--record` on a modified install, or without SGLang installed (`schedspec
install-engines sglang`). The finding tests
(tests/test_real_sglang.py, tests/test_sglang_priority.py) run the same programs (`drive`)
with spies on SGLang that show each cause.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.sglang.witness import was_taken
from properties.example import DllmExample
from properties.harness import Harness
from properties.operations import Drain, Op, Round, Submit, apply_ops
from schedspec_cli.args import Parser, UsageError
from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.implementation import DllmImplementation

ROOT = Path(__file__).resolve().parent.parent
SHRUNK = ROOT / "docs" / "shrunk"

#: The built-in most programs run through (its profile holds their configurations); an ordered
#: queue's findings run through theirs.
IMPLEMENTATION = "real-sglang-dllm-under-pressure"
_BUILT_INS = {
    IMPLEMENTATION: "REAL_SGLANG_DLLM_UNDER_PRESSURE",
    "real-sglang-dllm-priority": "REAL_SGLANG_DLLM_PRIORITY",
    "real-sglang-dllm-lof": "REAL_SGLANG_DLLM_LOF",
}

# The cause three findings share, said once.
_STAGING_CAUSE = (
    "`process_dllm_incoming_reqs` (dllm/mixin/scheduler.py) calls `req.init_next_round_input` "
    "before `PrefillAdder.add_one_req` decides, and its `determine_dllm_phase` moves the request "
    "from INCOMING_* to STAGING_*. A request the adder refuses (NO_TOKEN) therefore stays in "
    "the dLLM manager as a staging request without a row, and a later round's "
    "`process_dllm_staging_reqs` hands it to `PrefillAdder.add_dllm_staging_req`, which is not "
    "the incoming path: it has no admission estimate (it takes a request while its budget for "
    "the next block is positive, and charges the block, a page and max_new_tokens only after), "
    "no free-row check (`get_num_allocatable_reqs`), and its budget, `_get_dllm_remain_tokens` "
    "(managers/schedule_policy.py:1001), is min(rem_dllm_tokens, rem_total_tokens, block size) "
    "only while that is positive: once the pass's KV budget is spent it falls back to "
    "`rem_dllm_tokens` (max_running_requests x block size, line 1010), dropping the block-size "
    "cap and the KV budget both. The notes in the calls below show each decision of the adder "
    "with its budget. Closing this path (`refused-stays-incoming`) must come with "
    "`worst-case-estimate`: the staging path is how a request the estimate refuses although it "
    "fits gets in at all, a round late (the idle-round reports below); without it, such a "
    "request waits for good."
)


@dataclass(frozen=True, slots=True)
class SglangFinding:
    """One open finding: `ops` on `config` breaks `rule` (its message holding `says`) on SGLang
    as released and passes under each fix set of `lifted_by`; `test` is the test (its pytest
    node id) that shows its cause."""

    key: str
    title: str
    cause: str
    config: DllmConfig
    ops: tuple[Op, ...]
    rule: str
    says: str
    lifted_by: tuple[tuple[str, ...], ...]
    test: str
    implementation: str = IMPLEMENTATION

    def built_in(self) -> DllmImplementation:
        """The built-in the program runs through (`implementation`)."""
        import integrations.sglang as sglang

        return cast(DllmImplementation, getattr(sglang, _BUILT_INS[self.implementation]))

    def example(self) -> DllmExample:
        """The program as a replayable example under its built-in's profile."""
        return DllmExample(self.config, self.built_in().profile, self.ops)


def drive(h: Harness, ops: Sequence[Op]) -> Harness:
    """Run `ops` on `h`, each guarded as a failing example's replay runs it (an exception from
    SGLang is `implementation_error`, a call past its deadline `progress`)."""
    for op in ops:
        name = "submit" if isinstance(op, Submit) else "round" if isinstance(op, Round) else "drain"
        h.guarded(name, apply_ops, h, (op,))
    return h


def _request(rid: str, prompt: tuple[int, ...], max_new: int, **flags: Any) -> Submit:
    return Submit(RequestSpec(rid, prompt, max_new, **flags))


def _window_ops(late: Submit, **flags: Any) -> tuple[Op, ...]:
    """The two ordered-queue inversions' program: `p` (a whole prompt block) and `d` queued, a
    round that takes `p` and fetches `d` into the dLLM manager without a row, then `late`, which
    the queue's order puts ahead of `d`, a round, and a drain (`flags`: `p`'s and `d`'s)."""
    return (
        _request("p", (0, 0), 1, **flags),
        _request("d", (0,), 1, **flags),
        Round(),
        late,
        Round(),
        Drain(),
    )


#: What the two ordered-queue inversions say when they break `fcfs_admission`.
_WINDOW_SAYS = "admitted 'd' while 'c' is ahead of it (queue ['c', 'd'])"


def _config(**changes: Any) -> DllmConfig:
    """The findings' base: block = page = 4, 16 pages, 2 rows and seats, FDFO, in-place reuse."""
    base = DllmConfig(
        block_size=4,
        page_size=4,
        kv_pages=16,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=32,
        mode=Mode.FDFO,
        in_place_reuse=True,
    )
    return base.replace(**changes)


FINDINGS: tuple[SglangFinding, ...] = (
    SglangFinding(
        key="ragged-row",
        title=(
            "A request the adder refuses re-enters through the staging path and gets a "
            "row that is not one whole block (its prompt plus a whole mask block)"
        ),
        cause=_STAGING_CAUSE
        + " Here `b` (a one-token prompt) is refused while `a` runs. The round after, `a`'s "
        "staging charge (its block, a page and its whole max_new_tokens again: 4 + 4 + 20 = 28) "
        "spends the pass's rem_total_tokens, so `b` is taken on the fallback budget "
        "(rem_dllm_tokens 8) and extended by its whole fill ids: 5 tokens (its prompt and a mask "
        "block) for a block of 4, spanning two blocks. SGLang's own step views a batch's input "
        "as whole blocks (`input_ids.view(batch_size, self.block_size)`, "
        "dllm/algorithm/base.py:108), which 9 tokens for 2 requests of block 4 cannot be. "
        "`cap-fallback-budget`, keeping the cap in the fallback, fixes this symptom; "
        "`refused-stays-incoming` the cause.",
        config=_config(kv_pages=8, req_pool_rows=3, max_running_requests=3),
        ops=(
            _request("a", (1,), 20),
            Round(),
            _request("b", (2,), 12),
            Round(),
            _request("c", (3,), 11),
            Drain(),
        ),
        rule="whole_block_alloc",
        says="allocated block 1 but the next uncommitted block is 0",
        lifted_by=(("refused-stays-incoming",),),
        test="tests/test_real_sglang.py::test_finding_ragged_row_comes_from_a_refused_request_entering_as_staging",
    ),
    SglangFinding(
        key="kv-pressure",
        title=(
            "A request the adder refuses re-enters through the staging path past the "
            "estimate that refused it, and the KV pool is overcommitted (RuntimeError: Prefill "
            "out of memory)"
        ),
        cause=_STAGING_CAUSE
        + " Here 5 usable pages hold either request alone (3 pages each) but not both. The "
        "adder's estimate refuses `b`; the round after, the staging path takes it without one "
        "(a budget of 16 for a block of 4), and each round after it takes `b`'s next block "
        "again, on the fallback budget once rem_total_tokens is spent (-10), until "
        "`alloc_for_extend` finds no room. Admitting only while the free KV, less what the "
        "running requests can still claim, covers the claim (`reserve-future-blocks`) fixes "
        "it too.",
        config=_config(kv_pages=5),
        ops=(
            _request("a", (5, 6, 7, 8, 9), 6),
            _request("b", (1, 2, 3, 4, 5), 6),
            Drain(),
        ),
        rule="implementation_error",
        says="Prefill out of memory",
        lifted_by=(
            ("refused-stays-incoming", "decode-fallback"),
            ("reserve-future-blocks", "decode-fallback"),
        ),
        test="tests/test_real_sglang.py::test_finding_kv_pressure_fixed_by_keeping_the_refused_request_incoming",
    ),
    SglangFinding(
        key="rows-taken-by-staging",
        title=(
            "Fewer request-pool rows than --max-running-requests: requests the adder "
            "refused re-enter through the staging path without the free-row check "
            "(RuntimeError: alloc_req_slots runs out of memory)"
        ),
        cause=_STAGING_CAUSE + " Here 2 rows serve 3 seats (reachable: the dLLM manager keeps "
        "`--max-running-requests` as given while `resolve_max_num_reqs` sizes the request pool "
        "at min(requested // attention-DP size, token capacity // 2)); the adder's estimate "
        "refuses `r1` and `r3`, and the staging path, with no free-row check, takes both: "
        "three requests for two rows.",
        config=DllmConfig(
            block_size=2,
            page_size=2,
            kv_pages=4,
            req_pool_rows=2,
            max_running_requests=3,
            max_context=4,
            mode=Mode.SYNC,
            in_place_reuse=False,
        ),
        ops=(
            _request("r0", (0,), 1),
            _request("r1", (0,), 1),
            Round(),
            _request("r2", (0, 0), 1),
            _request("r3", (0, 0), 1),
            Drain(),
        ),
        rule="implementation_error",
        says="alloc_req_slots runs out of memory",
        lifted_by=(("refused-stays-incoming", "decode-fallback"),),
        test="tests/test_real_sglang.py::test_finding_a_refused_request_entering_as_staging_takes_a_row_there_is_not",
    ),
    SglangFinding(
        key="row-starvation",
        title=(
            "Fewer request-pool rows than --max-running-requests: a prefill-phase "
            "request that cannot get a row makes the round form no batch, and the decode "
            "request holding the row never runs again"
        ),
        cause=(
            "`_process_dllm_batches` (dllm/mixin/scheduler.py) returns after the prefill pass "
            "whenever a prefill-phase request is queued, even when that pass forms no batch; "
            "`p` cannot get a row (1 row, 2 seats: the free-row check, "
            "`get_num_allocatable_reqs`, offers it to no adder), and `d`, which holds the row, "
            "waits for it for good. Reachable as the row finding above."
        ),
        config=_config(req_pool_rows=1),
        ops=(
            _request("d", (1,), 8),
            Round(),
            _request("p", (1, 2, 3, 4, 5, 6, 7, 8, 9), 4),
            Round(),
            Round(),
            Round(),
            Round(),
            Drain(),
        ),
        rule="progress",
        says="a round with 1 running requests ran no forward",
        lifted_by=(("decode-fallback",),),
        test="tests/test_real_sglang.py::test_finding_prefill_request_without_a_row_starves_the_decode_request",
    ),
    SglangFinding(
        key="idle-round",
        title=(
            "An idle engine runs a round without admitting a request that fits the pool, "
            "its admission estimate counting a mask block, max_new_tokens and a page on top of "
            "the prompt"
        ),
        cause=(
            "`PrefillAdder.add_one_req` (managers/schedule_policy.py) estimates a dLLM request "
            "as its fill ids (prompt + a whole mask block) + max_new_tokens + a page: 5 + 4 + 6 "
            "+ 4 = 19 slots for a request that claims 12 of the 16 (prompt and output in whole "
            "blocks). Refused, it is left a staging request and the staging path, which has no "
            "estimate, admits it a round later (the cause of the first three reports); with "
            "that path closed (`refused-stays-incoming`) and the estimate as it is, it would "
            "wait for good."
        ),
        config=_config(kv_pages=4),
        ops=(_request("a", (5, 6, 7, 8, 9), 6), Drain()),
        rule="progress",
        says="idle system with 1 queued requests admitted none",
        lifted_by=(("worst-case-estimate",),),
        test="tests/test_real_sglang.py::test_finding_idle_engine_skips_a_round_before_admitting_a_request_that_fits",
    ),
    SglangFinding(
        key="ignore-eos",
        title=(
            "An idle engine runs a round without admitting a request with ignore_eos that fits "
            "the pool, estimated by add_one_req_ignore_eos as its paged fill ids, a rounding "
            "page and its whole max_new_tokens; it gets in a round later through the staging "
            "path"
        ),
        cause=(
            "With the radix cache off, `PrefillAdder.add_one_req` hands a request with "
            "`ignore_eos` to `add_one_req_ignore_eos`, which charges its fill ids paged "
            "(prompt + a mask block: 8 slots) plus a rounding page (4), then requires the free "
            "slots less that, less its whole max_new_tokens, to stay above one reserve token: "
            "12 - 12 - 1 <= 1, refused. The request needs one block of 4 slots; without "
            "`ignore_eos` the same request is admitted at once (5 + 1 + 4 = 10 < 12). Refused, "
            "it is left a staging request and the staging path, which has no estimate, takes "
            "it the round after (the cause of the first three reports); with that path closed "
            "(`refused-stays-incoming`) and the estimate as it is, it would wait for good."
        ),
        config=_config(kv_pages=3),
        ops=(_request("a", (0,), 1, ignore_eos=True), Drain()),
        rule="progress",
        says="idle system with 1 queued requests admitted none",
        lifted_by=(("worst-case-estimate",),),
        test="tests/test_real_sglang.py::test_finding_an_ignore_eos_request_that_fits_waits_a_round",
    ),
    SglangFinding(
        key="staging-truncation",
        title=(
            "add_dllm_staging_req charges each staged request its whole max_new_tokens "
            "again and truncates the next request's block to what is left"
        ),
        cause=(
            "`PrefillAdder.add_dllm_staging_req` (managers/schedule_policy.py) charges each "
            "staged running request its next block, a page and its whole max_new_tokens "
            "(`_update_prefill_budget`); the dLLM path's running batch is empty, so nothing "
            "else counts them, and the next request's block is cut to the budget left "
            "(`min(cand_extend_input_len, _rem_tokens)`): `r2`'s staging leaves 12 - (3 + 3 + "
            "4) = 2 tokens, and `r3` gets 2 slots for a block of 3 with 9 slots free."
        ),
        config=_config(
            block_size=3,
            page_size=3,
            kv_pages=6,
            max_context=6,
            mode=Mode.SYNC,
            in_place_reuse=False,
        ),
        ops=(
            _request("r0", (0,), 1),
            _request("r1", (0,), 1),
            _request("r2", (0,), 4),
            _request("r3", (0,), 3),
            Drain(),
        ),
        rule="whole_block_alloc",
        says="allocated 2 slots for a block of 3",
        lifted_by=(("whole-staged-blocks",),),
        test="tests/test_real_sglang.py::test_finding_staging_truncates_a_running_block",
    ),
)

_WINDOW_CAUSE = (
    "`get_new_batch_dllm` (dllm/mixin/scheduler.py) moves waiting requests into the dLLM "
    "manager (`_fetch_waiting_reqs`) up to --max-running-requests, and `calc_priority` "
    "(managers/schedule_policy.py) sorts only the waiting queue, so a request the manager "
    "holds without a row keeps its place there against every later arrival. Here `p` and `d` "
    "are fetched together and `p` runs; `c` arrives, sorted ahead of `d` by SGLang's own order "
    "({why}), but is not even fetched (the manager is full: `p` and `d`), and `d` takes the last "
    "seat."
)
_SYNC_BLOCK_2 = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=16,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=4,
    mode=Mode.SYNC,
    in_place_reuse=False,
)

FINDINGS += (
    SglangFinding(
        key="priority-window",
        title=(
            "Priority scheduling: a request fetched into the dLLM manager without a row keeps "
            "its place against a later arrival of a higher priority"
        ),
        cause=_WINDOW_CAUSE.format(why="priority 0 before 1, with --enable-priority-scheduling"),
        config=_SYNC_BLOCK_2,
        ops=_window_ops(_request("c", (0,), 1, priority=0), priority=1),
        rule="fcfs_admission",
        says=_WINDOW_SAYS,
        lifted_by=(("priority-window",),),
        test=(
            "tests/test_sglang_priority.py::"
            "test_finding_a_fetched_request_keeps_its_place_against_a_higher_priority_arrival"
        ),
        implementation="real-sglang-dllm-priority",
    ),
    SglangFinding(
        key="lof-window",
        title=(
            "--schedule-policy lof: a request fetched into the dLLM manager without a row keeps "
            "its place against a later arrival with a longer output"
        ),
        cause=_WINDOW_CAUSE.format(why="2 new tokens before 1, longest output first"),
        config=_SYNC_BLOCK_2,
        ops=_window_ops(_request("c", (0,), 2)),
        rule="fcfs_admission",
        says=_WINDOW_SAYS,
        lifted_by=(("priority-window",),),
        test=(
            "tests/test_sglang_lof.py::"
            "test_finding_a_fetched_request_keeps_its_place_against_a_longer_output_arrival"
        ),
        implementation="real-sglang-dllm-lof",
    ),
)

BY_KEY = {finding.key: finding for finding in FINDINGS}


# ------------------------------------------------------------------------------------ the source
def program_source(finding: SglangFinding) -> str:
    """The program as Python (`DllmConfig`, `Mode` and `RequestSpec` from `spec.config`;
    `Submit`, `Round` and `Drain` from `properties.operations`), defaults left out."""
    config = ", ".join(
        f"{f.name}={_value(getattr(finding.config, f.name))}"
        for f in fields(DllmConfig)
        if getattr(finding.config, f.name) != f.default
    )
    lines = [f"DllmConfig({config})"]
    for op in finding.ops:
        if isinstance(op, Submit):
            r = op.request
            extra = "".join(
                f", {f.name}={_value(getattr(r, f.name))}"
                for f in fields(RequestSpec)
                if f.name not in ("request_id", "prompt", "max_new_tokens")
                and getattr(r, f.name) != f.default
            )
            lines.append(
                f"Submit(RequestSpec({r.request_id!r}, {r.prompt!r}, {r.max_new_tokens}{extra}))"
            )
        else:
            lines.append(f"{type(op).__name__}()")
    return "\n".join(lines)


def _value(value: object) -> str:
    return str(value) if isinstance(value, Mode) else repr(value)


# ------------------------------------------------------------------------------------- the runs
@dataclass(frozen=True, slots=True)
class Outcome:
    """One run: its violation (None: it passed to the end) and SGLang's own calls."""

    violation: SpecViolation | None
    transcript: str


def run(finding: SglangFinding, fixes: Sequence[str] = ()) -> Outcome:
    """`finding`'s program on the installed SGLang, with the named fixes applied."""
    from integrations.sglang.fixes import sglang_fixed

    made: list[Any] = []
    factory = finding.built_in().factory

    def recording(config: DllmConfig, sink: EventSink) -> Any:
        adapter = factory(config, sink)
        made.append(adapter)
        return adapter

    applied = sglang_fixed(fixes) if fixes else contextlib.nullcontext()
    # SGLang prints its pools to descriptor 1 when it runs out of memory
    with applied, implementation_stdout_to_stderr(), adder_decisions(made):
        violation, _ = finding.example().run(recording)
    # the first adapter ran the program (the later ones, parity's solo runs)
    transcript = made[0].native_calls() if made else ""
    return Outcome(violation, transcript)


@contextlib.contextmanager
def adder_decisions(made: list[Any]) -> Iterator[None]:
    """Note in the running adapter's transcript (the latest `made`: the program's, then each
    solo run's of the parity check) each decision of SGLang's `PrefillAdder` on a request
    (`add_one_req`, the incoming path; `add_dllm_staging_req`, the staging path): the causes
    the findings name happen inside `get_next_batch_to_run`, so the line of that call, which
    follows them, does not show them. A note that cannot be read says so; it never raises into
    SGLang's call."""
    from sglang.srt.managers.schedule_policy import PrefillAdder

    add_one, add_staging = PrefillAdder.add_one_req, PrefillAdder.add_dllm_staging_req

    def note(describe: Callable[[], str]) -> None:
        try:
            line = describe()
        except Exception as err:  # a note must not become SGLang's implementation_error
            line = f"(a decision the note could not read: {type(err).__name__}: {err})"
        if made:
            made[-1].transcript.append(f"#   in get_next_batch_to_run: {line}")

    def incoming(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        phase = _phase(req)  # init_next_round_input set it before the adder decides
        result = add_one(self, req, *args, **kwargs)
        note(
            lambda: (
                f"PrefillAdder.add_one_req({req.rid}), entering {phase}: "
                f"{_taken(self, req)}, returns {result.name}"
            )
        )
        return result

    def staging(self: Any, req: Any) -> Any:
        held = "without a row" if req.kv.req_pool_idx is None else "holding its row"
        budget = (
            f"rem_total_tokens {int(self.rem_total_tokens)}, rem_dllm_tokens "
            f"{int(self.rem_dllm_tokens)}"
        )
        result = add_staging(self, req)

        def describe() -> str:
            taken = _taken(self, req)
            if taken == "taken":
                taken += f", extend {int(req.extend_end - req.prefix_len)} tokens"
            return (
                f"PrefillAdder.add_dllm_staging_req({req.rid}) {held}, {budget}: {taken}, "
                f"returns {result.name}"
            )

        note(describe)
        return result

    PrefillAdder.add_one_req, PrefillAdder.add_dllm_staging_req = incoming, staging
    try:
        yield
    finally:
        PrefillAdder.add_one_req, PrefillAdder.add_dllm_staging_req = add_one, add_staging


def _phase(req: Any) -> str:
    phase = getattr(req, "dllm_phase", None)
    return str(getattr(phase, "name", phase))


def _taken(adder: Any, req: Any) -> str:
    """Whether the adder put `req` in this round's batch (its result alone says the budget)."""
    return "taken" if was_taken(adder, req) else "not taken"


def reproduces(finding: SglangFinding, outcome: Outcome) -> bool:
    """Whether the released run broke the finding's rule with its words."""
    v = outcome.violation
    return v is not None and v.rule == finding.rule and finding.says in v.detail


@dataclass(frozen=True, slots=True)
class FixedRun:
    """The program under one fix set: its violation (None: it passed), or, when the installed
    SGLang's files do not take the set (an install changed by hand), why (`unapplied`)."""

    fixes: tuple[str, ...]
    violation: SpecViolation | None
    unapplied: str = ""

    @property
    def passes(self) -> bool:
        return self.violation is None and not self.unapplied


#: A finding's runs: as installed (the release, unless changed by hand), then each fix set.
Runs = tuple[Outcome, list[FixedRun]]


def runs(finding: SglangFinding) -> Runs:
    """`finding`'s program as installed, then under each set of `lifted_by`."""
    from integrations.patches import FixDoesNotApply

    fixed = []
    for fixes in finding.lifted_by:
        try:
            fixed.append(FixedRun(fixes, run(finding, fixes).violation))
        except FixDoesNotApply as err:  # nothing was changed: the fix edits files or nothing
            fixed.append(FixedRun(fixes, None, str(err)))
    return run(finding), fixed


def as_stated(finding: SglangFinding, ran: Runs) -> bool:
    """Whether the runs are what the finding says: broken as released by its rule with its
    words, and passing under every fix set."""
    released, fixed = ran
    return reproduces(finding, released) and all(r.passes for r in fixed)


def record(finding: SglangFinding, version: str, ran: Runs | None = None) -> dict[str, Any]:
    """What docs/upstream-reports.md says of `finding`: the program, SGLang's calls, the
    violation as released, and the fix sets under which it passes (`runs`, made here unless
    given)."""
    released, fixed = ran if ran is not None else runs(finding)
    v = released.violation
    return {
        "key": finding.key,
        "order": [f.key for f in FINDINGS].index(finding.key),
        "title": finding.title,
        "cause": finding.cause,
        "sglang": version,
        "implementation": finding.implementation,
        "program": program_source(finding),
        "transcript": released.transcript.splitlines(),
        "rule": None if v is None else v.rule,
        "message": None if v is None else _installed_path.sub("", v.detail),
        "lifted_by": [list(r.fixes) for r in fixed if r.passes],
        "test": finding.test,
    }


#: Where the engine cache put SGLang (it differs by machine and user): left out of a record.
_installed_path = re.compile(r"/\S*/site-packages/")


def record_path(key: str) -> Path:
    """Where `key`'s record lives."""
    return SHRUNK / f"sglang-{key}.json"


# ---------------------------------------------------------------------------------- the command
def build_parser() -> argparse.ArgumentParser:
    """The script's flags; a usage error is one line (`schedspec_cli.args.Parser`:
    `UsageError`)."""
    parser = Parser(
        prog="sglang_findings.py",
        description="SGLang 0.5.23's open dLLM findings, run on the installed SGLang.",
    )
    parser.add_argument(
        "--finding",
        action="append",
        default=None,
        metavar="KEY",
        help=f"run only this finding (repeatable): one of {', '.join(BY_KEY)}",
    )
    parser.add_argument(
        "--record", action="store_true", help="write docs/shrunk/sglang-KEY.json for each run"
    )
    parser.add_argument("--list", action="store_true", help="print each finding's key and title")
    return parser


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as err:  # `sglang_findings.py: error: ...`, as the errors below
        print(" ".join(str(err).split()), file=sys.stderr)
        return 2
    unknown = sorted(set(args.finding or ()) - set(BY_KEY))
    if unknown:
        print(
            f"sglang_findings.py: error: --finding: unknown {unknown}; one of {sorted(BY_KEY)}",
            file=sys.stderr,
        )
        return 2
    if args.list:
        for finding in FINDINGS:
            out(f"{finding.key}: {finding.title}")
        return 0
    from integrations.sglang.manifest import MANIFEST

    if not MANIFEST.installed():
        print(
            f"sglang_findings.py: error: SGLang {MANIFEST.version} is not installed: run "
            "`schedspec install-engines sglang`",
            file=sys.stderr,
        )
        return 2
    from integrations.sglang.engine import import_engine

    modified = MANIFEST.modified_sources()
    if modified and args.record:
        print(
            f"sglang_findings.py: error: --record: this SGLang {MANIFEST.version} is MODIFIED "
            f"from the release ({_files(modified)}), and a record feeds an upstream report of "
            "the release: run without --record, or reinstall it (`schedspec install-engines "
            "sglang --force`)",
            file=sys.stderr,
        )
        return 2
    import_engine()
    if modified:
        out(
            f"SGLang {MANIFEST.version} MODIFIED from the release: {_files(modified)}; every "
            "run below is of this install, not of the release"
        )
    chosen = [BY_KEY[key] for key in args.finding] if args.finding else list(FINDINGS)
    failed = 0
    for finding in chosen:
        ran = runs(finding)
        made = record(finding, MANIFEST.version, ran)
        ok = as_stated(finding, ran)
        failed += not ok
        out(_text(finding, made, ran, ok, modified=bool(modified)))
        if args.record and ok:  # a record is a reproduction, or nothing
            path = record_path(finding.key)
            try:
                path.write_text(json.dumps(made, indent=1) + "\n")
            except OSError as err:
                why = err.strerror or str(err)
                print(f"sglang_findings.py: error: --record: {path}: {why}", file=sys.stderr)
                return 2
    return 1 if failed else 0


def _files(paths: Sequence[str]) -> str:
    """Changed files, the first few by name."""
    shown = ", ".join(paths[:5])
    return shown + (f", ... ({len(paths)} files)" if len(paths) > 5 else "")


def _text(
    finding: SglangFinding, made: dict[str, Any], ran: Runs, ok: bool, *, modified: bool = False
) -> str:
    """One finding's runs in words (`modified`: the install differs from the release)."""
    said = "no violation" if made["rule"] is None else f"[{made['rule']}] {made['message']}"
    lines = [
        f"== {finding.key}: {finding.title}",
        made["program"],
        "-- SGLang's own calls:",
        *made["transcript"],
        f"-- as {'installed (MODIFIED from the release)' if modified else 'released'}: {said}",
    ]
    for r in ran[1]:
        if r.unapplied:
            passes = f"NOT APPLIED: this install's files do not take it ({r.unapplied})"
        elif r.violation is None:
            passes = "passes"
        else:
            passes = f"DOES NOT PASS: [{r.violation.rule}] {r.violation.detail.splitlines()[0]}"
        lines.append(f"-- with {' + '.join(r.fixes)}: {passes}")
    expected = " ".join(filter(None, (f"[{finding.rule}]", finding.says)))
    lines.append("REPRODUCED" if ok else f"NOT AS STATED (not recorded): expected {expected}")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # `... | head`: nobody is left to read the rest
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None
