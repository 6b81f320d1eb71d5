"""The reference's golden decoder: one request decoded alone by the reference's own oracle.

`golden_output(config, oracle, request)` is the twin of `gpu.golden` for the reference
scheduler: no KV pool, no rows, no batch, no carries. Blocks start at multiples of block_size
and hold the prompt's tokens at prompt positions and the mask elsewhere (a full prompt block is
stepped too; a partial last prompt block is the first output block); each block is stepped by
the oracle alone (`DenoiseOracle.step` on a one-row batch, context = the committed tokens, from
a fresh `init_state`) until done, then committed; the request finishes by the spec's rule
(`spec.machine.finish_condition`, `request_output`). An oracle whose rows depend only on
themselves (every built-in one) then gives the reference the same output at every batch size
and in every mode.
"""

from __future__ import annotations

from reference.oracle import DenoiseOracle, OracleRow, stops_now
from spec.config import DllmConfig, RequestSpec, validate_request
from spec.errors import SchedulerStalled
from spec.events import FinishReason
from spec.machine import finish_of
from spec.snapshot import FinishedOutput


def max_block_steps(block_size: int) -> int:
    """Steps after which a block that is still not done is a stalled oracle."""
    return 4 * block_size + 256


def golden_output(
    config: DllmConfig, oracle: DenoiseOracle, request: RequestSpec
) -> FinishedOutput:
    """The request's output and finish reason decoded alone (see the module docstring).

    Raises the `validate_request` errors for a request the scheduler would refuse, and
    `SchedulerStalled` when the oracle never reports a block done."""
    validate_request(config, request)
    size = config.block_size
    prompt = request.prompt
    committed: list[int] = []
    block_index = 0
    while True:
        start = block_index * size
        mask = config.mask_token_id
        tokens = tuple(prompt[p] if p < len(prompt) else mask for p in range(start, start + size))
        state = oracle.init_state(tokens)
        for _ in range(max_block_steps(size)):
            row = OracleRow(request.request_id, tuple(committed), block_index, tokens, state)
            (result,) = oracle.step([row])
            tokens, state = result.tokens, result.state
            if result.done:
                break
        else:
            raise SchedulerStalled(
                max_block_steps(size),
                f"golden decoding of {request.request_id!r}: block {block_index} never done",
                "forwards",
            )
        committed.extend(tokens)
        block_index += 1
        generated = committed[len(prompt) :]
        if stops_now(oracle, request, block_index):
            return FinishedOutput(tuple(generated[: request.max_new_tokens]), FinishReason.STOP)
        end = finish_of(config, request, generated)
        if end is not None:
            return FinishedOutput(end[1], end[0])
