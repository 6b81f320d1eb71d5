"""The wheel with its `engine` extra, installed the way a release manager or an engine's CI
installs it: torch 2.13.0 (CPU) first, then the extra's other requirements, the declared
dependencies and the wheel (`--no-deps`), in a fresh virtual environment outside the repository
with none of the development venv's tools.

From the user's own directory:
- the release command, `parity`, serves the shipped model from the installed package;
- the real engines, from the engine cache `schedspec install-engines` filled (the shared one,
  as a user's second environment would find it), verify under their profiles. That needs every
  module they import to be in their install manifest or in what the extra brings: vLLM and
  SGLang import `packaging` and `PIL` at module level, which the development venv has through
  pytest and matplotlib and a user's does not. Until the manifests named them (2026-11-26),
  this environment's `verify --impl real-vllm` failed with "No module named 'packaging'"
  reported as a violation of the suite;
- the main job, whose report needs the `plots` extra as well, is refused in one line before it
  runs.

The extra's requirements are read from pyproject.toml, so the test installs what
`schedspec[engine]` declares, with torch pinned to 2.13.0 as the README says and the rest at
constraints.txt's versions.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from integrations.manifest import cache_root
from integrations.sglang import MANIFEST as SGLANG
from integrations.vidur import MANIFEST as VIDUR
from integrations.vllm import MANIFEST as VLLM
from tests.engine_gate import require_engine
from tests.test_install_wheel import ROOT, install_wheel, run
from tests.tier import full_tier

# one worker builds the environment for the module's tests (each worker would build its own);
# the full tier's (tests/tier.py): per push tests/test_install_wheel.py installs the wheel alone
pytestmark = [pytest.mark.xdist_group("install-wheel-engine"), full_tier]

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
ENGINE_EXTRA = ("torch==2.13.0", *PYPROJECT["project"]["optional-dependencies"]["engine"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    _, env, user = install_wheel(tmp_path_factory.mktemp("wheel-engine"), ENGINE_EXTRA)
    return env, user


def test_the_installed_engine_extra_runs_the_parity_check(
    installed: tuple[dict[str, str], Path],
) -> None:
    env, user = installed
    res = run(["schedspec", "parity", "--device", "cpu", "--prompts", "1"], user, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "device cpu: IDENTICAL, golden agrees" in res.stdout, res.stdout[-2000:]
    assert "leaked slots 0, held rows 0" in res.stdout, res.stdout[-2000:]


def test_the_real_engines_verify_from_an_installed_wheel(
    installed: tuple[dict[str, str], Path],
) -> None:
    require_engine(VLLM, "vllm", "vLLM")
    require_engine(SGLANG, "sglang", "SGLang")
    require_engine(VIDUR, "vidur", "Vidur")
    env, user = installed
    env = {**env, "SCHEDSPEC_ENGINE_CACHE": str(cache_root())}
    impls = ("real-vllm", "real-vllm-prefix", "real-sglang-dllm", "real-vidur-sarathi")
    argv = ["schedspec", "verify", *(a for i in impls for a in ("--impl", i)), "--examples", "8"]
    res = run(argv, user, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = {row[0]: row[2] for row in map(str.split, res.stdout.splitlines()) if len(row) > 2}
    assert all(results.get(impl) == "PASS" for impl in impls), res.stdout
    # requests warns on every import without a character-detection package (vLLM imports it)
    assert "RequestsDependencyWarning" not in res.stderr, res.stderr[-2000:]


def test_the_main_job_without_the_plots_extra_is_refused_before_it_runs(
    installed: tuple[dict[str, str], Path],
) -> None:
    """The main job's report holds PNG plots: without matplotlib it used to run every step and
    then fail its last one with "No module named 'matplotlib'" (exit 1, as if a check failed)."""
    env, user = installed
    report = user / "verify-report"
    res = run(["schedspec", "verify", "--report", str(report)], user, env)
    assert res.returncode == 2 and "schedspec[plots]" in res.stderr, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not report.exists()
