"""Is this platform's matrix product batch-invariant for a model? A probe for parity reports and
for batch-dependent conformance violations (`DllmEngine.batch_numerics_note`).

Batch parity rests on the serving path's products (`gpu.gemm_rows.invariant_linear`) computing
each row the same whatever the number of rows beside it. That is a property of the BLAS and of
its thread count, not of the engine: on one AVX-512 CPU MKL's small-product kernel reaches 16
rows where another CPU's stops at 4, and more threads split a product otherwise (docs/engine.md,
"Batch invariance, bit for bit"). The serving path pads small products to a row count
calibrated on the device (`gpu.gemm_rows.padding_rows`); where no padding makes them
row-invariant, the report says so, so a release manager can tell the numerics of the machine
from a scheduling bug.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from gpu.gemm_rows import MOST_PADDING_ROWS, uneven_row_counts
from gpu.model import BlockDiffusionLM
from spec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class UnevenProduct:
    """A product shape whose product, padded to `padding` rows, gives some rows other bits at
    these row counts than at `most_rows` rows."""

    d_in: int
    d_out: int
    row_counts: tuple[int, ...]
    most_rows: int
    padding: int

    def describe(self) -> str:
        """One line: the shape and the row counts (the first ten, then how many more)."""
        shown = ", ".join(map(str, self.row_counts[:10]))
        more = len(self.row_counts) - 10
        rest = f" and {more} more" if more > 0 else ""
        return (
            f"d_in {self.d_in} x d_out {self.d_out} padded to {self.padding} rows: "
            f"{len(self.row_counts)} of 1..{self.most_rows} row counts differ from "
            f"{self.most_rows} rows ({shown}{rest})"
        )

    def to_json(self) -> dict[str, object]:
        """As a parity report's `uneven_products` entries."""
        return {
            "d_in": self.d_in,
            "d_out": self.d_out,
            "row_counts": list(self.row_counts),
            "most_rows": self.most_rows,
            "padding": self.padding,
        }


def uneven_products(model: BlockDiffusionLM, most_rows: int) -> tuple[UnevenProduct, ...]:
    """For each product shape of the model's serving path (`BlockDiffusionLM.product_shapes`),
    on the model's device and torch's current thread count, padded as the serving path pads it
    (`BlockDiffusionLM.product_rows`): the row counts m in 1..most_rows at which the first m
    rows of a seeded input give other bits than the same rows of the whole product
    (`gpu.gemm_rows.uneven_row_counts`). Empty: batch-invariant up to `most_rows` rows (the
    widest product of a run is its batch size times its block size). Remembered per shapes,
    device, rows, threads and padding, so a check that asks again after every failing example
    pays once."""
    if most_rows < 1:
        raise ConfigError("most_rows", most_rows, "an integer >= 1")
    device = str(next(model.parameters()).device)
    return _uneven_products(
        model.product_shapes, device, most_rows, torch.get_num_threads(), model.product_rows()
    )


@functools.lru_cache(maxsize=64)
def _uneven_products(
    shapes: tuple[tuple[int, int], ...], device: str, most_rows: int, threads: int, padding: int
) -> tuple[UnevenProduct, ...]:
    del threads  # part of the cache key only: the products below depend on it
    found: list[UnevenProduct] = []
    for d_out, d_in in shapes:
        counts = uneven_row_counts(d_out, d_in, most_rows, device, padding)
        if counts:
            found.append(UnevenProduct(d_in, d_out, counts, most_rows, padding))
    return tuple(found)


def print_uneven_products(
    found: tuple[UnevenProduct, ...], device_name: str, threads: int | None, identical: bool
) -> None:
    """The parity report's platform lines: nothing when every product was batch-invariant;
    otherwise each uneven shape on `device_name` (`gpu.device_name.device_name`: a CPU with its
    model, instruction set and thread count), and, under a mismatch, that the platform may be
    its cause (`threads`: torch's thread count, which selects the remedy)."""
    if not found:
        return
    print(f"platform: matrix products on {device_name} are not batch-invariant:")
    for product in found:
        print(f"  {product.describe()}")
    if not identical:
        remedy = (
            f"no padding of small products up to {MOST_PADDING_ROWS} rows makes them "
            "row-invariant on this device (gpu.gemm_rows)"
            if threads == 1
            else "run on one thread (--threads 1)"
        )
        print(
            f"  a mismatch above can come from these numerics rather than from scheduling: "
            f"{remedy}; see docs/engine.md, 'Batch invariance, bit for bit'"
        )
