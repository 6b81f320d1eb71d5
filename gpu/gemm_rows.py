"""Row-invariant matrix products for the serving path: small products padded to a row count
calibrated on the platform that runs them.

Batch parity on a CPU rests on a product computing each row the same whatever the number of
rows beside it. A BLAS does that from some row count up; below it another kernel (GEMV for one
row) rounds otherwise. Where that switch lies depends on the CPU, the product's shape and the
thread count: with torch 2.13.0+cpu on one thread, 4 rows on an AVX2 AMD EPYC, 16 rows for an
inner dimension of 384 on an AVX-512 Intel Xeon (docs/engine.md, "Batch invariance, bit for
bit"). A fixed constant holds only on the machines it was measured on, so the padding is
measured where it runs: `padding_rows` pads to at least `MIN_GEMM_ROWS`, and further where
this device's products need more, as found by `calibrated_rows` once per shapes, device and
thread count. Where no padding up to `MOST_PADDING_ROWS` makes them row-invariant (on many
threads the split itself depends on the row count), it keeps the floor, and the parity
report's probe (`gpu.gemm_probe`) names the products that stay uneven.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

# The floor of the padding: enough on every CPU measured so far (see above), so calibration
# changes nothing there.
MIN_GEMM_ROWS = 16
# The most rows calibration pads a product to: beyond it a one-row product would cost as much
# as a batch, and a platform that needs more is reported rather than served slowly.
MOST_PADDING_ROWS = 64
# What calibration compares against: a product of this many rows (32 seats of block 8).
REFERENCE_ROWS = 256
# Off: the padding is `MIN_GEMM_ROWS` alone (the tests turn it off to show what it mends).
CALIBRATE = True
PROBE_SEED = 20261205


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, min_rows: int) -> torch.Tensor:
    """x [..., d_in] @ weight.T with at least `min_rows` rows in the product (padded with zeros
    when fewer, the padding dropped): each row's values do not depend on how many rows the
    product has, on a platform whose products are row-invariant from `min_rows` rows up."""
    rows = x.numel() // x.shape[-1]
    if rows >= min_rows:
        return nn.functional.linear(x, weight)
    flat = x.reshape(rows, x.shape[-1])
    padded = torch.cat((flat, flat.new_zeros(min_rows - rows, x.shape[-1])))
    out = nn.functional.linear(padded, weight)[:rows]
    return out.reshape(*x.shape[:-1], weight.shape[0])


def padding_rows(shapes: tuple[tuple[int, int], ...], device: str) -> int:
    """The row count to pad products of these (d_out, d_in) shapes to on `device` at torch's
    current thread count: `MIN_GEMM_ROWS`, raised by calibration where this platform needs
    more (see the module docstring). Computed once per shapes, device, threads and floor."""
    if not CALIBRATE:
        return MIN_GEMM_ROWS
    return calibrated_rows(shapes, device, torch.get_num_threads(), MIN_GEMM_ROWS)


@functools.lru_cache(maxsize=64)
def calibrated_rows(
    shapes: tuple[tuple[int, int], ...], device: str, threads: int, floor: int
) -> int:
    """The smallest padding >= `floor` from which every row count up to `MOST_PADDING_ROWS`
    gives each row the bits of a `REFERENCE_ROWS`-row product, for every shape; `floor` when
    none up to `MOST_PADDING_ROWS` does. `threads` is torch's thread count (the caller's, part
    of the cache key: the products depend on it)."""
    del threads
    needed = floor
    for d_out, d_in in shapes:
        uneven = uneven_row_counts(d_out, d_in, REFERENCE_ROWS, device, 1, MOST_PADDING_ROWS)
        if uneven:
            needed = max(needed, uneven[-1] + 1)
    if needed > MOST_PADDING_ROWS:
        return floor
    for d_out, d_in in shapes:
        if uneven_row_counts(d_out, d_in, REFERENCE_ROWS, device, needed, MOST_PADDING_ROWS):
            return floor  # padded rows still differ: the kernel split is not by row count alone
    return needed


@torch.no_grad()
def uneven_row_counts(
    d_out: int,
    d_in: int,
    most_rows: int,
    device: str,
    min_rows: int,
    up_to: int | None = None,
) -> tuple[int, ...]:
    """The row counts m in 1..`up_to` (default `most_rows`) at which `invariant_linear` of the
    first m rows of a seeded [most_rows, d_in] input, padded to `min_rows`, with a seeded
    [d_out, d_in] weight, differs bit for bit from the same rows of the whole product, on
    `device` now (at torch's current thread count). The kernels depend on shapes, not values."""
    gen = torch.Generator().manual_seed(PROBE_SEED + d_in * 1_000 + d_out)
    weight = torch.randn(d_out, d_in, generator=gen).to(device)
    x = torch.randn(most_rows, d_in, generator=gen).to(device)
    whole = invariant_linear(x, weight, min_rows)
    last = most_rows if up_to is None else min(up_to, most_rows)
    # one host read: the flags of every row count at once
    differs = torch.stack(
        [(invariant_linear(x[:m], weight, min_rows) != whole[:m]).any() for m in range(1, last + 1)]
    ).tolist()
    return tuple(m for m, bad in enumerate(differs, start=1) if bad)


def product_shapes(d_model: int, d_ff: int, vocab_size: int) -> tuple[tuple[int, int], ...]:
    """(d_out, d_in) of each product a layer and the head run on the serving path: q, k and v
    stacked, the output projection, gate and up stacked, the down projection, the LM head."""
    shapes = (
        (3 * d_model, d_model),
        (d_model, d_model),
        (2 * d_ff, d_model),
        (d_model, d_ff),
        (vocab_size, d_model),
    )
    return tuple(dict.fromkeys(shapes))  # distinct, in order
