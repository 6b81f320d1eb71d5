"""`schedspec parity ...` and `schedspec bench engine ...`: flags checked here, work in `gpu`.

The torch engine's work functions stay in `gpu` (`gpu.parity:parity_main`,
`gpu.bench:bench_main`); this module validates every flag and output path first — before torch
and the model load — and refuses a machine without torch with one line naming the `engine`
extra.
"""

from __future__ import annotations

import argparse
import re

from schedspec_cli.args import (
    MAX_CALL_TIMEOUT_S,
    Parser,
    flag_of,
    given_dests,
    int_in,
    positive,
    refuse_ignored,
)
from schedspec_cli.loader import MissingDependency, load_object, module_available
from schedspec_cli.output import check_output_path
from schedspec_cli.torch_threads import add_threads_argument, pin_torch_threads
from spec.errors import ConfigError

ALGORITHMS = ("LowConfidence", "JointThreshold")
DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")
RUN_TIMEOUT_S = 600  # a parity run drains every prompt at once: minutes on a slow machine
IMPL_PARITY_PROMPTS = 32  # seeded prompts for an implementation other than the engine
ENGINE_EXTRA = "pip install 'schedspec[engine]' (torch==2.13.0 first: see README)"


def require_torch(command: str) -> None:
    """`MissingDependency` naming `command` and the engine extra when torch cannot be imported."""
    if not module_available("torch"):
        raise MissingDependency(command, "torch", f"the engine extra, {ENGINE_EXTRA}")


def _device(text: str) -> str:
    if DEVICE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (valid: cpu, cuda, cuda:N)")
    return text


def parity_parser() -> Parser:
    """The parser of `schedspec parity` (each value typed and bounded; no cross-flag checks)."""
    p = Parser(
        prog="schedspec parity",
        description="batch parity (every mode at batch size 1 and --batch vs sync at batch size "
        "1), golden agreement and leak check of a dLLM implementation (default: the engine on "
        "the shipped model, with per-forward logits digests at batch size 1)",
    )
    p.add_argument(
        "--impl",
        default="engine",
        help="engine (default), another built-in dLLM name (e.g. reference-dllm) or module:factory",
    )
    p.add_argument(
        "--device", type=_device, default="cpu", help="cpu, cuda or cuda:N (--impl engine)"
    )
    p.add_argument(
        "--algorithm",
        default=None,
        choices=(*ALGORITHMS, "all"),
        help="step algorithm, or all of them (--impl engine; default all)",
    )
    p.add_argument(
        "--batch", type=int_in(2, 4096), default=4, help="the batch size > 1 (default 4)"
    )
    p.add_argument(
        "--prompts",
        type=positive(10_000),
        default=None,
        help="--impl engine: distinct prompts of the shipped set (default: every one); another "
        f"implementation: seeded prompts (default {IMPL_PARITY_PROMPTS})",
    )
    p.add_argument(
        "--max-new-tokens", type=positive(100_000), default=32, help="new tokens per prompt"
    )
    p.add_argument("--block-size", type=positive(4096), default=8, help="tokens per block")
    p.add_argument("--page-size", type=positive(65536), default=16, help="tokens per KV page")
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="--impl engine: every engine keeps committed blocks for later prompts (needs "
        "--page-size equal to --block-size); another implementation's profile says whether it "
        "caches",
    )
    p.add_argument("--json", metavar="PATH", help="write the report as JSON here")
    add_threads_argument(
        p,
        ": the runs are batches of a few small blocks, and more threads per process "
        "oversubscribe a shared machine's cores",
    )
    p.add_argument(
        "--run-timeout",
        type=int_in(0, MAX_CALL_TIMEOUT_S),
        default=None,
        metavar="SECONDS",
        help="--impl other than engine: each run (one mode at one batch size: every prompt "
        "submitted and drained) must finish within this, else it is a hang, a violation of "
        f"[progress] (default {RUN_TIMEOUT_S}; 0: no limit)",
    )
    return p


