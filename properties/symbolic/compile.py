"""Compile quantifier-free z3 terms (Int/Bool) into a straight-line Python function.

The drift guard evaluates the symbolic relation on thousands of concrete (state, event) pairs;
z3's substitute+simplify costs ~0.1 s per pair, a compiled function ~0.1 ms. Every shared
subterm is computed once (the term DAG is walked by node id). Semantics follow z3's: integer
`div`/`mod` by a positive constant are floor division / non-negative remainder, as in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import z3

from properties.symbolic.terms import Z

Compiled = Callable[[Mapping[str, int | bool]], dict[str, int | bool]]

_BIN = {
    z3.Z3_OP_LE: "<=",
    z3.Z3_OP_LT: "<",
    z3.Z3_OP_GE: ">=",
    z3.Z3_OP_GT: ">",
    z3.Z3_OP_MOD: "%",
    z3.Z3_OP_IDIV: "//",
}


def compile_terms(outputs: Mapping[str, Z], inputs: Mapping[str, Z]) -> Compiled:
    """A function mapping input values (by input name) to output values (by output name).

    `inputs` names the uninterpreted constants the outputs may mention; any other constant is
    an error.
    """
    by_name = {str(t.decl().name()): k for k, t in inputs.items()}
    lines: list[str] = []
    memo: dict[int, str] = {}
    counter = [0]

    def emit(expr: str) -> str:
        counter[0] += 1
        name = f"t{counter[0]}"
        lines.append(f"    {name} = {expr}")
        return name

    def visit(root: Z) -> str:
        stack: list[tuple[Z, bool]] = [(root, False)]
        while stack:
            e, expanded = stack.pop()
            key = e.get_id()
            if key in memo:
                continue
            if not expanded:
                stack.append((e, True))
                for c in e.children():
                    if c.get_id() not in memo:
                        stack.append((c, False))
                continue
            memo[key] = _node(e, [memo[c.get_id()] for c in e.children()])
        return memo[root.get_id()]

    def _node(e: Z, args: list[str]) -> str:
        k = e.decl().kind()
        if z3.is_int_value(e):
            return str(e.as_long())
        if k == z3.Z3_OP_TRUE:
            return "True"
        if k == z3.Z3_OP_FALSE:
            return "False"
        if k == z3.Z3_OP_UNINTERPRETED and not args:
            name = str(e.decl().name())
            if name not in by_name:
                raise ValueError(f"free constant {name} is not an input")
            return emit(f"v[{by_name[name]!r}]")
        if k == z3.Z3_OP_ITE:
            return emit(f"({args[1]} if {args[0]} else {args[2]})")
        if k == z3.Z3_OP_AND:
            return emit("(" + " and ".join(args) + ")") if args else "True"
        if k == z3.Z3_OP_OR:
            return emit("(" + " or ".join(args) + ")") if args else "False"
        if k == z3.Z3_OP_NOT:
            return emit(f"(not {args[0]})")
        if k == z3.Z3_OP_IMPLIES:
            return emit(f"((not {args[0]}) or {args[1]})")
        if k == z3.Z3_OP_XOR:
            return emit(f"({args[0]} != {args[1]})")
        if k in (z3.Z3_OP_EQ, z3.Z3_OP_IFF):
            return emit(f"({args[0]} == {args[1]})")
        if k == z3.Z3_OP_DISTINCT:
            if len(args) == 2:
                return emit(f"({args[0]} != {args[1]})")
            return emit(f"(len({{{', '.join(args)}}}) == {len(args)})")
        if k == z3.Z3_OP_ADD:
            return emit("(" + " + ".join(args) + ")")
        if k == z3.Z3_OP_SUB:
            return emit("(" + " - ".join(args) + ")")
        if k == z3.Z3_OP_MUL:
            return emit("(" + " * ".join(args) + ")")
        if k == z3.Z3_OP_UMINUS:
            return emit(f"(-{args[0]})")
        if k in _BIN:
            return emit(f"({args[0]} {_BIN[k]} {args[1]})")
        raise ValueError(f"cannot compile {e.decl()} in {e}")

    outs = {k: visit(t) for k, t in outputs.items()}
    body = "\n".join(lines)
    ret = ", ".join(f"{k!r}: {v}" for k, v in outs.items())
    src = f"def _f(v):\n{body}\n    return {{{ret}}}\n"
    namespace: dict[str, Any] = {}
    exec(compile(src, "<z3-compiled>", "exec"), namespace)
    fn: Compiled = namespace["_f"]
    return fn
