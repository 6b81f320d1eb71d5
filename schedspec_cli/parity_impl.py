"""`schedspec parity --impl NAME|module:factory`: batch parity and golden agreement of any dLLM
implementation (the engine's own run, with logits digests and the shipped model, is
`gpu.parity`).

The implementation runs `--prompts` seeded prompts over token ids 0..14 (mask -1, EOS 15, the
conformance suite's ids) in every mode at batch size 1 and at `--batch`; see
`spec.batch_parity`. Per case: every run equals sync at batch size 1 (outputs and finish
reasons), and when the implementation provides `golden_output` the output equals it. After
every drain no KV slot and no row may be left in use. The JSON has the engine report's form,
with `impl` naming the implementation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from properties.deadline import CallDeadlineExceeded, call_deadline, call_timeout_set
from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from schedspec_cli.impls import activated_engines, engine_line, release_driven, resolve
from schedspec_cli.meta import run_metadata
from schedspec_cli.registry import BUILTINS
from schedspec_cli.torch_threads import pin_torch_threads, torch_threads_now
from spec.batch_parity import (
    MODE_VARIANTS,
    ModeVariant,
    VariantRun,
    batch_sizes_clause,
    compare_variants,
    context_for,
    golden_column,
    golden_outputs,
    golden_verdict,
    run_variant,
    timing_key,
    variant_config,
)
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, SchedSpecError, SpecViolation
from spec.implementation import DllmImplementation
from spec.profile import DllmConfigSpace

MASK, EOS, VOCAB = -1, 15, 16
SEED = 12

T = TypeVar("T")


def _guarded(impl: str, what: str, operation: Callable[[], T]) -> T:
    """Run the implementation's code under the deadline (`--run-timeout`); an exception of its
    own (not the spec's, not a typed schedspec error) becomes an `implementation_error`
    violation naming the run and the line that raised, a run past the deadline a `progress`
    violation, so the user sees exit status 1 and one paragraph instead of a traceback or a
    hang."""
    try:
        with call_deadline(what):
            return operation()
    except CallDeadlineExceeded as hang:
        raise SpecViolation(
            "progress",
            f"{impl} did not finish {what} within {hang.seconds:g} s (a hang: an endless loop "
            f"or a wait that never ends; the limit is --run-timeout)",
        ) from None
    except (SchedSpecError, KeyboardInterrupt):
        raise
    except (Exception, SystemExit) as err:  # an implementation's sys.exit() must not pass
        frames = traceback.extract_tb(err.__traceback__)
        where = f", at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
        raise SpecViolation(
            "implementation_error",
            f"{impl} raised {type(err).__name__}: {err} (during {what}{where})",
        ) from err


def platform_products(adapter: object, most_rows: int) -> dict[str, object]:
    """For one of this project's torch engines (`gpu.engine.DllmEngine`): the device it ran on
    (`device`: the CPU for this project's built-ins, which load the model there), the rows its model
    pads small products to on this platform (`product_rows`, `gpu.gemm_rows`) and the products
    that are still not batch-invariant (`uneven_products`, `gpu.gemm_probe`), as JSON; for any
    other implementation `cpu` (it runs in this process), `None` and `[]`, and torch is never
    imported here."""
    engine_module = sys.modules.get("gpu.engine")
    if engine_module is None or not isinstance(adapter, engine_module.DllmEngine):
        return {"device": "cpu", "product_rows": None, "uneven_products": []}
    from gpu.gemm_probe import uneven_products

    found = uneven_products(adapter.model, most_rows)
    return {
        "device": str(adapter.device),  # where the adapter's model runs
        "product_rows": adapter.model.product_rows(),
        "uneven_products": [product.to_json() for product in found],
    }


def parity_prompts(n: int, max_new_tokens: int) -> list[RequestSpec]:
    """`n` distinct seeded prompts of 1..24 ids in [0, EOS), each with `max_new_tokens`."""
    rng = random.Random(SEED)
    seen: set[tuple[int, ...]] = set()
    out: list[RequestSpec] = []
    while len(out) < n:
        prompt = tuple(rng.randrange(0, EOS) for _ in range(rng.randint(1, 24)))
        if prompt not in seen:
            seen.add(prompt)
            out.append(RequestSpec(f"p{len(out):03d}", prompt, max_new_tokens))
    return out


# the fields a profile may exclude a whole mode variant by; any other field outside the space
# (the page size, say) comes from the command's flags and is refused naming the flag
_VARIANT_FIELDS = frozenset({"mode", "in_place_reuse", "reloop"})


def declared_runs(
    name: str, space: DllmConfigSpace, base: DllmConfig, size: int
) -> list[tuple[ModeVariant, DllmConfig]]:
    """The mode variants (`spec.batch_parity.MODE_VARIANTS`) `space` declares, each with its
    config at `size` seats, its pool raised to the space's least (`min_kv_pages`: SGLang's
    headroom). Sync, the reference, and one FDFO variant at least must be declared: parity
    compares FDFO with sync (`ConfigError` naming the implementation otherwise); a flag's value
    outside the space is a `ConfigError` naming the flag."""
    runs: list[tuple[ModeVariant, DllmConfig]] = []
    for variant in MODE_VARIANTS:
        config = variant_config(base, variant, size)
        config = config.replace(kv_pages=max(config.kv_pages, space.min_kv_pages(config)))
        outside = space.outside(config)
        if outside is None:
            runs.append((variant, config))
        elif outside[0] not in _VARIANT_FIELDS:
            field, value, valid = outside
            raise ConfigError(
                f"--{field.replace('_', '-')}", value, f"a value {name} declares: {valid}"
            )
    modes = {config.mode for _, config in runs}
    if Mode.SYNC not in modes or Mode.FDFO not in modes:
        declared = ", ".join(variant.name for variant, _ in runs) or "none of them"
        raise ConfigError(
            "impl",
            name,
            "an implementation that runs sync and FDFO (parity compares FDFO's outputs with "
            f"sync's); of {', '.join(v.name for v in MODE_VARIANTS)} it declares {declared}",
        )
    return runs


def _provenance(name: str, active: frozenset[str]) -> dict[str, Any]:
    """The real engine `name` drove, if any (a built-in's, or the one its run activated), and
    the run's metadata."""
    engine = release_driven(BUILTINS.get(name), active)
    provenance: dict[str, Any] = {"run": run_metadata(with_device=False)}
    if engine is not None:
        provenance["engine"] = engine
    return provenance


def _write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def run_impl_parity(name: str, ns: argparse.Namespace) -> dict[str, Any]:
    """The report (JSON-ready) of `name`'s parity run with the parsed flags `ns`."""
    resolved = resolve(name, "dllm")
    impl = resolved.implementation
    if not isinstance(impl, DllmImplementation):
        raise ConfigError("impl", name, "a dLLM implementation (parity compares block outputs)")
    pin_torch_threads(ns.threads)  # after loading: an engine's torch is imported by now
    requests = parity_prompts(ns.prompts, ns.max_new_tokens)
    context = context_for(requests, ns.block_size, ns.page_size)
    base = DllmConfig(
        block_size=ns.block_size,
        page_size=ns.page_size,
        max_context=context,
        mask_token_id=MASK,
        eos_token_id=EOS,
        # an implementation that always runs with a prefix cache (`engine-cached`) keeps it on
        prefix_cache=False not in impl.profile.space.prefix_cache,
    )
    runs: list[VariantRun] = []
    took: list[tuple[str, int, float]] = []  # mode, batch-size setting, wall seconds
    for size in (1, ns.batch):
        for variant, config in declared_runs(resolved.name, impl.profile.space, base, size):
            run_name = f"{variant.name}@{size}"
            start = time.perf_counter()
            runs.append(
                _guarded(
                    resolved.name,
                    f"the {run_name} run",
                    partial(
                        run_variant, impl.factory, config, requests, run_name, impl.profile.policy
                    ),
                )
            )
            took.append((variant.name, size, round(time.perf_counter() - start, 3)))
    reference = runs[0].adapter
    golden = _guarded(resolved.name, "golden_output", partial(golden_outputs, reference, requests))
    # the comparison runs the implementation's golden_output_past_ties, where one differs
    verdicts = _guarded(
        resolved.name,
        "golden_output_past_ties",
        partial(compare_variants, requests, runs, golden),
    )
    widest = max(r.widest_forward for r in runs if r.batch == ns.batch)
    # a run is named in the report by the batch size it ran at, as its timing key is
    ran_as = {f"{mode}@{size}": timing_key(mode, size, widest) for mode, size, _ in took}
    cases = [
        {
            "algorithm": resolved.name,
            "index": i,
            "prompt": " ".join(map(str, v.request.prompt)),
            "output": " ".join(map(str, v.output.tokens)) if v.output else "",
            "max_new_tokens": v.request.max_new_tokens,
            "identical": v.identical_outputs,
            "identical_outputs": v.identical_outputs,
            "mismatched": [ran_as[name] for name in v.mismatched],
            "golden": v.golden,
            "golden_detail": v.golden_detail,
            "golden_ties": v.golden_ties,
        }
        for i, v in enumerate(verdicts)
    ]
    seconds = {ran_as[f"{mode}@{size}"]: t for mode, size, t in took}
    return {
        "impl": resolved.name,
        "prefix_cache": base.prefix_cache,
        "identical": all(c["identical"] for c in cases),
        "golden": golden is not None and all(c["golden"] is True for c in cases),
        "golden_checked": golden is not None,
        "batch_sizes": [1, widest],
        "leaked_slots": sum(r.leaked_slots for r in runs),
        "leaked_rows": sum(r.leaked_rows for r in runs),
        "threads": torch_threads_now(),
        **platform_products(reference, widest * ns.block_size),
        "cases": cases,
        "modes": list(dict.fromkeys(run.name.rsplit("@", 1)[0] for run in runs)),
        "seconds": seconds,
    }


def _modes_clause(modes: list[str]) -> str:
    """Nothing when every mode variant ran; else which did (those the profile declares)."""
    if len(modes) == len(MODE_VARIANTS):
        return ""
    return f"; the modes its profile declares: {', '.join(modes)}"


def print_report(report: dict[str, Any]) -> None:
    """Print `run_impl_parity`'s report: a line per case (runs and golden verdicts, prompt,
    and how it differs from the golden output), then the verdict with the leak counts."""
    cases = report["cases"]
    for c in cases:
        golden = golden_column(c["golden"], c.get("golden_ties", 0))
        runs = "same" if c["identical"] else "DIFF " + ",".join(c["mismatched"])
        print(f"#{c['index']:<3} runs {runs:<5} golden {golden:<4} prompt [{c['prompt']}]")
        if c["golden_detail"]:
            print(f"     {c['golden_detail']}")
    verdict = "IDENTICAL" if report["identical"] else "MISMATCH"
    if not report["golden_checked"]:
        golden = "no golden decoder (golden_output) to compare with"
    else:
        golden = golden_verdict(report["golden"], [c.get("golden_ties", 0) for c in cases])
    print(
        f"\n{report['impl']}: {verdict}, {golden} "
        f"({sum(c['identical'] for c in cases)}/{len(cases)} cases; "
        f"{batch_sizes_clause(report['batch_sizes'])}{_modes_clause(report['modes'])}); "
        f"leaked slots {report['leaked_slots']}, held rows {report['leaked_rows']}"
    )
    if report["uneven_products"]:  # only one of our torch engines reports any
        import torch

        from gpu.device_name import device_name
        from gpu.gemm_probe import UnevenProduct, print_uneven_products

        found = tuple(UnevenProduct(**product) for product in report["uneven_products"])
        where = device_name(torch.device(report["device"]))
        print_uneven_products(found, where, report["threads"], report["identical"])


def impl_parity_main(ns: argparse.Namespace) -> int:
    """0 when every case is identical, golden agrees (when provided) and nothing leaked. The
    JSON (`--json`) also names the real engine a run drove (`engine`, as `verify`'s does) and
    the run (`run`: date, commit, versions, host, command); a run that broke a spec rule before
    its outputs could be compared writes `{"impl", "identical": false, "violation": {"rule",
    "message"}, ...}` and then fails as before (exit 1)."""
    active = activated_engines()
    try:
        # an implementation's own prints stay off the report
        with call_timeout_set(ns.run_timeout), implementation_stdout_to_stderr():
            report = run_impl_parity(ns.impl, ns)
    except SpecViolation as violation:
        _write_json(
            ns.json,
            {
                "impl": ns.impl,
                "identical": False,
                "golden": False,
                "violation": {"rule": violation.rule, "message": str(violation)},
                **_provenance(ns.impl, active),
            },
        )
        raise
    report.update(_provenance(ns.impl, active))
    print_report(report)
    if "engine" in report:  # the release checked, as verify names it
        print(engine_line(ns.impl, report["engine"]))
    _write_json(ns.json, report)
    golden_ok = report["golden"] or not report["golden_checked"]
    clean = report["leaked_slots"] == 0 and report["leaked_rows"] == 0
    return 0 if report["identical"] and golden_ok and clean else 1
