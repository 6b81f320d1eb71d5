"""Is this platform's matrix product batch-invariant for a model? A probe for parity reports and
for batch-dependent conformance violations (`DllmEngine.batch_numerics_note`).

Batch parity rests on the serving path's products (`gpu.model.invariant_linear`) computing each
row the same whatever the number of rows beside it. That is a property of the BLAS and of its
thread count, not of the engine: on one AVX-512 CPU MKL's small-product kernel reaches 16 rows
where another CPU's stops at 4, and more threads split a product otherwise (docs/engine.md,
"Batch invariance, bit for bit"). When a parity run finds a mismatch, the report says whether
the platform itself breaks the property, so a release manager can tell the numerics of the
machine from a scheduling bug.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

import gpu.model
from gpu.model import BlockDiffusionLM, invariant_linear
from spec.errors import ConfigError

PROBE_SEED = 20261205


@dataclass(frozen=True, slots=True)
class UnevenProduct:
    """A weight shape whose padded product gives some rows other bits at these row counts
    than at `most_rows` rows."""

    d_in: int
    d_out: int
    row_counts: tuple[int, ...]
    most_rows: int

    def describe(self) -> str:
        """One line: the shape and the row counts (the first ten, then how many more)."""
        shown = ", ".join(map(str, self.row_counts[:10]))
        more = len(self.row_counts) - 10
        rest = f" and {more} more" if more > 0 else ""
        return (
            f"d_in {self.d_in} x d_out {self.d_out}: {len(self.row_counts)} of 1..{self.most_rows} "
            f"row counts differ from {self.most_rows} rows ({shown}{rest})"
        )

    def to_json(self) -> dict[str, object]:
        """As a parity report's `uneven_products` entries."""
        return {
            "d_in": self.d_in,
            "d_out": self.d_out,
            "row_counts": list(self.row_counts),
            "most_rows": self.most_rows,
        }


def model_weight_shapes(model: BlockDiffusionLM) -> list[tuple[int, int]]:
    """The distinct (d_out, d_in) of the model's linear layers, in module order; the serving
    path's stacked products share their parts' d_in, which is what selects the kernel."""
    shapes: list[tuple[int, int]] = []
    for module in model.modules():
        if isinstance(module, nn.Linear):
            shape = (module.out_features, module.in_features)
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def uneven_products(model: BlockDiffusionLM, most_rows: int) -> tuple[UnevenProduct, ...]:
    """For each of the model's linear shapes, on the model's device and torch's current thread
    count: the row counts m in 1..most_rows at which `invariant_linear` of the first m rows of
    a seeded [most_rows, d_in] input (and a seeded weight of that shape: the kernels depend on
    shapes, not values) differs, bit for bit, from the same rows of the whole product. Empty:
    batch-invariant up to `most_rows` rows (the widest product of a run is its batch size
    times its block size). Remembered per shapes, device, rows, threads and padding, so a
    check that asks again after every failing example pays once."""
    if most_rows < 1:
        raise ConfigError("most_rows", most_rows, "an integer >= 1")
    device = str(next(model.parameters()).device)
    return _uneven_products(
        tuple(model_weight_shapes(model)),
        device,
        most_rows,
        torch.get_num_threads(),
        gpu.model.MIN_GEMM_ROWS,
    )


@functools.lru_cache(maxsize=64)
def _uneven_products(
    shapes: tuple[tuple[int, int], ...], device: str, most_rows: int, threads: int, padding: int
) -> tuple[UnevenProduct, ...]:
    del threads, padding  # part of the cache key only: the products below depend on them
    found: list[UnevenProduct] = []
    for d_out, d_in in shapes:
        counts = uneven_row_counts(d_out, d_in, most_rows, device)
        if counts:
            found.append(UnevenProduct(d_in, d_out, counts, most_rows))
    return tuple(found)


@torch.no_grad()
def uneven_row_counts(
    d_out: int, d_in: int, most_rows: int, device: str = "cpu"
) -> tuple[int, ...]:
    """The row counts m in 1..most_rows at which `invariant_linear` of the first m rows of a
    seeded [most_rows, d_in] input, with a seeded [d_out, d_in] weight, differs bit for bit from
    the same rows of the whole product, on `device` now (torch's threads, the padding)."""
    gen = torch.Generator().manual_seed(PROBE_SEED + d_in * 1_000 + d_out)
    weight = torch.randn(d_out, d_in, generator=gen).to(device)
    x = torch.randn(most_rows, d_in, generator=gen).to(device)
    whole = invariant_linear(x, weight)
    # one host read: the flags of every row count at once
    differs = torch.stack(
        [(invariant_linear(x[:m], weight) != whole[:m]).any() for m in range(1, most_rows + 1)]
    ).tolist()
    return tuple(m for m, bad in enumerate(differs, start=1) if bad)


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
            "the padding of small products (gpu.model.MIN_GEMM_ROWS) is too small for this device"
            if threads == 1
            else "run on one thread (--threads 1)"
        )
        print(
            f"  a mismatch above can come from these numerics rather than from scheduling: "
            f"{remedy}; see docs/engine.md, 'Batch invariance, bit for bit'"
        )