def check_shipped_parity(
    prompts_flag: str, prompts: int | None, tokens_flag: str, tokens: int, block_size: int
) -> None:
    """`ConfigError`, naming the flag, unless the shipped set has `prompts` distinct prompts
    (None: all of them) and the shipped model's context holds the longest of them plus `tokens`
    in whole blocks of `block_size`. Read without torch, so a bad count stops the command before
    anything runs."""
    from gpu.prompts import block_context, parity_cases, shipped_context
    from gpu.tokenizer import TOKENIZER

    try:
        texts = parity_cases(prompts)
    except ConfigError as err:
        raise ConfigError(prompts_flag, prompts, err.valid) from None
    lengths = [len(TOKENIZER.encode(t)) for t in texts]
    try:
        block_context(lengths, tokens, block_size, shipped_context())
    except ConfigError as err:
        raise ConfigError(tokens_flag, tokens, err.valid) from None


def parity(argv: list[str]) -> int:
    """`schedspec parity`: with `--impl engine` (default), check the shipped set holds the
    prompts and tokens asked for and hand `argv` to `gpu.parity:parity_main`; with another
    implementation, refuse the engine-only flags and run `impl_parity_main`. Prints the cases,
    writes `--json` when given; returns 0 when every case is identical, golden agrees and
    nothing leaked, else 1. A bad flag, path or page size raises (exit 2) before any run."""
    ns = parity_parser().parse_args(argv)
    if ns.impl == "engine":
        if ns.run_timeout is not None:
            raise ConfigError(
                "--run-timeout", ns.run_timeout, "left out with --impl engine (the shipped engine)"
            )
        check_shipped_parity(
            "--prompts", ns.prompts, "--max-new-tokens", ns.max_new_tokens, ns.block_size
        )
        if ns.prefix_cache and ns.page_size != ns.block_size:
            raise ConfigError(
                "--page-size",
                ns.page_size,
                f"equal to --block-size ({ns.block_size}) with --prefix-cache (the engine "
                "caches pages of one block)",
            )
        pin_torch_threads(ns.threads)  # before torch loads, when it has not yet
        return _run_engine_command(ns, argv, "parity", "gpu.parity:parity_main")
    check_output_path("--json", ns.json)
    # --forward-costs pages nothing: it never reads --page-size, so its default cannot clash
    if not getattr(ns, "forward_costs", False) and ns.page_size % ns.block_size:
        raise ConfigError(
            "--page-size", ns.page_size, f"a multiple of --block-size {ns.block_size}"
        )
    if ns.prefix_cache:
        raise ConfigError(
            "--prefix-cache",
            True,
            f"left out with --impl {ns.impl} (its profile says whether it keeps a prefix "
            "cache: engine-cached always does)",
        )
    for flag, value, default, why in (
        ("--device", ns.device, "cpu", "it runs its own code here; --device is the engine's"),
        ("--algorithm", ns.algorithm, None, "it runs its own algorithm"),
    ):
        if value != default:
            raise ConfigError(flag, value, f"left out with --impl {ns.impl} ({why})")
    if ns.run_timeout is None:
        ns.run_timeout = RUN_TIMEOUT_S
    if ns.prompts is None:
        ns.prompts = IMPL_PARITY_PROMPTS
    from schedspec_cli.parity_impl import impl_parity_main

    return impl_parity_main(ns)  # pins --threads once the implementation is loaded


