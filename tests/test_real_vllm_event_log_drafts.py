"""The live `VllmEventLog` under speculative decoding (ngram drafts, synchronous scheduling).

vLLM schedules a decoding request its last token and up to k drafts, counts them computed, and
in `update_from_output` rolls back the drafts the model rejected; the accepted ones become
outputs after the sampled token. The log writes the drafts on `ar_scheduled` and one
`ar_drafts_verified` per drafted request before the update's frees, and its header declares
`num_speculative_tokens`. The engine-core loop's speculative model
(`integrations.vllm.speculative`) accepts each draft with probability 0.6, so the logs hold
rejections and acceptances both. The log names each proposal (`ar_drafts_proposed`, from
`update_draft_token_ids`), and the `vllm-v1` twins replay them: they decide alike, padding
included (vLLM pads a waiting request with one token left to 1 + k tokens), and a vLLM that
stopped padding, or padded less, is caught by the twin alone (the spec allows either).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import EngineFix
from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.patches import SCHEDULER_MODULE, ScheduleFix
from properties.ar.trace_check import check_ar_trace
from tests.engine_gate import require_engine
from tests.test_real_vllm_event_log_lora import twin_agrees

SEEDS = range(6)
K = 2


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def drafted_log(
    seed: int, prefix_caching: bool = True, bug: ScheduleFix | None = None
) -> list[str]:
    """The live log of the engine-core loop serving `core_program(seed)` with K drafts
    (`bug` planted in the scheduler first)."""
    program = core_program(seed)
    config = program.config.replace(enable_prefix_caching=prefix_caching)
    program = replace(program, config=config)
    lines: list[str] = []

    def attach(scheduler: Any) -> None:
        if bug is not None:
            bug.apply(scheduler)
        VllmEventLog(scheduler, lines.append)

    EngineCoreLoop(config, async_scheduling=False, mutate=attach, speculative_tokens=K).run(program)
    return lines


@pytest.fixture(scope="module")
def logs() -> dict[int, list[str]]:
    return {seed: drafted_log(seed) for seed in SEEDS}


def test_a_live_log_with_speculative_decoding_conforms(logs: dict[int, list[str]]) -> None:
    tally: Counter[str] = Counter()
    for seed, lines in logs.items():
        assert json.loads(lines[0])["num_speculative_tokens"] == K
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        drafts: dict[str, int] = {}
        for line in lines[1:]:
            event = json.loads(line)
            if event["kind"] == "ar_scheduled" and event.get("drafts"):
                drafts[event["request_id"]] = event["drafts"]
                tally["drafted"] += 1
            elif event["kind"] == "ar_drafts_verified":
                scheduled = drafts.pop(event["request_id"])
                tally["accepted some" if event["accepted"] else "rejected all"] += 1
                tally["rejected some"] += event["accepted"] < scheduled
    # every kind of outcome occurred, so the check saw rollbacks and accepted outputs
    assert tally["drafted"] >= 20, tally
    assert tally["accepted some"] >= 5 and tally["rejected all"] >= 5, tally
    assert tally["rejected some"] >= 10, tally


def test_without_prefix_caching_too() -> None:
    for seed in range(3):
        result = check_ar_trace(drafted_log(seed, prefix_caching=False))
        assert result.ok, f"seed {seed}: {result.violation}"


def _tampered(lines: list[str], change: str) -> list[str]:
    """`lines` with every `ar_drafts_verified` dropped, or with one more draft `accepted`
    where that does not exceed the drafts and the request is scheduled again (a request whose
    engine sampled its stop may finish after any output: one more output before that finish
    is nothing a log can refute): what a log that mislaid the verification would say."""
    events = [json.loads(line) for line in lines[1:]]
    out, drafts = [lines[0]], {}
    for i, event in enumerate(events):
        rid = event.get("request_id")
        if event["kind"] == "ar_scheduled":
            drafts[rid] = event.get("drafts", 0)
        if event["kind"] == "ar_drafts_verified":
            if change == "dropped":
                continue
            again = any(e["kind"] == "ar_scheduled" and e["request_id"] == rid for e in events[i:])
            if again and event["accepted"] < drafts[rid]:
                event = {**event, "accepted": event["accepted"] + 1}
        out.append(json.dumps(event))
    return out


@pytest.mark.parametrize("change", ["dropped", "one more accepted"])
def test_the_check_tells_a_mislaid_verification(logs: dict[int, list[str]], change: str) -> None:
    """The events carry the verdict: a log without the verifications, or one that counts one
    accepted draft too many, fails (the rolled-back and the accepted tokens are what the next
    steps and the finish are checked against) on every seed with a verification to change."""
    changed = 0
    for seed, lines in logs.items():
        tampered = _tampered(lines, change)
        if tampered == [lines[0], *(json.dumps(json.loads(x)) for x in lines[1:])]:
            continue  # no verification this change applies to
        changed += 1
        result = check_ar_trace(tampered)
        assert not result.ok, f"seed {seed}: the tampered log conforms"
        assert result.violation is not None
        assert result.violation.rule in {
            "speculative_drafts",
            "no_compute_past_known",
            "finish_condition",
            "finish_released",
            "kv_covers_scheduled",  # one accepted too many: computed past the blocks
            "output_tokens",  # dropped, with prefix caching: ids of outputs never verified
        }, str(result.violation)
    assert changed >= len(SEEDS) - 2, changed


@pytest.mark.parametrize(
    ("seed", "drafted", "nth"),
    [(0, 1, 0), (11, 2, 1)],
    ids=["alone", "beside-a-finish"],
)
def test_a_drafted_request_vllm_ends_in_error_is_verified_before_its_frees(
    seed: int, drafted: int, nth: int
) -> None:
    """vLLM ends a request with `FINISHED_ERROR` from inside `update_from_output` (a grammar
    that failed to compile: `finish_requests`, after its loop over the batch has rolled every
    request's drafts back and freed those that stopped). The log writes every verification
    before the first free: before the nested call's, and before those of the requests the loop
    stopped ("beside-a-finish": the `nth` step with `drafted` or more drafted requests, whose
    last stops in the loop before vLLM's error pass reaches it, the nested call then logging
    the loop's frees first; logged the other way round, the check says
    `speculative_drafts`)."""
    program = core_program(seed)
    lines: list[str] = []
    failed: list[str] = []
    seen = [0]

    def attach(scheduler: Any) -> None:
        VllmEventLog(scheduler, lines.append)
        logged_update = scheduler.update_from_output

        def update(out: Any, *args: Any, **kwargs: Any) -> Any:
            ids = [rid for rid, d in out.scheduled_spec_decode_tokens.items() if d]
            if len(ids) >= drafted and not failed:
                if seen[0] == nth:
                    failed.append(ids[-1])
                    scheduler.grammar_compile_error_reqs = {ids[-1]: "failed to compile"}
                seen[0] += 1
            return logged_update(out, *args, **kwargs)

        scheduler.update_from_output = update

    try:
        EngineCoreLoop(
            program.config, async_scheduling=False, mutate=attach, speculative_tokens=K
        ).run(program)
    except EngineCoreViolation as err:
        # the loop's own check may see the request end early; the log is what is checked here
        assert "output_content" in str(err), str(err)
    assert failed, "no step had the drafted requests asked for"
    result = check_ar_trace(lines)
    assert result.ok, str(result.violation)
    events = [json.loads(line) for line in lines[1:]]
    # (with prefix caching the ids of its outputs follow the verification)
    kinds = [e["kind"] for e in events if e.get("request_id") == failed[0]]
    ended = [kind for kind in kinds if kind != "ar_output_tokens"][-3:]
    # ended in error, or (beside-a-finish) stopped by the loop before vLLM's error pass
    assert ended[:2] == ["ar_drafts_verified", "ar_blocks_freed"], ended
    assert ended[2] in {"ar_aborted", "ar_finished"}, ended


def tally_drafted_logs(
    seeds: Iterable[int], prefix_caching: bool = True, bug: ScheduleFix | None = None
) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: each seed's log with K ngram drafts
    (`bug` planted), checked and then replayed by `--twin vllm-v1[-prefix]`: how many
    conform, how many of those the twin decides alike (exit 0) or otherwise (exit 1), and
    the proposals and drafted schedules the logs hold."""
    tally: Counter[str] = Counter()
    twin = "vllm-v1-prefix" if prefix_caching else "vllm-v1"
    with tempfile.TemporaryDirectory() as folder:
        for seed in seeds:
            lines = drafted_log(seed, prefix_caching, bug)
            result = check_ar_trace(lines)
            if not result.ok:
                assert result.violation is not None
                tally[f"violation {result.violation.rule}"] += 1
                continue
            tally["proposals"] += sum('"ar_drafts_proposed"' in line for line in lines)
            tally["drafted"] += sum('"drafts"' in line and "ar_scheduled" in line for line in lines)
            tally[f"twin exit {twin_agrees(lines, Path(folder), twin)[0]}"] += 1
    return dict(tally)


def test_the_log_names_the_proposals_and_the_twin_replays_them(
    logs: dict[int, list[str]], tmp_path: Path
) -> None:
    """Every drafted schedule of a running request was proposed (the check holds the log to
    it), and the twins decide alike on every seed, with prefix caching and without."""
    proposals = 0
    for seed, lines in logs.items():
        proposals += sum('"ar_drafts_proposed"' in line for line in lines)
        code, said = twin_agrees(lines, tmp_path, "vllm-v1-prefix")
        assert code == 0, f"seed {seed}: {said}"
    assert proposals >= 20, proposals
    for seed in range(3):
        code, said = twin_agrees(drafted_log(seed, prefix_caching=False), tmp_path, "vllm-v1")
        assert code == 0, f"seed {seed}: {said}"


def _schedule_bug(name: str, old: str, new: str) -> ScheduleFix:
    return ScheduleFix(
        EngineFix(
            name,
            ((SCHEDULER_MODULE, old, new),),
            ((SCHEDULER_MODULE, "Scheduler.schedule"),),
            f"seeded bug: {name}",
        )
    )


#: Seeded bug: vLLM no longer pads a new decode to 1 + k tokens (its condition never holds).
PADS_NOTHING = _schedule_bug(
    "pads-nothing",
    "                        and num_new_tokens == 1\n",
    "                        and num_new_tokens == 0\n",
)
#: Seeded bug: where the budget cannot take the padding, vLLM schedules the request unpadded
#: rather than stop admitting ("Prefer to not schedule than schedule un-padded" undone).
UNPADDED_WHEN_SHORT = _schedule_bug(
    "unpadded-when-short",
    "                            if padded_num_tokens > request_token_budget:\n"
    "                                # Prefer to not schedule than schedule un-padded.\n"
    "                                break\n"
    "                            num_new_tokens = padded_num_tokens\n"
    "                            pad_spec_decode = True\n",
    "                            if padded_num_tokens <= request_token_budget:\n"
    "                                num_new_tokens = padded_num_tokens\n"
    "                                pad_spec_decode = True\n",
)


@pytest.mark.parametrize(
    ("bug", "seeds"),
    [(PADS_NOTHING, (18, 27)), (UNPADDED_WHEN_SHORT, (26,))],
    ids=["pads-nothing", "unpadded-when-short"],
)
def test_a_vllm_that_pads_otherwise_is_caught_by_the_twin(
    bug: ScheduleFix, seeds: tuple[int, ...], tmp_path: Path
) -> None:
    """Padding is vLLM's choice, which the spec allows and does not require: a log of a vLLM
    that pads otherwise conforms, and only the twin, which pads as vLLM 0.33.0 does, tells
    (these seeds: 3 and 1 of the first 40 programs, with prefix caching and without); the
    released vLLM decides alike on them."""
    for seed in seeds:
        lines = drafted_log(seed, bug=bug)
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        code, said = twin_agrees(lines, tmp_path, "vllm-v1-prefix")
        assert code == 1 and "[twin_decisions]" in said and "schedules" in said, said
        code, said = twin_agrees(drafted_log(seed), tmp_path, "vllm-v1-prefix")
        assert code == 0, f"released, seed {seed}: {said}"
