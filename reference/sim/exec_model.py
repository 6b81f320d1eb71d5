"""Execution-time models: how long one batch (one forward of one replica / DP unit) takes.

Every model answers `batch_time(prefill_tokens, decode_tokens, kv_tokens, attn_pairs)`:
- prefill_tokens: prompt tokens computed in the batch (a dLLM forward counts its block tokens
  here: rows * block_size);
- decode_tokens: one per decoding request;
- kv_tokens: KV cache tokens the batch's attention reads (context already cached);
- attn_pairs: (query, key) pairs attention computes (0: estimated from the other figures).

Four models: `Constant`, `Linear`, `Roofline` (model dimensions × device peak figures) and
`Table` (calibrated from measured round times). All are pure functions, so a simulation stays
deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

from reference.sim.bounds import MAX_SECONDS, MIN_BATCH_SECONDS, check_seconds, seconds_text
from reference.sim.errors import SimConfigError, reason_of
from spec.input_file import read_input_text
from spec.json_text import parse_json


class ExecModel(Protocol):
    """How long one batch takes, in seconds (the arguments: see the module doc)."""

    def batch_time(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, attn_pairs: int = 0
    ) -> float:
        """Seconds of one batch of `prefill_tokens` and `decode_tokens` that reads `kv_tokens`
        cached tokens and computes `attn_pairs` attention pairs (0: estimated, or not read)."""
        ...


def _nonneg(field: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise SimConfigError(field, value, "a finite number >= 0")


@dataclass(frozen=True, slots=True)
class Constant:
    """Every non-empty batch takes `seconds`."""

    seconds: float

    def __post_init__(self) -> None:
        check_seconds("seconds", self.seconds, positive=True)

    def batch_time(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, attn_pairs: int = 0
    ) -> float:
        """`seconds`, whatever the batch."""
        return self.seconds

    def decode_ends(self, t: float, nd: int, kv: int, k: int) -> list[float]:
        """End times of k pure-decode batches from t (summed exactly as one by one)."""
        s = self.seconds
        return list(accumulate(itertools.repeat(s, k), initial=t))[1:]


@dataclass(frozen=True, slots=True)
class Linear:
    """base + per_prefill_token * P + per_decode_token * D + per_kv_token * KV (seconds)."""

    base: float
    per_prefill_token: float = 0.0
    per_decode_token: float = 0.0
    per_kv_token: float = 0.0

    def __post_init__(self) -> None:
        check_seconds("base", self.base, positive=True)
        for f in ("per_prefill_token", "per_decode_token", "per_kv_token"):
            check_seconds(f, getattr(self, f), positive=False)

    def batch_time(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, attn_pairs: int = 0
    ) -> float:
        """The class formula; `attn_pairs` is not read."""
        return (
            self.base
            + self.per_prefill_token * prefill_tokens
            + self.per_decode_token * decode_tokens
            + self.per_kv_token * kv_tokens
        )

    def decode_ends(self, t: float, nd: int, kv: int, k: int) -> list[float]:
        """End times of k pure-decode batches from t, the KV growing by nd per batch (the same
        floating-point operations as k calls of batch_time)."""
        c0 = self.base + self.per_prefill_token * 0 + self.per_decode_token * nd
        pk = self.per_kv_token
        return list(accumulate((c0 + pk * (kv + j * nd) for j in range(k)), initial=t))[1:]


@dataclass(frozen=True, slots=True)
class Device:
    """Peak dense figures of one accelerator (no structured sparsity)."""

    name: str
    bf16_flops: float  # FLOP/s, dense BF16 tensor core
    fp8_flops: float  # FLOP/s, dense FP8 tensor core (0 = none)
    mem_bandwidth: float  # bytes/s, HBM
    memory_bytes: float


# Published datasheet figures (dense, SXM parts; NVIDIA's sheets quote 2x "with sparsity"):
#   A100 SXM4 80GB: 312 TFLOP/s BF16, no FP8, 2,039 GB/s HBM2e, 80 GB
#     (NVIDIA A100 Tensor Core GPU datasheet).
#   H100 SXM5: 989 TFLOP/s BF16, 1,979 TFLOP/s FP8, 3.35 TB/s HBM3, 80 GB
#     (NVIDIA H100 Tensor Core GPU datasheet).
#   H200 SXM: 989 TFLOP/s BF16, 1,979 TFLOP/s FP8, 4.8 TB/s HBM3e, 141 GB
#     (NVIDIA H200 Tensor Core GPU datasheet).
#   H800 SXM: the H100 SXM compute and memory figures with reduced NVLink (400 GB/s); the
#     SBS paper's DeepSeek-V3 deployment ran on H800.
DEVICES: dict[str, Device] = {
    "a100": Device("A100-SXM4-80GB", 312e12, 0.0, 2.039e12, 80e9),
    "h100": Device("H100-SXM5-80GB", 989e12, 1979e12, 3.35e12, 80e9),
    "h200": Device("H200-SXM-141GB", 989e12, 1979e12, 4.8e12, 141e9),
    "h800": Device("H800-SXM-80GB", 989e12, 1979e12, 3.35e12, 80e9),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Dimensions that set a forward's FLOPs and bytes.

    active_params: parameters each token multiplies through; total_params: all of them (MoE:
    the experts not every token uses). attn_width: num_heads * head_dim of attention queries.
    kv_bytes_per_token: KV cache bytes per token over all layers.
    """

    name: str
    num_layers: int
    attn_width: int
    active_params: float
    total_params: float
    kv_bytes_per_token: float
    bytes_per_param: float = 2.0


