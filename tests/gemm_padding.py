"""Test helper: fix the serving path's product padding, with calibration off, to show what the
padding mends (`gpu.gemm_rows`)."""

from __future__ import annotations

import pytest

import gpu.gemm_rows


def pad_products_to(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Products padded to exactly `rows` rows, as on a platform where that constant was all the
    serving path had (1: no padding at all)."""
    monkeypatch.setattr(gpu.gemm_rows, "MIN_GEMM_ROWS", rows)
    monkeypatch.setattr(gpu.gemm_rows, "CALIBRATE", False)
