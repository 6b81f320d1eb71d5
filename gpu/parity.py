"""Parity of the engine (`schedspec parity`): batch parity, FDFO against sync, and golden
agreement, on the shipped model and the shipped prompt set.

For each algorithm the prompts are run by eight engines: sync, fdfo, fdfo+reuse and
fdfo+reuse+reloop, each at batch size 1 and at batch size `batch` (default 4). Each engine's
events are replayed into a `SpecMachine` (a spec violation stops the run) and after the drain
its allocator and request pool must hold nothing (no leak). Per prompt (a case):

- every run's output and finish reason equal the sync batch-size-1 run's (batch parity);
- at batch size 1 FDFO and sync run the same forwards with the same shapes, so every forward's
  raw logits digest must be identical too;
- the sync batch-size-1 output equals the golden decoding (`gpu.golden`: the request alone,
  dense, unpaged, unbatched, same model and algorithm), so all runs do.

The run sets batch-invariant numerics (`batch_invariant_numerics`): deterministic algorithms,
no TF32, no reduced-precision reductions, the math SDPA backend (on every device; on CPU they
change nothing that the tests would see).

With `--prefix-cache` every engine keeps committed blocks for later prompts
(`gpu.prefix_cache`; pages of one block: `--page-size` equal to `--block-size`) and every
prompt is served twice, as two cases, so the second copy reads the whole prompt blocks the first
committed (or, admitted beside it, shares its blocks through duplicate commits); the golden
decoding has no cache, so a case passes only if reading cached KV changed nothing.

    schedspec parity --device cpu|cuda --algorithm LowConfidence|JointThreshold|all \\
        --prompts N --max-new-tokens M [--batch B] [--block-size B] [--page-size P]
        [--prefix-cache] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu.algorithms import ALGORITHMS, make_algorithm
from gpu.device_name import device_name
from gpu.engine import DllmEngine, resolve_device
from gpu.gemm_probe import UnevenProduct, print_uneven_products, uneven_products
from gpu.model import BlockDiffusionLM
from gpu.prompts import ASSETS, PARITY_BLOCK_SIZE, block_context, parity_cases
from gpu.token_map import TokenMap
from gpu.tokenizer import EOS_ID, MASK_ID, TOKENIZER
from spec.adapter import EventSink
from spec.batch_parity import (
    MODE_VARIANTS,
    ModeVariant,
    VariantRun,
    batch_sizes_clause,
    compare_variants,
    golden_column,
    golden_outputs,
    golden_verdict,
    run_variant,
    timing_key,
    variant_config,
)
from spec.config import DllmConfig, RequestSpec
from spec.errors import ConfigError
from spec.machine import SpecMachine
from spec.parity import encode_tokens

# The four modes, as the shared parity driver defines them (sync first: the reference).
Variant = ModeVariant
VARIANTS: tuple[ModeVariant, ...] = MODE_VARIANTS
REFERENCE = MODE_VARIANTS[0]


@dataclass(slots=True)
class RunResult:
    """One engine run at batch size 1: per request its output and its forwards' digests."""

    variant: str
    outputs: dict[str, tuple[int, ...]]
    digests: dict[str, list[str]]
    leaked_slots: int
    leaked_rows: int
    seconds: float


