"""Proof results and the solver settings every query uses (fixed seeds, a timeout)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

import z3

Status = Literal["proved", "counterexample", "unknown"]
Progress = Callable[[str], None]

DEFAULT_TIMEOUT_MS = 60_000


@dataclass(frozen=True, slots=True)
class ProofResult:
    """One proof obligation's outcome.

    status: "proved" (the claim holds within its bound), "counterexample" (Z3 found one; for a
    seeded mutant this is the expected outcome and `detail` holds the replayed trace), or
    "unknown" (timeout or solver gave up: a failure).
    """

    name: str
    status: Status
    seconds: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object: `name`, `status`, `seconds` and `detail`."""
        return asdict(self)

    def to_json_str(self) -> str:
        """`to_json` as one line of JSON text."""
        return json.dumps(self.to_json())


def configure() -> None:
    """Deterministic z3: fixed seeds for every engine a query may use."""
    z3.set_param("smt.random_seed", 0)
    z3.set_param("sat.random_seed", 0)
    z3.set_param("nlsat.seed", 0)
    z3.set_param("fp.spacer.random_seed", 0)


def solver(timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Any:
    """A fresh solver with the project's settings."""
    configure()
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.set("random_seed", 0)
    s.set("arith.solver", 2)
    return s


class Unknown(RuntimeError):
    """A query returned unknown (timeout or incompleteness): counted as failure."""


def check(s: Any, *assumptions: Any) -> bool:
    """True for sat, False for unsat; raise `Unknown` otherwise."""
    r = s.check(*assumptions)
    if r == z3.sat:
        return True
    if r == z3.unsat:
        return False
    raise Unknown(str(s.reason_unknown()))


@contextmanager
def timed() -> Iterator[list[float]]:
    """`with timed() as t: ...` then t[0] holds the elapsed seconds."""
    box = [0.0]
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - t0
