"""`integrations.hash_seed`: the vLLM check and shrink scripts run with one string-hash order
(`PYTHONHASHSEED=0` unless the user sets it), so a command prints the same figures on every
run. vLLM walks some sets of request ids in that order; with a random one a KV connector's
counts could differ by a few between two runs of the same command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from integrations.vllm import MANIFEST
from tests.engine_gate import require_engine
from tests.tier import full_tier

ROOT = Path(__file__).resolve().parents[1]

#: A script that pins the seed, then prints it and a string's hash, and exits 3.
PINNING = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from integrations.hash_seed import pin_hash_seed
pin_hash_seed()
print(os.environ["PYTHONHASHSEED"], hash("schedspec"), sys.argv[1:])
sys.exit(3)
"""


def _run(script: Path, seed: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_a_script_runs_again_with_the_seed_pinned_unless_it_is_set(tmp_path: Path) -> None:
    """Without the variable the script is run again under seed 0 (the same hash in two runs,
    its arguments and exit status kept); a seed the user sets, `random` included, is kept."""
    script = tmp_path / "pinning.py"
    script.write_text(PINNING)
    first, second = _run(script, None, "--x", "1"), _run(script, None, "--x", "1")
    assert first.returncode == second.returncode == 3, first.stderr
    assert first.stdout == second.stdout, (first.stdout, second.stdout)
    assert first.stdout.startswith("0 ") and first.stdout.rstrip().endswith("['--x', '1']")
    assert _run(script, "5").stdout.startswith("5 ")
    assert _run(script, "random").stdout.startswith("random ")


# the full tier's: three processes importing vLLM; per push the pinning is the test above
@full_tier
def test_the_check_script_records_the_pinned_seed(tmp_path: Path) -> None:
    """`scripts/vllm_async_check.py` run without the variable writes seed "0" in its figures
    file; with the variable set, that value."""
    require_engine(MANIFEST, "vllm", "vLLM")
    for seed, recorded in ((None, "0"), ("7", "7")):
        out = tmp_path / f"figures-{recorded}.json"
        res = _run(
            ROOT / "scripts" / "vllm_async_check.py", seed, "--programs", "1", "--json", str(out)
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert json.loads(out.read_text())["python_hash_seed"] == recorded
