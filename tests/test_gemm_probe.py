"""The platform probe (`gpu.gemm_probe`): whether the model's padded products are batch-invariant
on the CPU the suite runs on, and how a parity report and a batch-dependent conformance
violation (`spec.batch_numerics`) say it when not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import gpu.model
from gpu.device_name import device_name
from gpu.engine import DllmEngine, _algorithm
from gpu.gemm_probe import UnevenProduct, print_uneven_products, uneven_products
from gpu.gemm_rows import invariant_linear
from gpu.parity import run_parity
from gpu.weights import load_model
from properties.harness import Harness
from schedspec_cli.main import main
from spec.adapter import EventSink, ImplementationFactory
from spec.batch_numerics import ReportsBatchNumerics, batch_numerics_note
from spec.config import DllmConfig
from spec.errors import ConfigError, SpecViolation
from tests.gemm_padding import pad_products_to
from tests.test_engine_mutants import PaddedContextLeaks, _golden_workload, golden_config

torch.set_num_threads(1)

SHIPPED = load_model()[0]


def test_the_probe_reads_every_product_shape_of_the_serving_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`product_shapes` names exactly the (d_out, d_in) of the products one serving forward
    runs (the stacked ones as stacked), so the padding is calibrated on what runs."""
    cfg = SHIPPED.config
    d, ff = cfg.d_model, cfg.d_ff
    assert SHIPPED.product_shapes == ((3 * d, d), (d, d), (2 * ff, d), (d, ff), (cfg.vocab_size, d))
    seen: list[tuple[int, int]] = []

    def recording(x: torch.Tensor, weight: torch.Tensor, min_rows: int) -> torch.Tensor:
        seen.append((weight.shape[0], weight.shape[1]))
        return invariant_linear(x, weight, min_rows)

    monkeypatch.setattr(gpu.model, "invariant_linear", recording)
    engine = _engine()(_config(), lambda event: None)
    engine.submit(_golden_workload()[0])
    engine.run_round()
    assert tuple(dict.fromkeys(seen)) == SHIPPED.product_shapes


def test_the_shipped_models_products_are_batch_invariant_here() -> None:
    """What batch parity on this CPU rests on: no row count up to 16 seats of block 8 changes a
    row's bits, on one thread."""
    assert uneven_products(SHIPPED, 128) == ()


def test_without_the_padding_the_probe_names_each_shape_and_row_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pad_products_to(monkeypatch, 1)
    found = uneven_products(SHIPPED, 16)
    # a one-row product takes another kernel (GEMV) on every CPU measured
    assert [(u.d_in, u.d_out) for u in found if 1 in u.row_counts] == [
        (d_in, d_out) for d_out, d_in in SHIPPED.product_shapes
    ]
    line = found[0].describe()
    assert line.startswith(f"d_in {found[0].d_in} x d_out {found[0].d_out} padded to 1 rows: ")
    assert "row counts differ from 16 rows (1" in line


def test_a_probe_of_no_rows_is_refused_with_what_is_valid() -> None:
    with pytest.raises(ConfigError, match=r"most_rows=0: .*an integer >= 1"):
        uneven_products(SHIPPED, 0)


def test_a_long_list_of_row_counts_is_cut_to_ten() -> None:
    line = UnevenProduct(384, 128, tuple(range(1, 16)), 128, 4).describe()
    assert line == (
        "d_in 384 x d_out 128 padded to 4 rows: 15 of 1..128 row counts differ from 128 rows "
        "(1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 5 more)"
    )


