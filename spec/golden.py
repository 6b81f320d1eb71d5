"""The optional golden part of the adapter contract: an oracle for output correctness.

An implementation may say what each request's output *should* be, independently of its own
scheduling: `golden_output(request)` decodes the request alone, with the same model (or
denoising oracle) and algorithm, but without the paged KV pool, the batch or the carries —
the engine with a dense unbatched forward over the whole sequence, the reference with its
oracle one block at a time. Scheduling must not change outputs, so every finished request's
output and finish reason must equal its golden output at every batch size and in every mode
(rule `golden_output`). This catches what FDFO-vs-sync parity cannot: a bug that corrupts sync
and FDFO alike (a stale context, wrong positions).

The harness checks every finished request against it after every round when the adapter has
`golden_output` (`GoldenDecoder`); an adapter without it is not checked this way.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from spec.config import RequestSpec
from spec.snapshot import FinishedOutput


@runtime_checkable
class GoldenDecoder(Protocol):
    """An adapter that can decode one request alone (see the module docstring).

    `golden_output(request)` returns the request's output (generated tokens cut at
    max_new_tokens and after the first EOS, as `spec.machine.request_output`) and its finish
    reason when decoded alone under the adapter's configuration. It must not change the
    adapter's state (no events, no allocation) and must be deterministic.
    """

    def golden_output(self, request: RequestSpec) -> FinishedOutput:
        """`request` decoded alone under the adapter's configuration: its output and finish
        reason, with no event and no change to the adapter's state."""
        ...


def golden_mismatch(
    request: RequestSpec, actual: FinishedOutput, golden: FinishedOutput
) -> str | None:
    """None when `actual` equals `golden`; else a one-line account of the first difference."""
    if actual == golden:
        return None
    rid = request.request_id
    if actual.tokens != golden.tokens:
        pairs = zip(actual.tokens, golden.tokens, strict=False)
        shorter = min(len(actual.tokens), len(golden.tokens))
        first = next((i for i, (a, g) in enumerate(pairs) if a != g), shorter)
        return (
            f"{rid!r} output {list(actual.tokens)} ({actual.reason.value}) differs from its "
            f"golden output {list(golden.tokens)} ({golden.reason.value}) at token {first} "
            f"(prompt {list(request.prompt)}, max_new_tokens={request.max_new_tokens})"
        )
    return (
        f"{rid!r} finished with {actual.reason.value}; decoded alone it finishes with "
        f"{golden.reason.value} (output {list(golden.tokens)})"
    )
