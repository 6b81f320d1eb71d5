"""`properties.symbolic.compile.compile_terms`: z3 terms compiled to Python agree with z3's own
evaluation, and what it cannot compile is a `ValueError` naming it."""

from __future__ import annotations

import random

import pytest
import z3

from properties.symbolic.compile import compile_terms


def _evaluate(term: z3.ExprRef, values: dict[str, int], inputs: dict[str, z3.ArithRef]) -> object:
    pairs = [(inputs[k], z3.IntVal(v)) for k, v in values.items()]
    out = z3.simplify(z3.substitute(term, *pairs))
    return out.as_long() if z3.is_int_value(out) else z3.is_true(out)


def test_compiled_terms_agree_with_z3_on_random_inputs() -> None:
    x, y, w = z3.Ints("x y w")
    inputs = {"x": x, "y": y, "w": w}
    shared = z3.If(x > y, x - y, y * 2)  # a subterm several outputs read
    outputs: dict[str, z3.ExprRef] = {
        "arith": shared + (-w) - 3 * x,
        "floor": (x - 7) / 3 + (w % 4),  # z3's div/mod by a positive constant: floor, >= 0
        "cmp": z3.And(x <= y, z3.Or(w < 0, shared >= 5), z3.Not(x == w)),
        "implies": z3.Implies(x > 0, y > 0),
        "xor": z3.Xor(x > w, y > w),
        "distinct2": z3.Distinct(x, y),
        "distinct3": z3.Distinct(x, y, w),
        "consts": z3.And(z3.BoolVal(True), z3.Or(z3.BoolVal(False), x != 0)),
        "nested": z3.If(z3.And(x > 1, y > 1), shared * shared, shared + 1),
    }
    fn = compile_terms(outputs, inputs)
    rng = random.Random(7)
    for _ in range(200):
        values = {k: rng.randint(-20, 20) for k in inputs}
        got = fn(values)
        for name, term in outputs.items():
            assert got[name] == _evaluate(term, values, inputs), (name, values)


def test_a_free_constant_that_is_not_an_input_is_named() -> None:
    x, stray = z3.Ints("x stray")
    with pytest.raises(ValueError, match="free constant stray is not an input"):
        compile_terms({"out": x + stray}, {"x": x})


def test_a_quantifier_or_an_unknown_operator_is_refused() -> None:
    x, y = z3.Ints("x y")
    with pytest.raises(ValueError, match="quantifier"):
        compile_terms({"q": z3.ForAll([y], y + x > y)}, {"x": x})
    with pytest.raises(ValueError, match=r"cannot compile.*out"):
        compile_terms({"out": z3.ToReal(x) > 0}, {"x": x})
