"""Batch-size-1 parity of the engine: FDFO (with and without in-place reuse and re-loop) against
sync, on the shipped model and the shipped prompt set (`schedspec parity`).

At max_running_requests=1 FDFO and sync run the same forwards with the same shapes, so every
request's output bytes and every forward's raw logits must be identical. For each algorithm the
prompts are run, at batch size 1, by four engines (sync, fdfo, fdfo+reuse, fdfo+reuse+reloop);
each engine's events are replayed into a `SpecMachine` (a spec violation stops the run), and
after the drain the engine's own allocator and request pool must hold nothing (no leak).

    schedspec parity --device cpu|cuda --algorithm LowConfidence|JointThreshold|all \\
        --prompts N --max-new-tokens M [--block-size B] [--page-size P] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu.algorithms import ALGORITHMS, make_algorithm
from gpu.engine import DllmEngine, resolve_device
from gpu.model import BlockDiffusionLM
from gpu.tokenizer import EOS_ID, MASK_ID, TOKENIZER
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.machine import SpecMachine
from spec.parity import encode_tokens

ASSETS = Path(__file__).resolve().parent / "assets"
PROMPTS_FILE = ASSETS / "prompts.json"


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    mode: Mode
    in_place_reuse: bool
    reloop: bool


REFERENCE = Variant("sync", Mode.SYNC, False, False)
VARIANTS: tuple[Variant, ...] = (
    REFERENCE,
    Variant("fdfo", Mode.FDFO, False, False),
    Variant("fdfo+reuse", Mode.FDFO, True, False),
    Variant("fdfo+reuse+reloop", Mode.FDFO, True, True),
)


def load_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    """The shipped prompt set (texts only)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [str(p["prompt"]) for p in data["prompts"]]


@dataclass(slots=True)
class RunResult:
    """One engine run at batch size 1: per request its output and its forwards' digests."""

    variant: str
    outputs: dict[str, tuple[int, ...]]
    digests: dict[str, list[str]]
    leaked_slots: int
    leaked_rows: int
    seconds: float


def bs1_config(block_size: int, page_size: int, max_context: int, variant: Variant) -> DllmConfig:
    """Batch size 1, one row, a pool for exactly one request; the tokenizer's MASK and EOS."""
    pages = -(-max_context // page_size)
    return DllmConfig(
        block_size=block_size,
        page_size=page_size,
        kv_pages=pages,
        req_pool_rows=1,
        max_running_requests=1,
        max_context=max_context,
        mode=variant.mode,
        in_place_reuse=variant.in_place_reuse,
        reloop=variant.reloop,
        mask_token_id=MASK_ID,
        eos_token_id=EOS_ID,
    )


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
    algorithm: str
    index: int
    prompt: str
    output: str  # the sync output, decoded
    forwards: int  # forwards of the request (sync)
    max_new_tokens: int
    identical_outputs: bool
    identical_digests: bool
    mismatched: tuple[str, ...]  # variants that differ from sync

    @property
    def identical(self) -> bool:
        return self.identical_outputs and self.identical_digests

    def to_json(self) -> dict[str, Any]:
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
        }


@dataclass(slots=True)
class ParityReport:
    device: str
    identical: bool
    leaked_slots: int
    cases: list[ParityCase] = field(default_factory=list)
    leaked_rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per algorithm/variant

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "identical": self.identical,
            "leaked_slots": self.leaked_slots,
            "cases": [c.to_json() for c in self.cases],
            "leaked_rows": self.leaked_rows,
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


def run_parity(
    device: str,
    algorithms: list[str],
    prompts: int,
    max_new_tokens: int,
    block_size: int = 8,
    page_size: int = 16,
    model: BlockDiffusionLM | None = None,
) -> ParityReport:
    """Run the parity check; `model` defaults to the shipped weights on `device`."""
    dev = resolve_device(device)
    for name in algorithms:
        if name not in ALGORITHMS:
            make_algorithm(name)  # raises UnknownAlgorithm listing the valid names
    texts = load_prompts()
    if not 1 <= prompts <= len(texts):
        raise ConfigError("prompts", prompts, f"between 1 and {len(texts)} (the shipped set)")
    texts = texts[:prompts]
    if model is None:
        from gpu.weights import load_model

        model, _ = load_model(ASSETS, dev)
    if max_new_tokens < 1:
        raise ConfigError("max_new_tokens", max_new_tokens, "an integer >= 1")
    longest = max(len(t) for t in texts) + max_new_tokens
    max_context = -(-longest // block_size) * block_size
    limit = model.config.max_context // block_size * block_size
    if max_context > limit:
        raise ConfigError(
            "max_new_tokens",
            max_new_tokens,
            f"the longest of the {len(texts)} prompts ({longest - max_new_tokens} tokens) plus "
            f"max_new_tokens needs {max_context} context tokens in blocks of {block_size}; the "
            f"model's context is {model.config.max_context}: use at most "
            f"{limit - (longest - max_new_tokens)} new tokens",
        )
    max_context = min(-(-max_context // page_size) * page_size, limit)
    requests = [
        RequestSpec(f"p{i:03d}", tuple(TOKENIZER.encode(t)), max_new_tokens)
        for i, t in enumerate(texts)
    ]
    report = ParityReport(device=str(dev), identical=True, leaked_slots=0)
    for name in algorithms:
        runs: list[RunResult] = []
        for variant in VARIANTS:
            cfg = bs1_config(block_size, page_size, max_context, variant)
            run = run_bs1(model, name, cfg, requests, dev, variant.name)
            runs.append(run)
            report.leaked_slots += run.leaked_slots
            report.leaked_rows += run.leaked_rows
            report.seconds[f"{name}/{variant.name}"] = run.seconds
        report.cases.extend(compare_runs(name, texts, runs, max_new_tokens))
    report.identical = all(c.identical for c in report.cases)
    return report


def _print_table(report: ParityReport) -> None:
    headers = ("algorithm", "#", "prompt", "fwd", "outputs", "logits", "output (sync)")
    rows = [
        (
            c.algorithm,
            str(c.index),
            c.prompt,
            str(c.forwards),
            "same" if c.identical_outputs else "DIFF " + ",".join(c.mismatched),
            "same" if c.identical_digests else "DIFF",
            c.output,
        )
        for c in report.cases
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    verdict = "IDENTICAL" if report.identical else "MISMATCH"
    print(
        f"\ndevice {report.device}: {verdict} "
        f"({sum(c.identical for c in report.cases)}/{len(report.cases)} cases; variants "
        f"{', '.join(v.name for v in VARIANTS[1:])} vs sync at batch size 1); "
        f"leaked slots {report.leaked_slots}, held rows {report.leaked_rows}"
    )


def parity_main(args: list[str]) -> int:
    """`schedspec parity ...`: prints a per-prompt table; 0 when identical and leak-free."""
    p = argparse.ArgumentParser(prog="schedspec parity", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (a typed error without CUDA)")
    p.add_argument(
        "--algorithm",
        default="all",
        choices=(*ALGORITHMS, "all"),
        help="step algorithm, or all of them",
    )
    p.add_argument("--prompts", type=int, default=32, help="prompts from the shipped set")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--json", help="write the report as JSON here")
    ns = p.parse_args(args)
    algorithms = list(ALGORITHMS) if ns.algorithm == "all" else [ns.algorithm]
    report = run_parity(
        ns.device, algorithms, ns.prompts, ns.max_new_tokens, ns.block_size, ns.page_size
    )
    _print_table(report)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    clean = report.leaked_slots == 0 and report.leaked_rows == 0
    return 0 if report.identical and clean else 1
