"""mypy --strict and ruff are part of the suite: a type error or lint error fails CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PACKAGES = ("spec", "reference", "properties", "gpu", "integrations", "schedspec_cli")


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_strict_on_the_packages_tests_and_scripts() -> None:
    res = run(str(BIN / "mypy"), "--strict", *PACKAGES, "tests", "scripts")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_lint_and_format() -> None:
    lint = run(str(BIN / "ruff"), "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = run(str(BIN / "ruff"), "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_spec_uses_only_the_standard_library() -> None:
    import ast

    stdlib = set(sys.stdlib_module_names) | {"spec"}
    for path in (ROOT / "spec").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] in stdlib, f"{path}: imports {name}"
    assert (ROOT / "spec" / "py.typed").exists()


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module level?) of every absolute import in a file."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    for stmt in tree.body:  # `if TYPE_CHECKING:` / try-blocks at module level count as top level
        if isinstance(stmt, ast.If | ast.Try):
            top |= {id(n) for n in ast.walk(stmt)}
    out: list[tuple[int, str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, id(node) in top))
    return out


def _import_strings(path: Path, roots: set[str]) -> list[tuple[int, str]]:
    """String constants that name a module of `roots` ('pkg.mod' or 'pkg.mod:attr'): imports
    made at run time by import string count as dependencies too."""
    import ast
    import re

    if not roots:
        return []
    alternatives = "|".join(sorted(roots))
    pattern = re.compile(rf"({alternatives})(\.[A-Za-z_]\w*)*(:[A-Za-z_][\w.]*)?")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and pattern.fullmatch(node.value)
        and ("." in node.value or ":" in node.value)  # a bare word may be a path part
    ]


# what each package may import from the project (third-party libraries are not restricted here)
ALLOWED = {
    "spec": {"spec"},
    "reference": {"spec", "reference"},
    "gpu": {"spec", "gpu"},
    "properties": {"spec", "properties"},  # a checking library: the spec only
    "integrations": {"spec", "integrations"},  # engine adapters: the spec only
    "schedspec_cli": set(PACKAGES),  # the composition root: the only package that composes
}


def test_dependency_direction() -> None:
    ours = set(PACKAGES)
    for pkg, allowed in ALLOWED.items():
        banned = ours - allowed
        for path in (ROOT / pkg).rglob("*.py"):
            for line, module, _ in _imports(path):
                root = module.split(".")[0]
                assert root not in banned, f"{path}:{line} imports {module}"
            named = _import_strings(path, banned)
            assert not named, f"{path}: names modules by import string: {named}"


def test_the_cli_imports_torch_engines_and_gpu_lazily() -> None:
    """`schedspec --help` must work without torch or any engine: gpu, torch, integrations and
    the engines are imported inside functions only."""
    lazy = {"gpu", "torch", "integrations", "vllm", "sglang", "vidur", "matplotlib"}
    for path in (ROOT / "schedspec_cli").rglob("*.py"):
        for line, module, top in _imports(path):
            assert not (top and module.split(".")[0] in lazy), f"{path}:{line} imports {module}"


def test_nothing_imports_the_cli() -> None:
    for pkg in set(PACKAGES) - {"schedspec_cli"}:
        for path in (ROOT / pkg).rglob("*.py"):
            for line, module, _ in _imports(path):
                assert module.split(".")[0] != "schedspec_cli", f"{path}:{line}"


def test_the_project_is_self_contained() -> None:
    """What users read and run says everything itself: no doc, module or script of ours points
    at a design note outside the repository."""
    outside = "DESIGN" + ".md"  # split so this test does not find itself
    sources = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for pkg in (*PACKAGES, "scripts", "tests"):
        sources.extend((ROOT / pkg).rglob("*.py"))
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if outside in line
    ]
    assert not hits, f"these point at {outside}, which users do not have: {hits}"
