"""The one-line sayings of an engine-core loop's events (`integrations.vllm.trace`), without
vLLM: outputs are stand-ins with the fields the lines read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from integrations.vllm.trace import compact, elide, output_line, schedule_line


def _schedule(
    tokens: dict[str, int],
    *,
    new: tuple[str, ...] = (),
    resumed: tuple[str, ...] = (),
    drafts: dict[str, list[int]] | None = None,
    preempted: tuple[str, ...] = (),
    ended: tuple[str, ...] = (),
) -> Any:
    return SimpleNamespace(
        num_scheduled_tokens=tokens,
        scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new],
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)),
        scheduled_spec_decode_tokens=drafts or {},
        preempted_req_ids=set(preempted),
        finished_req_ids=set(ended),
    )


def test_a_schedule_says_each_requests_tokens_then_preemptions_and_ends() -> None:
    out = _schedule(
        {"r0": 3, "r1": 1, "r2": 3},
        new=("r0",),
        resumed=("r1",),
        drafts={"r2": [7, 8]},
        preempted=("r3",),
        ended=("r4",),
    )
    assert schedule_line(out) == (
        "r0 3 tokens (new), r1 1 token (resumed), r2 3 tokens with 2 drafts; preempted ['r3']; "
        "ended since the last call ['r4']"
    )
    assert schedule_line(_schedule({})) == "nothing"


def test_an_output_says_each_requests_tokens_and_finish() -> None:
    finished = SimpleNamespace(name="STOP")
    outputs = {
        0: SimpleNamespace(
            outputs=[
                SimpleNamespace(request_id="r0", new_token_ids=[5], finish_reason=None),
                SimpleNamespace(request_id="r1", new_token_ids=[1, 2], finish_reason=finished),
            ]
        )
    }
    assert output_line(outputs) == "r0 +1 token, r1 +2 tokens, finished (stop)"
    assert output_line({}) == "no token"


def test_idle_steps_are_said_once_and_a_prefill_chunks_output_is_kept() -> None:
    """Schedules of nothing and their outputs fold into one line; the tokenless output of a
    schedule that scheduled something (a prefill chunk) stays."""
    trace = [
        "step 1: schedule 1: r0 2 tokens (new)",
        "step 2: schedule 2: nothing",
        "step 2: output of schedule 1: no token",
        "step 3: output of schedule 2: no token",
        "step 4: schedule 4: nothing",
        "step 4: output of schedule 4: no token",
        "step 5: abort r0",
        "step 6: schedule 6: nothing",
    ]
    assert compact(trace) == [
        "step 1: schedule 1: r0 2 tokens (new)",
        "step 2: schedule() scheduled nothing",
        "step 2: output of schedule 1: no token",
        "steps 3..4: schedule() scheduled nothing",
        "step 5: abort r0",
        "step 6: schedule() scheduled nothing",
    ]


def test_a_diffusion_canvas_is_said_as_a_canvas() -> None:
    out = _schedule({"r0": 4, "r1": 1}, drafts={"r0": [3, 3, 3, 3]}, new=("r1",))
    assert schedule_line(out, canvas=True) == "r0 4 tokens with a canvas of 4, r1 1 token (new)"
    assert schedule_line(out) == "r0 4 tokens with 4 drafts, r1 1 token (new)"


def test_a_long_run_keeps_its_head_and_tail() -> None:
    """A hang's run (here 200 lines) keeps its first 60 and last 20 lines, the rest said in
    one line; a short one is kept whole."""
    lines = [f"step {i}: offload: load job {i} of r1 submitted" for i in range(200)]
    kept = elide(lines)
    assert kept[:60] == lines[:60] and kept[-20:] == lines[-20:]
    assert kept[60] == "... 120 lines left out ..." and len(kept) == 81
    assert elide(lines[:81]) == lines[:81]
