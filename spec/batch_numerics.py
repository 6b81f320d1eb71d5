"""An implementation that can say whether its platform's arithmetic depends on the batch.

Batch parity (every output equal to the request's solo output) needs each row computed the same
whatever rows share its batch. An engine gets that from its kernels, and on some platforms the
kernels do not give it: a matrix product may take another kernel, which rounds otherwise, below
some row count, or split its work otherwise on more threads. An implementation that can probe
this (`ReportsBatchNumerics`) lets a batch-dependent violation say so, so that the platform's
numerics are not read as a scheduling bug; one that cannot is reported as before.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from spec.config import DllmConfig


@runtime_checkable
class ReportsBatchNumerics(Protocol):
    """An implementation that can tell whether its arithmetic is batch-invariant here."""

    def batch_numerics_note(self, most_rows: int) -> str:
        """'' when every computation of a row, in batches of up to `most_rows` rows (a
        forward's rows: running requests times block size), gives the same bits whatever the
        batch; otherwise one line saying where it does not, on this platform."""
        ...


def batch_numerics_note(adapter: object, config: DllmConfig) -> str:
    """What to add to the report of a batch-dependent violation (`fdfo_sync_parity`,
    `golden_output`) under `config`: '' unless `adapter` reports batch numerics and they are not
    batch-invariant up to its widest forward; then '; ' and its line, read as a possible
    cause."""
    if not isinstance(adapter, ReportsBatchNumerics):
        return ""
    note = adapter.batch_numerics_note(config.max_running_requests * config.block_size)
    return f"; {note}" if note else ""
