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
from z3 import z3core

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


#: raw AST kinds that are applications (a numeral is an application of no arguments)
_APPS = (z3.Z3_APP_AST, z3.Z3_NUMERAL_AST)


def _is_int(ctx: Any, a: Any) -> bool:
    return bool(z3core.Z3_get_sort_kind(ctx, z3core.Z3_get_sort(ctx, a)) == z3.Z3_INT_SORT)


def _decl_text(ctx: Any, decl: Any) -> str:
    return str(z3core.Z3_func_decl_to_string(ctx, decl))


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

    # The walk reads the term DAG through z3's C API (`z3core`) on raw AST pointers: the
    # Python wrappers (`children()`, `decl()`) build and reference-count an object per node
    # and child, which was most of a drift stepper's build. Each raw node stays alive while
    # its root (held by `outputs`) does.
    ctx = next(iter(outputs.values())).ctx.ref() if outputs else None

    def kids(a: Any) -> list[Any]:
        n = z3core.Z3_get_app_num_args(ctx, a)
        return [z3core.Z3_get_app_arg(ctx, a, i) for i in range(n)]

    def visit(root: Z) -> str:
        # post-order over the DAG; a node is pushed again with its children once they are
        # pushed, and emitted when it comes back up with all of them memoised
        stack: list[tuple[Any, list[Any] | None]] = [(root.as_ast(), None)]
        while stack:
            a, children = stack.pop()
            key = z3core.Z3_get_ast_id(ctx, a)
            if key in memo:
                continue
            if children is None:
                if z3core.Z3_get_ast_kind(ctx, a) not in _APPS:
                    raise ValueError(f"cannot compile a quantifier or bound variable in {root}")
                children = kids(a)
                stack.append((a, children))
                for c in children:
                    if z3core.Z3_get_ast_id(ctx, c) not in memo:
                        stack.append((c, None))
                continue
            memo[key] = _node(a, [memo[z3core.Z3_get_ast_id(ctx, c)] for c in children])
        return memo[root.get_id()]

    def _node(a: Any, args: list[str]) -> str:
        decl = z3core.Z3_get_app_decl(ctx, a)
        k = z3core.Z3_get_decl_kind(ctx, decl)
        if k == z3.Z3_OP_ANUM and _is_int(ctx, a):
            return str(int(z3core.Z3_get_numeral_string(ctx, a)))
        if k == z3.Z3_OP_TRUE:
            return "True"
        if k == z3.Z3_OP_FALSE:
            return "False"
        if k == z3.Z3_OP_UNINTERPRETED and not args:
            name = z3core.Z3_get_symbol_string(ctx, z3core.Z3_get_decl_name(ctx, decl))
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
        raise ValueError(f"cannot compile {_decl_text(ctx, decl)} in a term of {sorted(outputs)}")

    outs = {k: visit(t) for k, t in outputs.items()}
    body = "\n".join(lines)
    ret = ", ".join(f"{k!r}: {v}" for k, v in outs.items())
    src = f"def _f(v):\n{body}\n    return {{{ret}}}\n"
    namespace: dict[str, Any] = {}
    exec(compile(src, "<z3-compiled>", "exec"), namespace)
    fn: Compiled = namespace["_f"]
    return fn
