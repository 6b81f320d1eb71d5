"""What a type checker other than mypy sees of a package's public API, read from the source.

Two gaps, each found with `ast` (the standard library; pyright's `--verifytypes`, which reports
the same things, needs Node and is not a dependency):

- **undocumented**: a public module-level function or class, or a public method or property of
  a public class, without a docstring (what an editor shows on hover is then empty);
- **undeclared**: a public instance attribute of a public class assigned (`self.x = ...`) with
  no declared type: no annotation in the class body or on an assignment (`self.x: T = ...`),
  here or in a base class of the package, and not assigned straight from an annotated
  parameter. Another checker may infer it differently (`self.n = 0`: `int` or `Literal[0]`).

Public: a name without a leading underscore, in a module whose path has none either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Gap:
    """One symbol a type checker's user would miss something on."""

    where: str  # "path:line"
    symbol: str  # "Class.member" or "function"
    kind: str  # "undocumented" or "undeclared"

    def __str__(self) -> str:
        what = "has no docstring" if self.kind == "undocumented" else "has no declared type"
        return f"{self.where} {self.symbol} {what}"


def public(name: str) -> bool:
    return not name.startswith("_")


def public_modules(package: Path) -> Iterator[Path]:
    """The package's modules whose path has no private part (`__init__.py` counts as public)."""
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).parts
        if all(public(p) or p == "__init__.py" for p in parts):
            yield path


def _is_overload(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in fn.decorator_list
    )


def _self_targets(node: ast.AST) -> Iterator[ast.Attribute]:
    """`self.x` targets of an assignment, tuples unpacked."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "self":
            yield node
    elif isinstance(node, ast.Tuple | ast.List):
        for elt in node.elts:
            yield from _self_targets(elt)


def _declared_here(cls: ast.ClassDef) -> set[str]:
    """Attributes the class body or an annotated `self.x: T` in its methods declares."""
    names = {
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    for node in ast.walk(cls):
        if isinstance(node, ast.AnnAssign):
            names.update(t.attr for t in _self_targets(node.target))
    return names


def _base_names(cls: ast.ClassDef) -> list[str]:
    out = []
    for b in cls.bases:
        if isinstance(b, ast.Subscript):  # Generic[T], Base[X]
            b = b.value
        if isinstance(b, ast.Name):
            out.append(b.id)
        elif isinstance(b, ast.Attribute):
            out.append(b.attr)
    return out


def gaps_in_sources(
    sources: dict[str, str], *, docstrings: bool = True, declarations: bool = True
) -> list[Gap]:
    """The gaps of the modules `sources` (label -> source text). A base class is looked up by
    name among these modules' classes."""
    trees = {label: ast.parse(text) for label, text in sources.items()}
    classes: dict[str, list[ast.ClassDef]] = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)

    def declared(cls: ast.ClassDef, seen: frozenset[str] = frozenset()) -> set[str]:
        names = _declared_here(cls)
        for base in _base_names(cls):
            if base not in seen:
                for b in classes.get(base, []):
                    names |= declared(b, seen | {cls.name})
        return names

    gaps: list[Gap] = []
    for label, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if not public(node.name):
                continue
            if docstrings and ast.get_docstring(node) is None:
                gaps.append(Gap(f"{label}:{node.lineno}", node.name, "undocumented"))
            if isinstance(node, ast.ClassDef):
                gaps += _class_gaps(label, node, declared(node), docstrings, declarations)
    return gaps


def _class_gaps(
    label: str, cls: ast.ClassDef, declared: set[str], docstrings: bool, declarations: bool
) -> list[Gap]:
    gaps: list[Gap] = []
    reported: set[str] = set()
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        documented = ast.get_docstring(method) is not None
        if docstrings and public(method.name) and not _is_overload(method) and not documented:
            where = f"{label}:{method.lineno}"
            gaps.append(Gap(where, f"{cls.name}.{method.name}", "undocumented"))
        if not declarations:
            continue
        args = method.args
        annotated = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.annotation}
        for node in ast.walk(method):
            if not isinstance(node, ast.Assign):
                continue
            passthrough = isinstance(node.value, ast.Name) and node.value.id in annotated
            for target in node.targets:
                for attr in _self_targets(target):
                    name = attr.attr
                    loose = public(name) and name not in declared | reported
                    if loose and not passthrough:
                        reported.add(name)
                        where = f"{label}:{node.lineno}"
                        gaps.append(Gap(where, f"{cls.name}.{name}", "undeclared"))
    return gaps


def package_gaps(package: Path, *, docstrings: bool = True, declarations: bool = True) -> list[Gap]:
    """The gaps of every public module of `package` (a directory)."""
    root = package.parent
    sources = {
        str(path.relative_to(root)): path.read_text(encoding="utf-8")
        for path in public_modules(package)
    }
    return gaps_in_sources(sources, docstrings=docstrings, declarations=declarations)