def bench_engine_parser() -> Parser:
    """The parser of `schedspec bench engine` (`--sequential`, `--forward-costs` and
    `--forward-bound` exclude one another)."""
    p = Parser(prog="schedspec bench engine", description="tokens/s of sync vs FDFO on the engine")
    p.add_argument(
        "--max-running", type=positive(4096), nargs="+", default=[1, 4, 16], help="batch caps"
    )
    p.add_argument("--requests", type=positive(1_000_000), default=128, help="requests per run")
    p.add_argument("--max-new-tokens", type=positive(100_000), default=32, help="per request")
    p.add_argument("--block-size", type=positive(4096), default=8, help="tokens per block")
    p.add_argument("--page-size", type=positive(65536), default=16, help="tokens per KV page")
    p.add_argument("--algorithm", default="LowConfidence", choices=ALGORITHMS, help="algorithm")
    p.add_argument("--repeats", type=positive(1000), default=5, help="runs per setting")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--threads", type=int_in(0, 4096), default=0, help="torch threads (0: leave as is)"
    )
    p.add_argument("--json", metavar="PATH", help="write the report as JSON here")
    p.add_argument(
        "--turn-ms",
        type=int_in(0, 60_000),
        default=None,
        help="interleaved modes take turns of this many ms of their own time (0: one round; "
        "default 50)",
    )
    p.add_argument(
        "--rows-released",
        action="store_true",
        help="also serve FDFO whose carried blocks give back their KV and request-pool rows "
        "every round (SGLang's FDFO before in-place reuse), and print reuse's gain over it",
    )
    # what to measure: one of the throughput runs' method or the two model-only probes
    what = p.add_mutually_exclusive_group()
    what.add_argument("--sequential", action="store_true", help="run the modes one after another")
    what.add_argument(
        "--forward-costs",
        action="store_true",
        help="only the shipped model's forward costs on the CPU at fixed rows and contexts "
        "(printed; written with --json); reads only --block-size, --threads and --json",
    )
    what.add_argument(
        "--forward-bound",
        action="store_true",
        help="replay sync's and FDFO's forwards without step or scheduler: FDFO/sync of "
        "forward time alone",
    )
    return p


# what `--forward-costs` reads: it times the shipped model on the CPU at fixed rows and
# context starts, so a workload, device or repeat count given with it would be ignored
_FORWARD_COSTS_READS = frozenset({"forward_costs", "block_size", "threads", "json"})


def bench_engine(argv: list[str]) -> int:
    """`schedspec bench engine`: refuse `--turn-ms` without interleaving and, with
    `--forward-costs`, any flag it would ignore; check `--json` and the page size; then hand
    `argv` to `gpu.bench:bench_main`, which prints the tables and writes `--json`. Returns its
    status (0); a refused flag raises `ConfigError` (exit 2) before torch loads."""
    parser = bench_engine_parser()
    ns = parser.parse_args(argv)
    alone = [flag for flag in ("sequential", "forward_costs", "forward_bound") if getattr(ns, flag)]
    if alone and ns.turn_ms is not None:
        flag = flag_of(alone[0])
        raise ConfigError("--turn-ms", ns.turn_ms, f"left out with {flag} (it interleaves nothing)")
    if ns.forward_bound and ns.rows_released:
        raise ConfigError(
            "--rows-released",
            True,
            "left out with --forward-bound (releasing rows changes no forward: its forwards "
            "are fdfo's)",
        )
    if ns.forward_costs:
        refuse_ignored(
            ns,
            sorted(given_dests(parser, argv) - _FORWARD_COSTS_READS),
            "left out with --forward-costs (it times the shipped model on the CPU at fixed rows "
            "and contexts; it reads --block-size, --threads and --json)",
        )
    return _run_engine_command(ns, argv, "bench engine", "gpu.bench:bench_main")


def _run_engine_command(ns: argparse.Namespace, argv: list[str], label: str, target: str) -> int:
    """Check the output path and the page size (the flags `ns` parsed from `argv`) before torch
    loads, then hand `argv` to gpu."""
    check_output_path("--json", ns.json)
    # --forward-costs pages nothing: it never reads --page-size, so its default cannot clash
    if not getattr(ns, "forward_costs", False) and ns.page_size % ns.block_size:
        raise ConfigError(
            "--page-size", ns.page_size, f"a multiple of --block-size {ns.block_size}"
        )
    require_torch(label)
    main = load_object(target, label.split()[0])
    return int(main(argv))  # type: ignore[operator]


__all__ = ["bench_engine", "parity", "require_torch"]
