"""mypy --strict and ruff are part of the suite: a type error or lint error fails CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_strict_on_the_packages() -> None:
    res = run(str(BIN / "mypy"), "--strict", "spec", "reference", "properties", "gpu")
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


def test_dependency_direction() -> None:
    import ast

    banned = {
        "spec": {"reference", "gpu", "properties"},
        "reference": {"gpu", "properties"},
        "gpu": {"reference", "properties"},
        "properties": {"reference", "gpu"},
    }
    for pkg, bad in banned.items():
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    roots = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    roots = [node.module.split(".")[0]]
                else:
                    continue
                for r in roots:
                    assert r not in bad, f"{path}:{node.lineno} imports {r}"
