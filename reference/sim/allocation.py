"""SBS allocation across the DP units of one instance (formulas in docs/sbs.md).

Prefill — water-filling. Unit u carries a mandatory load L_u (the continuation chunk of a
request it is already prefilling) and can take A_u more tokens this forward (token budget left,
never more than its free KV). Dispatching W tokens, the token split x solves

    minimise max_u (L_u + x_u)   subject to   0 <= x_u <= A_u,  sum_u x_u = W,

exactly (integers): the smallest level h with sum_u clamp(h - L_u, 0, A_u) >= W; every unit
fills to h - 1 and the remaining tokens lift units that can reach h, lowest index first.
`pour` then realises the split with whole requests in FCFS order: a unit takes requests until
its share is met, cutting the last one (chunked prefill; the rest stays pinned to that unit for
the next forward); a unit out of seats or KV stops early and the level is recomputed over the
others for what it could not take.

Decode — dual objective. Among units with a seat and room for the request's KV, drop IQR
outliers on either load (running requests) or KV usage (value > Q3 + 1.5 * IQR), then pick the
lexicographic minimum of (load, KV usage, unit index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reference.sim.errors import SimConfigError


def water_level(loads: Sequence[int], avail: Sequence[int], total: int) -> int:
    """Smallest integer level h with sum clamp(h - L_u, 0, A_u) >= total (total <= sum A)."""
    if total <= 0:
        return min(loads) if loads else 0
    if total > sum(avail):
        raise SimConfigError("total", total, f"at most the available {sum(avail)} tokens")
    lo = min(loads)
    hi = max(lo_ + a for lo_, a in zip(loads, avail, strict=True))
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(min(max(mid - lu, 0), a) for lu, a in zip(loads, avail, strict=True)) >= total:
            hi = mid
        else:
            lo = mid + 1
    return lo


def water_fill(loads: Sequence[int], avail: Sequence[int], total: int) -> list[int]:
    """The optimal token split x (see the module doc)."""
    if len(loads) != len(avail):
        raise SimConfigError("avail", len(avail), f"one entry per unit ({len(loads)})")
    if any(a < 0 for a in avail) or any(lu < 0 for lu in loads):
        raise SimConfigError("avail", list(avail), "non-negative loads and capacities")
    if total <= 0:
        return [0] * len(loads)
    h = water_level(loads, avail, total)
    x = [min(max(h - 1 - lu, 0), a) for lu, a in zip(loads, avail, strict=True)]
    rest = total - sum(x)
    for u, (lu, a) in enumerate(zip(loads, avail, strict=True)):
        if rest == 0:
            break
        if lu + x[u] == h - 1 and x[u] < a:
            x[u] += 1
            rest -= 1
    assert rest == 0
    return x


@dataclass(frozen=True, slots=True)
class UnitCapacity:
    """What a DP unit can take in this forward."""

    mandatory: int  # tokens of its pinned continuation chunk (L_u)
    token_budget: int  # tokens per forward in all
    seats: int  # new requests it may start this forward
    kv_free: int  # KV tokens free (a new request reserves its whole prompt)

    @property
    def avail(self) -> int:
        """Tokens it can take beyond its mandatory chunk this forward (A_u): `token_budget -
        mandatory`, never below 0 (seats and KV are `pour`'s to check)."""
        return max(0, self.token_budget - self.mandatory)


@dataclass(frozen=True, slots=True)
class Pour:
    """chunks[u]: (request, tokens) started or continued on unit u this forward (new requests
    only; the pinned continuation is the caller's); the tokens a request did not get this
    forward stay pinned to its unit."""

    chunks: tuple[tuple[tuple[int, int], ...], ...]
    split: tuple[int, ...]  # the water-filling target per unit (last level computed)

    def loads(self, caps: Sequence[UnitCapacity]) -> list[int]:
        """Each unit's tokens this forward: its mandatory chunk plus the chunks placed on it (`caps`
        as given to `pour`, one per unit)."""
        return [
            c.mandatory + sum(t for _, t in ch) for c, ch in zip(caps, self.chunks, strict=True)
        ]


def pour(caps: Sequence[UnitCapacity], requests: Sequence[tuple[int, int, int]]) -> Pour:
    """Place FCFS `requests` (id, tokens to prefill, KV to reserve) on units.

    Returns the per-unit chunks; requests not placed are the caller's to keep buffered.
    """
    n = len(caps)
    loads = [c.mandatory for c in caps]
    avail = [c.avail if c.seats > 0 else 0 for c in caps]
    seats = [c.seats for c in caps]
    kv = [c.kv_free for c in caps]
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    open_ = [a > 0 for a in avail]
    i = 0
    split: list[int] = [0] * n
    while i < len(requests):
        rem_tokens = sum(t for _, t, _ in requests[i:])
        cap_open = [avail[u] if open_[u] else 0 for u in range(n)]
        w = min(rem_tokens, sum(cap_open))
        if w <= 0:
            break
        split = water_fill(loads, cap_open, w)
        closed_any = False
        for u in sorted(range(n), key=lambda v: (loads[v], v)):
            share = split[u]
            while share > 0 and i < len(requests):
                rid, tokens, need_kv = requests[i]
                if seats[u] == 0 or kv[u] < need_kv:
                    open_[u] = False
                    closed_any = True
                    break
                take = min(tokens, share)
                chunks[u].append((rid, take))
                seats[u] -= 1
                kv[u] -= need_kv
                loads[u] += take
                avail[u] -= take
                share -= take
                i += 1
            if not open_[u] or avail[u] == 0 or seats[u] == 0:
                open_[u] = False
            if i >= len(requests):
                break
        if not closed_any:
            break
    return Pour(tuple(tuple(c) for c in chunks), tuple(split))


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    v = sorted(values)
    n = len(v)

    def q(p: float) -> float:
        pos = p * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    return q(0.25), q(0.75)


def iqr_outliers(values: Sequence[float]) -> set[int]:
    """Indices whose value is above Q3 + 1.5 * IQR (linear-interpolated quartiles)."""
    if len(values) < 4:
        return set()
    q1, q3 = _quartiles(values)
    fence = q3 + 1.5 * (q3 - q1)
    return {i for i, v in enumerate(values) if v > fence}


def pick_decode_unit(
    loads: Sequence[int],
    kv_used: Sequence[int],
    seats_free: Sequence[int],
    kv_free: Sequence[int],
    need_kv: int,
) -> int | None:
    """The decode unit for a request needing `need_kv` KV tokens, or None if none fits."""
    feasible = [u for u in range(len(loads)) if seats_free[u] > 0 and kv_free[u] >= need_kv]
    if not feasible:
        return None
    out_load = iqr_outliers([loads[u] for u in feasible])
    out_kv = iqr_outliers([kv_used[u] for u in feasible])
    cands = [u for j, u in enumerate(feasible) if j not in out_load and j not in out_kv]
    if not cands:
        cands = feasible
    return min(cands, key=lambda u: (loads[u], kv_used[u], u))