def engine_config(
    block_size: int, page_size: int, max_context: int, variant: ModeVariant, batch: int = 1
) -> DllmConfig:
    """`batch` seats and rows, a pool for `batch` requests of the full context each (admission
    never waits on pages), `variant`'s mode; the tokenizer's MASK and EOS."""
    pages = -(-max_context // page_size)
    base = DllmConfig(
        block_size=block_size,
        page_size=page_size,
        kv_pages=pages,
        req_pool_rows=1,
        max_running_requests=1,
        max_context=max_context,
        mask_token_id=MASK_ID,
        eos_token_id=EOS_ID,
    )
    return variant_config(base, variant, batch)


def bs1_config(
    block_size: int, page_size: int, max_context: int, variant: ModeVariant
) -> DllmConfig:
    """Batch size 1, one row, a pool for exactly one request; the tokenizer's MASK and EOS."""
    return engine_config(block_size, page_size, max_context, variant, 1)


def run_bs1(
    model: BlockDiffusionLM,
    algorithm: str,
    config: DllmConfig,
    requests: Sequence[RequestSpec],
    device: torch.device,
    variant: str = "",
    algorithm_params: Mapping[str, object] | None = None,
) -> RunResult:
    """Run `requests` through one engine (events checked by a SpecMachine) and drain."""
    machine = SpecMachine(config)
    engine = DllmEngine(
        config,
        machine.apply,
        model=model,
        algorithm=make_algorithm(algorithm, algorithm_params or {}),
        device=device,
        record=True,
    )
    start = time.perf_counter()
    for req in requests:
        engine.submit(req)
    engine.drain()
    seconds = time.perf_counter() - start
    machine.check_snapshot(engine.snapshot())
    digests: dict[str, list[str]] = {r.request_id: [] for r in requests}
    for rec in engine.forward_log:
        for rid, _ in rec.rows:
            digests[rid].append(rec.digest or "")
    snap = engine.snapshot()
    return RunResult(
        variant or config.mode.value,
        dict(engine.outputs),
        digests,
        snap.leaked_slots(),
        snap.held_rows(),
        seconds,
    )


@dataclass(frozen=True, slots=True)
class ParityCase:
    """One prompt under one algorithm: the sync batch-size-1 output and how the runs agree."""

    algorithm: str
    index: int
    prompt: str
    output: str  # the sync batch-size-1 output, decoded
    forwards: int  # forwards of the request (sync, batch size 1)
    max_new_tokens: int
    identical_outputs: bool  # every run (every mode, every batch size) equals sync at bs 1
    identical_digests: bool  # every batch-size-1 run's logits digests equal sync's
    mismatched: tuple[str, ...]  # runs that differ from sync at batch size 1
    golden: bool | None = None  # the output equals the golden decoding (None: not checked)
    golden_detail: str = ""  # how it differs from the golden output, or agrees past ties
    golden_ties: int = 0  # near-ties taken the other way to agree (spec.batch_parity)

    @property
    def identical(self) -> bool:
        """Every run's output and every batch-size-1 run's digests equal sync's."""
        return self.identical_outputs and self.identical_digests

    def to_json(self) -> dict[str, Any]:
        """The case as the report's `cases` hold it, with `identical` spelled out."""
        return {
            "algorithm": self.algorithm,
            "index": self.index,
            "prompt": self.prompt,
            "output": self.output,
            "forwards": self.forwards,
            "max_new_tokens": self.max_new_tokens,
            "identical": self.identical,
            "identical_outputs": self.identical_outputs,
            "identical_digests": self.identical_digests,
            "mismatched": list(self.mismatched),
            "golden": self.golden,
            "golden_detail": self.golden_detail,
            "golden_ties": self.golden_ties,
        }


@dataclass(slots=True)
class ParityReport:
    """A parity run: every case, the summary verdict, leaks, timings and numerics in force."""

    device: str
    identical: bool
    leaked_slots: int
    cases: list[ParityCase] = field(default_factory=list)
    leaked_rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per algorithm/run
    impl: str = "engine"
    # 1 and the widest forward of the batched runs, the narrowest over the algorithms run
    batch_sizes: tuple[int, ...] = (1,)
    widest_forward: int = 0  # the widest forward of any run (the rows the probe covers)
    numerics: dict[str, str] = field(default_factory=dict)  # batch-invariant settings in force
    threads: int = 0  # torch's intra-op threads during the run (host-side work on CUDA)
    prefix_cache: bool = False  # every engine kept committed blocks for later prompts
    cache_hits: int = 0  # prompt blocks the runs read from their caches instead of computing
    # the model's products that are not batch-invariant on this platform (gpu.gemm_probe)
    uneven_products: tuple[UnevenProduct, ...] = ()
    product_rows: int = 0  # the rows small products were padded to (gpu.gemm_rows)
    device_name: str = ""  # gpu.device_name: the CPU's model and instruction set, or GPU

    @property
    def golden(self) -> bool:
        """At least one case, and every case's golden check ran and agreed (`golden is True`)."""
        return bool(self.cases) and all(c.golden is True for c in self.cases)

    def to_json(self) -> dict[str, Any]:
        """The report as `--json` writes it and `schedspec release-check` reads it."""
        return {
            "impl": self.impl,
            "device": self.device,
            "device_name": self.device_name,
            "identical": self.identical,
            "golden": self.golden,
            "batch_sizes": list(self.batch_sizes),
            "leaked_slots": self.leaked_slots,
            "cases": [c.to_json() for c in self.cases],
            "leaked_rows": self.leaked_rows,
            "numerics": dict(self.numerics),
            "threads": self.threads,
            "prefix_cache": self.prefix_cache,
            "cache_hits": self.cache_hits,
            "uneven_products": [u.to_json() for u in self.uneven_products],
            "product_rows": self.product_rows,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }


def compare_runs(
    algorithm: str, prompts: Sequence[str], runs: Sequence[RunResult], max_new_tokens: int
) -> list[ParityCase]:
    """One case per prompt: every run's output bytes and digests against the first (sync)."""
    ref = runs[0]
    cases: list[ParityCase] = []
    for i, prompt in enumerate(prompts):
        rid = f"p{i:03d}"
        want = encode_tokens(ref.outputs.get(rid, ()))
        bad_out = [r.variant for r in runs[1:] if encode_tokens(r.outputs.get(rid, ())) != want]
        bad_dig = [r.variant for r in runs[1:] if r.digests.get(rid) != ref.digests.get(rid)]
        cases.append(
            ParityCase(
                algorithm=algorithm,
                index=i,
                prompt=prompt,
                output=TOKENIZER.decode(ref.outputs.get(rid, ()), stop_at_eos=True),
                forwards=len(ref.digests.get(rid, [])),
                max_new_tokens=max_new_tokens,
                identical_outputs=not bad_out and rid in ref.outputs,
                identical_digests=not bad_dig,
                mismatched=tuple(sorted(set(bad_out) | set(bad_dig))),
            )
        )
    return cases


# What `batch_invariant_numerics` sets (recorded in the report).
NUMERICS = {
    # warn_only: an op without a deterministic kernel warns instead of stopping the run (the
    # outputs are compared exactly anyway)
    "deterministic_algorithms": "torch.use_deterministic_algorithms(True, warn_only=True)",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "tf32": "off (torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False)",
    "reduced_precision_reduction": "off (fp16 and bf16)",
    "float32_matmul_precision": "highest",
    "sdpa_backend": "math",
}


@contextlib.contextmanager
def batch_invariant_numerics() -> Iterator[dict[str, str]]:
    """Set the numerics that make a device's kernels deterministic and batch-invariant as far
    as torch allows (see NUMERICS), and restore the previous ones afterwards."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", NUMERICS["CUBLAS_WORKSPACE_CONFIG"])
    matmul = torch.backends.cuda.matmul
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
        torch.get_float32_matmul_precision(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield dict(NUMERICS)
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        matmul.allow_tf32 = saved[2]
        torch.backends.cudnn.allow_tf32 = saved[3]
        matmul.allow_fp16_reduced_precision_reduction = saved[4]
        matmul.allow_bf16_reduced_precision_reduction = saved[5]
        torch.set_float32_matmul_precision(saved[6])


def _engine_factory(
    model: BlockDiffusionLM, algorithm: str, device: torch.device
) -> Callable[[DllmConfig, EventSink], DllmEngine]:
    def factory(config: DllmConfig, sink: EventSink) -> DllmEngine:
        return DllmEngine(
            config,
            sink,
            model=model,
            algorithm=make_algorithm(algorithm),
            device=device,
            record=True,
        )

    return factory


def _digests(run: VariantRun, requests: Sequence[RequestSpec]) -> dict[str, list[str]]:
    digests: dict[str, list[str]] = {r.request_id: [] for r in requests}
    engine = run.adapter
    if isinstance(engine, DllmEngine):
        for rec in engine.forward_log:
            for rid, _ in rec.rows:
                digests[rid].append(rec.digest or "")
    return digests


def run_algorithm(
    model: BlockDiffusionLM,
    algorithm: str,
    base: DllmConfig,
    texts: Sequence[str],
    requests: Sequence[RequestSpec],
    device: torch.device,
    batch: int,
    report: ParityReport,
) -> list[ParityCase]:
    """Every mode at batch size 1 and `batch` for one algorithm; its cases (leaks, timings and
    the batch sizes reached are added to `report`)."""
    factory = _engine_factory(model, algorithm, device)
    runs: list[VariantRun] = []
    seconds: list[tuple[str, int, float]] = []  # mode, batch-size setting, wall seconds
    for size in (1, batch):
        for variant in MODE_VARIANTS:
            start = time.perf_counter()
            name = f"{variant.name}@{size}"
            run = run_variant(factory, variant_config(base, variant, size), requests, name)
            seconds.append((variant.name, size, time.perf_counter() - start))
            report.leaked_slots += run.leaked_slots
            report.leaked_rows += run.leaked_rows
            engine = run.adapter
            if isinstance(engine, DllmEngine) and engine.prefix_cache is not None:
                report.cache_hits += engine.prefix_cache.hits
            runs.append(run)
    widest = max(r.widest_forward for r in runs if r.batch == batch)
    # the summary's batch size is one every algorithm reached: the narrowest of their widest
    report.batch_sizes = (1, min((widest, *report.batch_sizes[1:])))
    report.widest_forward = max(report.widest_forward, widest)
    # a run is named in the report by the batch size it ran at, as its timing key is
    ran_as = {f"{m}@{size}": timing_key(m, size, widest) for m, size, _ in seconds}
    for mode, size, took in seconds:
        report.seconds[f"{algorithm}/{ran_as[f'{mode}@{size}']}"] = took
    golden = golden_outputs(runs[0].adapter, requests)
    verdicts = compare_variants(requests, runs, golden)
    ref_digests = _digests(runs[0], requests)
    bs1 = [(r.name, _digests(r, requests)) for r in runs[1:] if r.batch == 1]
    cases: list[ParityCase] = []
    for i, (text, verdict) in enumerate(zip(texts, verdicts, strict=True)):
        rid = verdict.request.request_id
        bad_digests = [name for name, d in bs1 if d[rid] != ref_digests[rid]]
        output = verdict.output.tokens if verdict.output is not None else ()
        internal = TokenMap(base, model.config.vocab_size, MASK_ID, EOS_ID).to_internal(output)
        cases.append(
            ParityCase(
                algorithm=algorithm,
                index=i,
                prompt=text,
                output=TOKENIZER.decode(internal, stop_at_eos=True),
                forwards=len(ref_digests[rid]),
                max_new_tokens=verdict.request.max_new_tokens,
                identical_outputs=verdict.identical_outputs,
                identical_digests=not bad_digests,
                mismatched=tuple(
                    sorted(ran_as[name] for name in set(verdict.mismatched) | set(bad_digests))
                ),
                golden=verdict.golden,
                golden_detail=verdict.golden_detail,
                golden_ties=verdict.golden_ties,
            )
        )
    return cases


def run_parity(
    device: str,
    algorithms: list[str],
    prompts: int | None,
    max_new_tokens: int,
    block_size: int = PARITY_BLOCK_SIZE,
    page_size: int = 16,
    model: BlockDiffusionLM | None = None,
    batch: int = 4,
    prefix_cache: bool = False,
) -> ParityReport:
    """Run the parity check on the first `prompts` distinct shipped prompts (None: all of
    them); `model` defaults to the shipped weights on `device`; with `prefix_cache`, every
    engine keeps committed blocks (page_size must equal block_size: the engine's
    `ConfigError` otherwise)."""
    dev = resolve_device(device)
    for name in algorithms:
        if name not in ALGORITHMS:
            make_algorithm(name)  # raises UnknownAlgorithm listing the valid names
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 2:
        raise ConfigError("batch", batch, "an integer >= 2 (batch size 1 always runs)")
    texts = parity_cases(prompts)
    if prefix_cache:  # each prompt twice: the second copy reads what the first one cached
        texts = [t for t in texts for _ in range(2)]
    if model is None:
        from gpu.weights import load_model

        model, _ = load_model(ASSETS, dev)
    if max_new_tokens < 1:
        raise ConfigError("max_new_tokens", max_new_tokens, "an integer >= 1")
    max_context = block_context(
        [len(t) for t in texts], max_new_tokens, block_size, model.config.max_context
    )
    limit = model.config.max_context // block_size * block_size
    max_context = min(-(-max_context // page_size) * page_size, limit)
    requests = [
        RequestSpec(f"p{i:03d}", tuple(TOKENIZER.encode(t)), max_new_tokens)
        for i, t in enumerate(texts)
    ]
    base = bs1_config(block_size, page_size, max_context, REFERENCE).replace(
        prefix_cache=prefix_cache
    )
    report = ParityReport(
        device=str(dev),
        identical=True,
        leaked_slots=0,
        threads=torch.get_num_threads(),
        prefix_cache=prefix_cache,
        device_name=device_name(dev),
    )
    with batch_invariant_numerics() as numerics:
        report.numerics = numerics
        for name in algorithms:
            report.cases.extend(
                run_algorithm(model, name, base, texts, requests, dev, batch, report)
            )
        report.uneven_products = uneven_products(model, report.widest_forward * block_size)
        report.product_rows = model.product_rows()
    report.identical = all(c.identical for c in report.cases)
    return report


def _print_table(report: ParityReport) -> None:
    headers = ("algorithm", "#", "prompt", "fwd", "outputs", "logits", "golden", "output (sync)")
    rows = [
        (
            c.algorithm,
            str(c.index),
            c.prompt,
            str(c.forwards),
            "same" if c.identical_outputs else "DIFF " + ",".join(c.mismatched),
            "same" if c.identical_digests else "DIFF",
            golden_column(c.golden, c.golden_ties),
            c.output,
        )
        for c in report.cases
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    for c in report.cases:
        if c.golden_detail:
            print(f"golden {c.algorithm} #{c.index}: {c.golden_detail}")
    verdict = "IDENTICAL" if report.identical else "MISMATCH"
    golden = golden_verdict(report.golden, [c.golden_ties for c in report.cases])
    print(
        f"\ndevice {report.device}: {verdict}, {golden} "
        f"({sum(c.identical for c in report.cases)}/{len(report.cases)} cases identical; "
        f"{batch_sizes_clause(report.batch_sizes)}; logits digests at batch size 1); "
        f"leaked slots {report.leaked_slots}, held rows "
        f"{report.leaked_rows}"
        + (
            f"; prefix cache on, {report.cache_hits} prompt blocks read from it"
            if report.prefix_cache
            else ""
        )
    )
    print_uneven_products(
        report.uneven_products, report.device_name, report.threads, report.identical
    )


def parity_main(args: list[str]) -> int:
    """`schedspec parity ...`: prints a per-prompt table; 0 when identical, golden agrees and
    nothing leaked."""
    p = argparse.ArgumentParser(prog="schedspec parity", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (a typed error without CUDA)")
    p.add_argument(
        "--algorithm",
        default="all",
        choices=(*ALGORITHMS, "all"),
        help="step algorithm, or all of them",
    )
    p.add_argument(
        "--prompts", type=int, default=None, help="distinct shipped prompts (default: all)"
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--batch", type=int, default=4, help="the batch size > 1 (default 4)")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="every engine keeps committed blocks for later prompts (needs --page-size equal "
        "to --block-size)",
    )
    p.add_argument("--json", help="write the report as JSON here")
    p.add_argument("--impl", default="engine", help="only 'engine' here (the CLI routes others)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ns = p.parse_args(args)
    if ns.threads > 0:
        torch.set_num_threads(ns.threads)
    algorithms = list(ALGORITHMS) if ns.algorithm == "all" else [ns.algorithm]
    report = run_parity(
        ns.device,
        algorithms,
        ns.prompts,
        ns.max_new_tokens,
        ns.block_size,
        ns.page_size,
        batch=ns.batch,
        prefix_cache=ns.prefix_cache,
    )
    _print_table(report)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    clean = report.leaked_slots == 0 and report.leaked_rows == 0
    return 0 if report.identical and report.golden and clean else 1
