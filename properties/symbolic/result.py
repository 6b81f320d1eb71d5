"""Proof results and the solver every query uses (fixed seeds, a timeout, a context of its
own)."""

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


class IsolatedModel:
    """A model of an `IsolatedSolver`'s query, read with terms of the main context."""

    def __init__(self, model: Any, ctx: z3.Context) -> None:
        self._model = model
        self._ctx = ctx

    def eval(self, term: Any, model_completion: bool = False) -> Any:
        """The value of `term` (a main-context term), as a main-context term."""
        value = self._model.eval(term.translate(self._ctx), model_completion)
        return value.translate(z3.main_ctx())

    def decls(self) -> list[Any]:
        """The declarations the model assigns (in the solver's own context)."""
        return list(self._model.decls())

    def __getitem__(self, decl: Any) -> Any:
        return self._model[decl]


#: What z3 says of a check it stopped for SIGINT (it handles the signal itself during a check).
INTERRUPTED = frozenset({"interrupted from keyboard", "canceled"})


class IsolatedSolver:
    """A solver that solves each query in a z3 context of its own, built from the query's
    SMT-LIB text.

    Why: in z3's shared main context the model of a query depended on what the process had
    built and solved before (another test under pytest-xdist, or the proofs before the mutants
    in `schedspec prove`), even with every seed fixed; translating the terms into a fresh
    context did not change that. Parsed from its text, the same query gives the same model in
    any process. `add` takes main-context terms; the model reads main-context terms too."""

    def __init__(self, timeout_ms: int) -> None:
        configure()
        self._timeout_ms = timeout_ms
        self._staged = z3.Solver()  # collects the assertions; never solves
        self._ctx: z3.Context | None = None
        self._solver: Any = None

    def add(self, *terms: Any) -> None:
        """Assert main-context terms (or Python booleans)."""
        self._staged.add(*terms)

    def check(self, *assumptions: Any) -> Any:
        """sat, unsat or unknown, under main-context assumptions, in a fresh context."""
        self._ctx = z3.Context()
        self._solver = z3.Solver(ctx=self._ctx)
        self._solver.set("timeout", self._timeout_ms)
        self._solver.set("random_seed", 0)
        self._solver.set("arith.solver", 2)
        self._solver.from_string(_canonical_text(self._staged.assertions()))
        answer = self._solver.check(*[a.translate(self._ctx) for a in assumptions])
        if answer == z3.unknown and self.reason_unknown() in INTERRUPTED:
            # z3 catches SIGINT during a check and answers unknown: it is the user's Ctrl-C,
            # to end the run (exit 130), not a query counted as not proved
            raise KeyboardInterrupt
        return answer

    def reason_unknown(self) -> str:
        """Why the last check answered unknown."""
        return str(self._solver.reason_unknown())

    def model(self) -> IsolatedModel:
        """The model of the last satisfiable check."""
        if self._ctx is None:
            raise RuntimeError("IsolatedSolver.model() called before check()")
        return IsolatedModel(self._solver.model(), self._ctx)


def _canonical_text(assertions: Any) -> str:
    """SMT-LIB text of `assertions` that depends on the terms alone. `to_smt2` names shared
    subterms by their context's term ids, which in the main context follow the process's
    history; translated into a fresh context first, the ids follow the terms. (`sexpr` gives
    such text directly but prints 30 times slower.)"""
    fresh = z3.Context()
    staging = z3.Solver(ctx=fresh)
    for a in assertions:
        staging.add(a.translate(fresh))
    return str(staging.to_smt2())


def solver(timeout_ms: int = DEFAULT_TIMEOUT_MS) -> IsolatedSolver:
    """A fresh solver with the project's settings, in a context of its own (its models do not
    depend on what the process solved before)."""
    return IsolatedSolver(timeout_ms)


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