@pytest.mark.parametrize(
    ("threads", "identical", "remedy"),
    [
        (1, False, "no padding of small products up to 64 rows makes them row-invariant"),
        (3, False, "run on one thread (--threads 1)"),
        (1, True, None),
    ],
)
def test_the_printed_lines_name_the_platform_and_under_a_mismatch_a_remedy(
    threads: int, identical: bool, remedy: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    found = (UnevenProduct(128, 49, (1, 2), 32, 16),)
    print_uneven_products(
        found, "cpu (Test CPU, AVX512; torch 2.13.0+cpu, 1 thread)", threads, identical
    )
    out = capsys.readouterr().out
    assert out.startswith(
        "platform: matrix products on cpu (Test CPU, AVX512; torch 2.13.0+cpu, 1 thread) are not "
        "batch-invariant:\n"
    )
    assert "  d_in 128 x d_out 49 padded to 16 rows: 2 of 1..32 row counts differ" in out
    if remedy is None:
        assert "mismatch" not in out
    else:
        assert remedy in out
    print_uneven_products((), "cpu", threads, identical)
    assert capsys.readouterr().out == ""


def test_the_engines_parity_report_carries_the_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Empty with the padding in place; without it the report (and its JSON) names the
    products, probed up to the widest forward's rows."""
    report = run_parity("cpu", ["LowConfidence"], 2, 8)
    assert report.uneven_products == () and report.to_json()["uneven_products"] == []
    assert report.to_json()["device_name"] == device_name(torch.device("cpu"))
    assert report.to_json()["product_rows"] == SHIPPED.product_rows() >= 16
    pad_products_to(monkeypatch, 1)
    report = run_parity("cpu", ["LowConfidence"], 2, 8)
    widest = max(report.batch_sizes) * 8
    assert report.uneven_products
    assert all(u.most_rows == widest for u in report.uneven_products)
    written = report.to_json()["uneven_products"]
    assert written[0]["most_rows"] == widest and 1 in written[0]["row_counts"]
    assert written[0]["padding"] == 1 and report.to_json()["product_rows"] == 1


def test_the_impl_parity_of_a_torch_engine_carries_it_and_a_torch_free_one_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pad_products_to(monkeypatch, 1)
    out = tmp_path / "lof.json"
    argv = ["parity", "--impl", "engine-lof", "--prompts", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--json", str(out)]) in (0, 1)
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["uneven_products"] and 1 in report["uneven_products"][0]["row_counts"]
    assert report["product_rows"] == 1
    printed = capsys.readouterr().out
    assert "platform: matrix products on cpu (" in printed and "1 thread) are not" in printed
    ref = tmp_path / "ref.json"
    argv = ["parity", "--impl", "reference-dllm", "--prompts", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--json", str(ref)]) == 0
    written = json.loads(ref.read_text(encoding="utf-8"))
    assert written["uneven_products"] == [] and written["product_rows"] is None
    assert "platform:" not in capsys.readouterr().out


# ---------------------------------------------------------------- in the conformance checks
def _config() -> DllmConfig:
    return golden_config("sync")


def _engine(cls: type[DllmEngine] = DllmEngine) -> ImplementationFactory:
    def build(config: DllmConfig, sink: EventSink) -> DllmEngine:
        return cls(config, sink, model=SHIPPED, algorithm=_algorithm("LowConfidence"), record=True)

    return build


def test_the_engine_reports_its_batch_numerics(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine answers `ReportsBatchNumerics` for its widest forward (4 seats of block 4):
    nothing here; without the padding, each uneven shape on this device, as a possible cause."""
    engine = _engine()(_config(), lambda event: None)
    assert isinstance(engine, ReportsBatchNumerics)
    assert batch_numerics_note(engine, _config()) == ""
    pad_products_to(monkeypatch, 1)
    note = batch_numerics_note(engine, _config())
    assert note.startswith(f"; matrix products on {device_name(torch.device('cpu'))} are not ")
    assert "(d_in 128 x d_out 384 padded to 1 rows: " in note
    assert "of 1..16 row counts differ" in note
    assert note.endswith("rather than from scheduling")


def test_an_implementation_that_cannot_probe_adds_nothing() -> None:
    assert batch_numerics_note(object(), _config()) == ""


def _violation(cls: type[DllmEngine]) -> SpecViolation:
    harness = Harness(_engine(cls), _config())
    with pytest.raises(SpecViolation) as caught:
        for request in _golden_workload():
            harness.submit(request)
        harness.drain()
    return caught.value


def test_a_batch_dependent_violation_names_uneven_numerics_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch bug (every row attends to the batch's longest context) fails `golden_output`;
    its report adds the platform's numerics only where they are not batch-invariant."""
    plain = _violation(PaddedContextLeaks)
    assert plain.rule == "golden_output" and "matrix products" not in str(plain)
    pad_products_to(monkeypatch, 1)
    noted = _violation(PaddedContextLeaks)
    assert noted.rule == "golden_output"
    assert "; matrix products on cpu (" in str(noted) and "rather than from scheduling" in str(
        noted
    )