# Dimensions from the models' published configs (config.json on their model cards).
MODELS: dict[str, ModelSpec] = {
    # Llama-2-7B: 32 layers, hidden 4096, 32 heads (MHA), 6.74e9 params; KV = 2*32*4096*2 B.
    "llama2-7b": ModelSpec("Llama-2-7B", 32, 4096, 6.74e9, 6.74e9, 2 * 32 * 4096 * 2),
    # Llama-3-8B: 32 layers, 32 heads x 128, 8 KV heads (GQA), 8.03e9 params.
    "llama3-8b": ModelSpec("Llama-3-8B", 32, 4096, 8.03e9, 8.03e9, 2 * 32 * 8 * 128 * 2),
    # DeepSeek-V3: 61 layers, 128 heads x 128 (q), MLA cache of 512 + 64 values per token per
    # layer, 671e9 params in all, 37e9 activated per token; FP8 weights (1 byte).
    "deepseek-v3": ModelSpec(
        "DeepSeek-V3", 61, 128 * 128, 37e9, 671e9, 61 * (512 + 64) * 1, bytes_per_param=1.0
    ),
}


@dataclass(frozen=True, slots=True)
class Roofline:
    """max(FLOPs / (peak * mfu), bytes / (bandwidth * mbu)) + overhead, over `parallel` devices
    sharing the work evenly (tensor or expert parallel, communication not modelled).

    FLOPs = 2 * active_params * tokens + 4 * layers * attn_width * attn_pairs.
    Bytes = weights touched + KV read + KV written, where an MoE batch of n tokens touches the
    expert weights with probability 1 - (1 - a)^n, a = the active share of the expert weights
    (tokens routed independently; our own estimate, not a published model).
    """

    model: ModelSpec
    device: Device
    parallel: int = 1
    mfu: float = 0.5
    mbu: float = 0.8
    overhead: float = 0.0
    fp8: bool = False

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise SimConfigError("parallel", self.parallel, "an integer >= 1")
        for f in ("mfu", "mbu"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise SimConfigError(f, v, "a fraction in (0, 1]")
        check_seconds("overhead", self.overhead, positive=False)
        if self.fp8 and self.device.fp8_flops == 0:
            raise SimConfigError("fp8", True, f"{self.device.name} has no FP8 tensor cores")

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes a batch of `tokens` touches: every parameter of a dense model; of an MoE,
        `total_params` times the share touched (class doc; at least one token)."""
        m = self.model
        dense = m.active_params if m.total_params == m.active_params else 0.0
        if dense:
            return dense * m.bytes_per_param
        share = m.active_params / m.total_params
        touched = 1.0 - (1.0 - share) ** max(tokens, 1)
        return m.total_params * touched * m.bytes_per_param

    def batch_time(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, attn_pairs: int = 0
    ) -> float:
        """The roofline time (class doc); an empty batch costs `overhead` alone. `attn_pairs` 0 is
        estimated as `kv_tokens` + P(P + 1)/2 for P prefill tokens."""
        m = self.model
        tokens = prefill_tokens + decode_tokens
        if tokens == 0:
            return self.overhead
        pairs = attn_pairs or (kv_tokens + prefill_tokens * (prefill_tokens + 1) // 2)
        flops = 2.0 * m.active_params * tokens + 4.0 * m.num_layers * m.attn_width * pairs
        peak = self.device.fp8_flops if self.fp8 else self.device.bf16_flops
        nbytes = self.weight_bytes(tokens) + (kv_tokens + tokens) * m.kv_bytes_per_token
        t_compute = flops / (peak * self.mfu * self.parallel)
        t_memory = nbytes / (self.device.mem_bandwidth * self.mbu * self.parallel)
        return max(t_compute, t_memory) + self.overhead


#: The shapes `Table.load` reads.
TABLE_SHAPE = '{"points": [[tokens, seconds], ...]} or a bare list of [tokens, seconds] pairs'


@dataclass(frozen=True)
class Table:
    """Piecewise-linear in batch tokens (prefill + decode), calibrated from measured round times;
    extrapolated with the end segments' slopes, never below the smallest measured time. A batch
    the last segment extrapolates past `MAX_SECONDS` (an hour) raises `SimConfigError` naming
    the table (`source`), rather than being run with a time out of the simulator's range."""

    points: tuple[tuple[float, float], ...]  # (tokens, seconds), tokens strictly increasing
    source: str = field(default="table", compare=False)  # 'table:PATH' when loaded from a file

    def __post_init__(self) -> None:
        pts = self.points
        if len(pts) < 1:
            raise SimConfigError("points", pts, "at least one (tokens, seconds) pair")
        for i, (x, y) in enumerate(pts):
            _nonneg("tokens", x)
            check_seconds("seconds", y, positive=True)
            if i and x <= pts[i - 1][0]:
                raise SimConfigError("points", pts, "token counts strictly increasing")

    @classmethod
    def from_measurements(
        cls, samples: Sequence[tuple[float, float]], source: str = "table"
    ) -> Table:
        """Average repeated measurements of the same token count."""
        acc: dict[float, list[float]] = {}
        for x, y in samples:
            acc.setdefault(float(x), []).append(float(y))
        return cls(tuple((x, sum(v) / len(v)) for x, v in sorted(acc.items())), source)

    @classmethod
    def load(cls, path: Path) -> Table:
        """JSON: {"points": [[tokens, seconds], ...]} or a bare list of pairs. A file that cannot
        be read, is not UTF-8 JSON, has another shape or no point raises `SimConfigError`
        (field `exec_model`) naming the file and the shape."""
        where = f"table:{path}"
        try:
            data = parse_json(read_input_text(path))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            why = f"a readable JSON file ({reason_of(err)})"
            raise SimConfigError("exec_model", where, why) from None
        raw: Any = data.get("points") if isinstance(data, dict) else data
        try:
            pairs = [(float(a), float(b)) for a, b in raw]
        except (TypeError, ValueError):
            pairs = []
        if not pairs:
            raise SimConfigError("exec_model", where, f"a table: {TABLE_SHAPE}, at least one")
        return cls.from_measurements(pairs, where)

    def batch_time(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, attn_pairs: int = 0
    ) -> float:
        """The piecewise-linear time at prefill + decode tokens (class doc); `kv_tokens` and
        `attn_pairs` are not read."""
        x = float(prefill_tokens + decode_tokens)
        pts = self.points
        if len(pts) == 1:
            return pts[0][1]
        if x <= pts[0][0]:
            (x0, y0), (x1, y1) = pts[0], pts[1]
        elif x >= pts[-1][0]:
            (x0, y0), (x1, y1) = pts[-2], pts[-1]
        else:
            lo, hi = 0, len(pts) - 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if pts[mid][0] <= x:
                    lo = mid
                else:
                    hi = mid
            (x0, y0), (x1, y1) = pts[lo], pts[hi]
        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        if y > MAX_SECONDS:  # extrapolated beyond the points: out of the simulator's range
            raise SimConfigError(
                "exec_model",
                self.source,
                f"a table whose batch times stay {seconds_text(True)}: an end segment "
                f"extrapolates a batch of {int(x)} tokens to {y:.4g} s; add measured points "
                f"that cover {int(x)} tokens",
            )
        return max(y, min(p[1] for p in pts))


def min_batch_seconds(model: ExecModel) -> float:
    """The shortest batch `model` can take (seconds): a lower bound over every non-empty batch,
    which sets how late arrivals may come (`bounds.latest_arrival`). `Constant`: its seconds;
    `Linear`: base plus the cheaper per-token cost; `Table`: its smallest measured time (it never
    goes below it); otherwise (`Roofline`, a model of your own) the cheaper of a one-token
    prefill and a one-token decode with nothing cached, never below `MIN_BATCH_SECONDS`."""
    if isinstance(model, Constant):
        return model.seconds
    if isinstance(model, Linear):
        return model.base + min(model.per_prefill_token, model.per_decode_token)
    if isinstance(model, Table):
        return min(y for _, y in model.points)
    shortest = min(model.batch_time(0, 1), model.batch_time(1, 0))
    return (
        shortest if math.isfinite(shortest) and shortest > MIN_BATCH_SECONDS else MIN_BATCH_SECONDS
    )


SYNTAX = {
    "const": "'const:SECONDS'",
    "linear": "'linear:BASE,PER_PREFILL,PER_DECODE[,PER_KV]' (seconds)",
    "roofline": "'roofline:MODEL@DEVICE[xPARALLEL]'",
    "table": "'table:PATH.json'",
}


def parse_model(text: str) -> ExecModel:
    """CLI syntax: 'const:0.02', 'linear:BASE,PER_PREFILL,PER_DECODE[,PER_KV]',
    'roofline:MODEL@DEVICE[xPARALLEL]' (e.g. 'roofline:llama3-8b@h100'), 'table:PATH.json'.
    Anything else raises `SimConfigError` saying what its kind takes (a model or device not
    known: the known ones)."""
    kind, _, arg = text.partition(":")
    if kind not in SYNTAX:
        raise SimConfigError("exec_model", text, " or ".join(SYNTAX.values()))
    if kind == "table":
        return Table.load(Path(arg))
    if kind == "roofline":
        model, _, dev = arg.partition("@")
        dev, _, par = dev.partition("x")
        if model not in MODELS:
            raise SimConfigError("exec_model", text, f"a model of {sorted(MODELS)}")
        if dev not in DEVICES:
            raise SimConfigError("exec_model", text, f"a device of {sorted(DEVICES)}")
        parallel = int(par) if par.isdecimal() else 0 if par else 1
        if parallel < 1:
            raise SimConfigError("exec_model", text, f"{SYNTAX[kind]}, PARALLEL an integer >= 1")
        return Roofline(MODELS[model], DEVICES[dev], parallel=parallel)
    try:
        vals = [float(v) for v in arg.split(",")]
    except ValueError:
        vals = []
    try:
        if kind == "const" and len(vals) == 1:
            return Constant(vals[0])
        if kind == "linear" and 1 <= len(vals) <= 4:
            return Linear(*vals)
    except SimConfigError as err:  # a coefficient out of range: named within the whole text
        raise SimConfigError(
            "exec_model",
            text,
            f"{SYNTAX[kind]}: {err.field.upper().removesuffix('_TOKEN')} must be {err.valid}",
        ) from None
    raise SimConfigError("exec_model", text, SYNTAX[kind])
