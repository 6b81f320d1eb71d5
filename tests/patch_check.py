"""Apply a fix set's patch the way a maintainer would: `git apply -p1` in a checkout."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from integrations.patches import FixSet, module_file


def git_apply_to_copies(
    root: Path, sources: Mapping[str, tuple[str, str]], diff: str
) -> dict[str, str]:
    """Write each module's installed text (`FixSet.fixed_sources`' first item) under `root`
    where the patch names it, `git apply -p1` the diff there, and return each module's text
    after it (which a test compares with the edited text the fixes run)."""
    for module, (text, _) in sources.items():
        path = root / module_file(module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (root / "fixes.patch").write_text(diff, encoding="utf-8")
    subprocess.run(["git", "init", "-q", "."], cwd=root, check=True)
    subprocess.run(["git", "apply", "-p1", "fixes.patch"], cwd=root, check=True)
    return {module: (root / module_file(module)).read_text(encoding="utf-8") for module in sources}


def apply_fix_set(root: Path, fixes: FixSet) -> tuple[str, dict[str, str]]:
    """Every fix of `fixes` as the patch `scripts/engine_fixes_diff.py` prints, `git apply`d
    to copies of the installed files under `root`; asserts each patched file is the very text
    the fixes run, and returns the patch and the patched texts (by module)."""
    sources = fixes.fixed_sources(fixes.names)
    diff = fixes.as_diff(fixes.names)
    patched = git_apply_to_copies(root, sources, diff)
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    return diff, patched
