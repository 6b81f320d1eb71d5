"""The serving path's product padding, calibrated on the platform (`gpu.gemm_rows`): where the
fixed floor is too small for a CPU, calibration finds the padding that makes rows batch-invariant;
where no padding does, it keeps the floor and the parity probe reports it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import gpu.gemm_rows
from gpu.gemm_probe import uneven_products
from gpu.gemm_rows import (
    MOST_PADDING_ROWS,
    calibrated_rows,
    invariant_linear,
    padding_rows,
    product_shapes,
    uneven_row_counts,
)
from gpu.parity import run_parity
from gpu.weights import load_model
from tests.gemm_padding import pad_products_to
from tests.test_gpu_attention import batch_dependent_rows

torch.set_num_threads(1)

SHIPPED = load_model()[0]
SHAPES = SHIPPED.product_shapes


def _calibrate(floor: int) -> int:
    """Calibration run now, past the cache (a fake platform below must be consulted)."""
    return calibrated_rows.__wrapped__(SHAPES, "cpu", torch.get_num_threads(), floor)


def test_calibration_never_pads_below_the_floor_and_its_padding_holds() -> None:
    """From the shipped floor and from none at all, the padding chosen on this CPU makes every
    row count up to the most calibrated agree with the reference product, for every shape."""
    for floor in (1, gpu.gemm_rows.MIN_GEMM_ROWS):
        rows = _calibrate(floor)
        assert floor <= rows <= max(floor, MOST_PADDING_ROWS)
        for d_out, d_in in SHAPES:
            assert uneven_row_counts(d_out, d_in, 256, "cpu", rows, MOST_PADDING_ROWS) == (), (
                f"floor {floor}: padding {rows} leaves d_in {d_in} x d_out {d_out} uneven"
            )


def test_a_floor_too_small_for_this_cpu_is_raised_by_calibration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped constant standing at 1 (no padding: too small on every CPU measured, the
    one-row product takes GEMV): calibration pads further and the shipped model's rows are
    batch-invariant, bit for bit; with calibration off they are not (the control).

    The control decodes blocks as wide as the fewest rows the probe found uneven: which row
    counts round otherwise is the CPU's (on an AVX-512 Xeon blocks of 8 showed it; on a 2-core
    AMD EPYC only 1-3 rows round otherwise, so blocks of 8 show nothing there), and a block
    that wide puts that many rows in each product of the row run alone."""
    monkeypatch.setattr(gpu.gemm_rows, "MIN_GEMM_ROWS", 1)
    assert SHIPPED.product_rows() > 1
    assert uneven_products(SHIPPED, 128) == ()
    for block_size in (1, 8):
        assert batch_dependent_rows(SHIPPED, block_size) == []
    pad_products_to(monkeypatch, 1)
    assert SHIPPED.product_rows() == 1
    uneven = uneven_products(SHIPPED, 128)
    assert uneven != ()
    narrowest = min(min(u.row_counts) for u in uneven)
    assert batch_dependent_rows(SHIPPED, narrowest) != [], uneven


def test_with_the_floor_too_small_parity_still_holds_by_calibration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's parity run (batch 1 against batch 4, 16 new tokens) on the floor of 1:
    identical, golden, and its report's probe finds nothing uneven."""
    monkeypatch.setattr(gpu.gemm_rows, "MIN_GEMM_ROWS", 1)
    report = run_parity("cpu", ["LowConfidence"], 4, 16)
    assert report.identical and report.uneven_products == ()


def _platform(
    uneven_unpadded: tuple[int, ...], uneven_padded: tuple[int, ...]
) -> Callable[..., tuple[int, ...]]:
    """A stand-in for `uneven_row_counts` on an imagined platform: these row counts differ
    unpadded (min_rows 1), these at any larger padding."""

    def counts(
        d_out: int,
        d_in: int,
        most_rows: int,
        device: str,
        min_rows: int,
        up_to: int | None = None,
    ) -> tuple[int, ...]:
        del d_out, d_in, most_rows, device, up_to
        return uneven_unpadded if min_rows == 1 else uneven_padded

    return counts


@pytest.mark.parametrize(
    ("unpadded", "padded", "floor", "expected"),
    [
        (tuple(range(1, 24)), (), 16, 24),  # a CPU whose small kernel reaches 23 rows
        (tuple(range(1, 24)), (), 32, 32),  # the floor already covers it
        ((1, 2, 3), (), 16, 16),  # the measured CPUs: the floor, unchanged
        (tuple(range(1, MOST_PADDING_ROWS + 1)), (), 16, 16),  # reaches the cap: give up
        (tuple(range(1, 24)), (40,), 16, 16),  # padded rows still split otherwise: give up
        ((), (), 1, 1),  # a row-invariant BLAS needs no padding
    ],
)
def test_calibration_on_imagined_platforms(
    monkeypatch: pytest.MonkeyPatch,
    unpadded: tuple[int, ...],
    padded: tuple[int, ...],
    floor: int,
    expected: int,
) -> None:
    """Past the highest uneven row count when that padding holds and stays within the cap; the
    floor when the floor covers it or no padding up to the cap does (many threads: the split
    depends on the row count), so the probe reports the platform rather than slowing it."""
    monkeypatch.setattr(gpu.gemm_rows, "uneven_row_counts", _platform(unpadded, padded))
    assert _calibrate(floor) == expected


def test_the_padding_is_measured_once_per_device_and_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cached per shapes, device, threads and floor: the forward path asks on every forward."""
    calls: list[tuple[object, ...]] = []
    real = gpu.gemm_rows.uneven_row_counts

    def counting(*args: Any) -> tuple[int, ...]:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(gpu.gemm_rows, "uneven_row_counts", counting)
    shapes = product_shapes(24, 40, 7)  # shapes no other test calibrates
    first = padding_rows(shapes, "cpu")
    measured = len(calls)
    assert measured >= len(shapes) and padding_rows(shapes, "cpu") == first
    assert len(calls) == measured


def test_a_padded_product_keeps_its_shape_and_its_rows() -> None:
    """The padding's rows are dropped: the result has the input's leading shape, and each row
    equals a wide product's row on this CPU."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 24, generator=gen)
    x = torch.randn(2, 3, 24, generator=gen)
    out = invariant_linear(x, weight, 16)
    assert out.shape == (2, 3, 40)
    assert torch.allclose(out, x @ weight.T, atol=1e-5)
