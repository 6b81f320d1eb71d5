"""Small z3 term helpers shared by every module of the Z3 layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import z3

from spec.lifecycles import Lifecycle

Z = Any  # a z3 expression (z3 ships no type stubs)
Values = dict[str, int | bool]  # a variable's label (e.g. "row[2]") -> its concrete value


def count(xs: Sequence[Z]) -> Z:
    """How many of the Boolean terms `xs` hold: Σ If(x, 1, 0)."""
    return z3.Sum([z3.If(x, 1, 0) for x in xs]) if xs else z3.IntVal(0)


def select(arr: Sequence[Z], idx: Z) -> Z:
    """arr[idx] for a symbolic index: If(idx = 0, arr[0], If(idx = 1, arr[1], ... arr[-1]))."""
    out = arr[-1]
    for i in range(len(arr) - 2, -1, -1):
        out = z3.If(idx == i, arr[i], out)
    return out


def lifecycle_step(lc: Lifecycle, codes: Mapping[str, int], cur: Z, trigger: str) -> tuple[Z, Z]:
    """(enabled, target code) of `trigger` from phase code `cur`, read from the table `lc`:
    enabled = ∨ {cur = source}, target = the row's target where cur = its source."""
    ts = [t for t in lc.transitions if t.trigger == trigger]
    enabled = z3.Or([cur == codes[t.source] for t in ts]) if ts else z3.BoolVal(False)
    target: Z = cur
    for t in reversed(ts):
        target = z3.If(cur == codes[t.source], codes[t.target], target)
    return enabled, target


def pyval(t: Z) -> int | bool:
    """A concrete z3 value as a Python bool or int."""
    if z3.is_true(t):
        return True
    if z3.is_false(t):
        return False
    if z3.is_int_value(t):
        return int(t.as_long())
    raise ValueError(f"not a concrete value: {t}")


def model_value(model: Z, term: Z) -> int | bool:
    """The value of `term` in `model` (unconstrained variables completed)."""
    return pyval(model.eval(term, model_completion=True))


def model_int(model: Z, term: Z) -> int:
    """The integer value of `term` in `model`."""
    return int(model_value(model, term))


def mentioned(expr: Z, prefix: str) -> set[str]:
    """Labels (e.g. 'owner_request[3]') of the variables named `prefix`.* that `expr` mentions."""
    out: set[str] = set()
    seen: set[int] = set()
    stack = [expr]
    head = prefix + "."
    while stack:
        e = stack.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            name = str(e.decl().name())
            if name.startswith(head):
                out.add(name[len(head) :])
        stack.extend(e.children())
    return out
