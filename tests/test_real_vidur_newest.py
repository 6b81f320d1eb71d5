"""Vidur's newest release, 0.0.26, selected with SCHEDSPEC_VIDUR_VERSION: the same adapter drives
its vLLM, Sarathi and Orca replica schedulers (0.0.26 dropped LightLLM and FasterTransformer and
moved the block size, pool size and watermark into a `CacheConfig`).

One process imports one release (both are the package `vidur`), and the rest of the suite runs
0.0.25 in its workers, so every check here runs in a subprocess with the variable set. The
findings of 0.0.25 that concern these three schedulers reproduce on 0.0.26 with the same
counterexamples as `tests/test_real_vidur.py`: vLLM restarts a decode that needs no block
(`progress`), Orca floors max_model_len to whole blocks (`kv_covers_scheduled`) and records
no attention context for a request it admits (`batch_context`), and `Request.restart` keeps the
stage counters (Vidur's own AssertionError without the adapter's repair). The fixes of the
first three, the first two renamed for 0.0.26 (`fixes.fixes_for`), make their counterexamples
conform and apply as a patch. Sarathi passes the suite as it is, as on 0.0.25.
Mnemosyne (FCFS, fixed chunk) keeps two of its three 0.0.25 findings (0.0.26 dropped the
prefill assertion itself); their fixes make it pass, and then it decides as `vidur-mnemosyne`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integrations.vidur.manifest import DEFAULT_VERSION, VERSION_VARIABLE, manifest_of
from tests.engine_gate import require_engine
from tests.tier import full_tier

# one worker under run-tests' --dist loadgroup: the newest release's counterexamples
# (`newest_found`) are found once, not once per worker
pytestmark = pytest.mark.xdist_group("vidur-newest")

ROOT = Path(__file__).resolve().parents[1]
NEWEST = "0.0.26"
SCHEDSPEC = str(Path(sys.executable).parent / "schedspec")

# Runs in the subprocess: each counterexample of tests/test_real_vidur.py on the selected
# release, printed as JSON (rule, whether the message names an AssertionError, preemptions).
COUNTEREXAMPLES = """
import dataclasses, json, tempfile
from pathlib import Path
from integrations.vidur import (
    REAL_VIDUR_MNEMOSYNE, REAL_VIDUR_ORCA, REAL_VIDUR_SARATHI, REAL_VIDUR_VLLM, build)
from integrations.vidur.engine import load
from integrations.vidur.fixes import VIDUR_FIXES, vidur_fixed
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.verify import run_machine, verify_settings
from reference.ar.mnemosyne import VIDUR_MNEMOSYNE
from reference.ar.vidur import VIDUR_ORCA
from reference.ar.vidur_released import VIDUR_SARATHI_RELEASED, VIDUR_VLLM_RELEASED
from tests.patch_check import git_apply_to_copies
from tests.test_ar_mnemosyne import queue_decisions
from tests.test_real_vidur import (
    MNEMOSYNE_SKIP, MNEMOSYNE_SKIP_REQUESTS, batch_keeps_its_order, cfg, mnemosyne_queue_order,
    violation)
from spec.ar.config import ArRequest, ArRules


def run(factory, policy, config, *requests, steps=0):
    h = ArHarness(factory, config, policy=policy)
    v = violation(h, *requests, steps=steps)
    if v is None:
        return None
    return {"rule": str(v.rule), "assertion": "AssertionError" in str(v),
            "preempted": sum(type(e).__name__ == "ArPreempted" for e in h.events)}


def sarathi(fix):
    def make(config, sink):
        adapter = build("sarathi", config, sink)
        adapter.fix_restart = fix
        return adapter
    return make


def suite(impl, twin=None):
    machine = ar_conformance_machine(
        impl.factory, profile=impl.profile, twin=twin.factory if twin else None,
        twin_policy=twin.profile.policy if twin else None)
    err, _ = run_machine(machine, verify_settings(60))
    return None if err is None else str(err).splitlines()[0]


def vllm(idealised=False):
    policy = REAL_VIDUR_VLLM.profile.policy
    if idealised:  # without the declared preemption_may_empty_step
        policy = dataclasses.replace(policy, rules=ArRules())
    return run(REAL_VIDUR_VLLM.factory, policy,
               cfg(block_size=2, num_blocks=2, max_num_batched_tokens=5, max_model_len=5,
                   max_num_seqs=1),
               ArRequest("r0", 3, 2))


def orca():
    return run(REAL_VIDUR_ORCA.factory, REAL_VIDUR_ORCA.profile.policy,
               cfg(block_size=4, num_blocks=2, max_num_batched_tokens=8, max_model_len=7),
               ArRequest("r0", 6, 1))


def orca_reservation_floor():
    # Orca's other finding (no context recorded for a request it admits) comes first
    with vidur_fixed(["orca-batch-context"]):
        return orca()


def mnemosyne():
    return run(REAL_VIDUR_MNEMOSYNE.factory, REAL_VIDUR_MNEMOSYNE.profile.policy,
               MNEMOSYNE_SKIP, *MNEMOSYNE_SKIP_REQUESTS, steps=1)


restart = cfg(block_size=1, num_blocks=5, max_num_batched_tokens=3, max_model_len=5,
              enable_chunked_prefill=True)
restart_requests = (ArRequest("r0", 1, 3), ArRequest("r1", 3, 2))
found = {
    "loaded": load().version,
    "vllm_decode_block": vllm(),
    "vllm_decode_block_idealised": vllm(idealised=True),
    "orca_batch_context": orca(),
    "orca_reservation_floor": orca_reservation_floor(),
    "restart_unrepaired": run(sarathi(False), REAL_VIDUR_SARATHI.profile.policy, restart,
                              *restart_requests),
    "restart_repaired": run(sarathi(True), REAL_VIDUR_SARATHI.profile.policy, restart,
                            *restart_requests),
    "fixes": list(VIDUR_FIXES.names),
}
with vidur_fixed(["vllm-decode-block"]):
    found["vllm_fixed"] = vllm()
    found["vllm_fixed_suite"] = suite(REAL_VIDUR_VLLM)
    found["vllm_fixed_twin"] = suite(REAL_VIDUR_VLLM, twin=VIDUR_VLLM_RELEASED)
found["sarathi_twin"] = suite(REAL_VIDUR_SARATHI, twin=VIDUR_SARATHI_RELEASED)
with vidur_fixed(["reservation-ceil", "orca-batch-context"]):
    found["orca_fixed"] = orca()
    found["orca_fixed_suite"] = suite(REAL_VIDUR_ORCA)
    found["orca_fixed_twin"] = suite(REAL_VIDUR_ORCA, twin=VIDUR_ORCA)
found["mnemosyne_skip"] = mnemosyne()
found["mnemosyne_in_order"] = batch_keeps_its_order(load())
with vidur_fixed(["mnemosyne-skip-frees"]):
    found["mnemosyne_skip_fixed"] = mnemosyne()
with vidur_fixed(["mnemosyne-batch-order"]):
    found["mnemosyne_in_order_fixed"] = batch_keeps_its_order(load())
with vidur_fixed(["mnemosyne-skip-frees", "mnemosyne-batch-order"]):
    found["mnemosyne_fixed_suite"] = suite(REAL_VIDUR_MNEMOSYNE)
    found["mnemosyne_fixed_twin"] = suite(REAL_VIDUR_MNEMOSYNE, twin=VIDUR_MNEMOSYNE)
    found["mnemosyne_queue_order"] = mnemosyne_queue_order(queue_decisions(REAL_VIDUR_MNEMOSYNE))
sources = VIDUR_FIXES.fixed_sources(VIDUR_FIXES.names)
with tempfile.TemporaryDirectory() as tmp:
    patched = git_apply_to_copies(Path(tmp), sources, VIDUR_FIXES.as_diff(VIDUR_FIXES.names))
found["patch_applies"] = patched == {module: fixed for module, (_, fixed) in sources.items()}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def newest_env() -> dict[str, str]:
    """The environment that selects the newest release; skips (SCHEDSPEC_SKIP_ENGINES=1) or
    fails naming the install command when it is not installed."""
    command = f"{VERSION_VARIABLE}={NEWEST} schedspec install-engines vidur"
    require_engine(manifest_of(NEWEST), "vidur", "Vidur", command=command)
    return {**os.environ, VERSION_VARIABLE: NEWEST}


def schedspec(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDSPEC, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def newest_found(newest_env: dict[str, str]) -> dict[str, object]:
    """What `COUNTEREXAMPLES` found, run once on the newest release."""
    res = subprocess.run(
        [sys.executable, "-c", COUNTEREXAMPLES],
        cwd=ROOT,
        env=newest_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    found: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return found


@full_tier
def test_the_findings_reproduce_on_the_newest_release(newest_found: dict[str, Any]) -> None:
    found = newest_found
    assert found["loaded"] == NEWEST
    # vLLM v0's needless restart, declared (preemption_may_empty_step): a stall only to the
    # idealised rules
    assert found["vllm_decode_block"] is None, found
    assert found["vllm_decode_block_idealised"]["rule"] == "progress", found
    assert found["vllm_decode_block_idealised"]["preempted"] >= 1, found
    assert found["orca_batch_context"]["rule"] == "batch_context", found
    assert found["orca_reservation_floor"]["rule"] == "kv_covers_scheduled", found
    unrepaired = found["restart_unrepaired"]
    assert unrepaired["rule"] == "implementation_error" and unrepaired["assertion"], found
    assert found["restart_repaired"] is None, found


@full_tier
def test_the_fixes_of_the_remaining_findings_apply_to_the_newest_release(
    newest_found: dict[str, Any],
) -> None:
    """`reservation-ceil` and `vllm-decode-block`, with 0.0.26's names for the block and pool
    sizes (`fixes_for`), and `orca-batch-context` as it is: each makes its counterexample
    conform and its scheduler pass 60 examples of the suite, and `scripts/engine_fixes_diff.py
    vidur` gives them as a patch that `git apply` makes on copies of 0.0.26's files."""
    found = newest_found
    assert found["fixes"] == [
        "reservation-ceil",
        "orca-batch-context",
        "vllm-decode-block",
        "micro-batch-floor",
        "mnemosyne-skip-frees",
        "mnemosyne-batch-order",
        "kvp-last-group-zero",
        "kvp-no-victim",
    ], found
    assert found["vllm_fixed"] is None and found["vllm_fixed_suite"] is None, found
    assert found["orca_fixed"] is None and found["orca_fixed_suite"] is None, found
    assert found["patch_applies"] is True, found


@full_tier
def test_mnemosyne_s_two_findings_reproduce_and_their_fixes_pass_on_the_newest_release(
    newest_found: dict[str, Any],
) -> None:
    """0.0.26's Mnemosyne (FCFS, fixed chunk) as 0.0.25's less its prefill assertion, which
    0.0.26 dropped: a request skipped for lack of tokens keeps the blocks just allocated to it
    (`waiting_holds_nothing`), and a KV-parallel batch lists its requests in address order.
    With both fixes it passes 60 examples of the suite under its declared profile."""
    found = newest_found
    assert found["mnemosyne_skip"]["rule"] == "waiting_holds_nothing", found
    assert found["mnemosyne_skip_fixed"] is None, found
    assert found["mnemosyne_in_order"] is False, found
    assert found["mnemosyne_in_order_fixed"] is True, found
    assert found["mnemosyne_fixed_suite"] is None, found


@full_tier
def test_the_fixed_newest_orca_decides_as_the_reference(newest_found: dict[str, Any]) -> None:
    """As on 0.0.25, the project's reference Orca (`vidur-orca`) makes the same decisions step
    by step as the real class with its finding fixed, on 60 examples of the suite (rule
    `twin_decisions`)."""
    assert newest_found["orca_fixed_twin"] is None, newest_found


@full_tier
def test_the_fixed_newest_mnemosyne_decides_as_the_reference(
    newest_found: dict[str, Any],
) -> None:
    """0.0.26's Mnemosyne with its two fixes makes the decisions of `vidur-mnemosyne` step by
    step on 60 examples of the suite (2,000 passed once, 2026-11-26), and on the program where
    the releases differ it finishes r2's prefill before r1 takes the chunk's last token (its
    partial-prefill queue is read first), unlike `vidur-mnemosyne-one-queue` (0.0.25)."""
    found = newest_found
    assert found["mnemosyne_fixed_twin"] is None, found
    order = {"step2": [["r1", 1], ["r2", 1]], "new": True, "one": False}
    assert found["mnemosyne_queue_order"] == order, found


@full_tier
def test_the_newest_vllm_and_sarathi_decide_as_their_released_re_implementations(
    newest_found: dict[str, Any],
) -> None:
    """As on 0.0.25: 0.0.26's vLLM with its finding fixed decides as `vidur-vllm-released`,
    and its Sarathi as it is as `vidur-sarathi-released`, step by step on 60 examples of the
    suite each (2,000 each passed once, 2026-11-26)."""
    assert newest_found["vllm_fixed_twin"] is None, newest_found
    assert newest_found["sarathi_twin"] is None, newest_found


@full_tier
def test_sarathi_passes_the_suite_on_the_newest_release(newest_env: dict[str, str]) -> None:
    res = schedspec(newest_env, "verify", "--impl", "real-vidur-sarathi", "--examples", "100")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "PASS" in res.stdout and "Traceback" not in res.stderr


@full_tier
def test_orca_fails_the_suite_on_the_newest_release_with_its_finding(
    newest_env: dict[str, str],
) -> None:
    res = schedspec(newest_env, "verify", "--impl", "real-vidur-orca", "--examples", "100")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    # the first batch of any program: no context recorded for the request it admits
    assert "violation of [batch_context]" in res.stdout, res.stdout[-3000:]


@full_tier
def test_both_releases_draw_the_same_programs_and_decide_vllm_alike(
    newest_env: dict[str, str], tmp_path: Path
) -> None:
    """The suite's programs do not depend on the release's source. Hypothesis mines the
    constants of the modules it takes for the user's code; before the engines lived in an
    install's `site-packages/` it mined Vidur's, and these two runs drew different programs
    from one seed: 0.0.25 failed with what was then the decode-block finding and 0.0.26
    passed. Now both pass (vLLM v0's needless restart is declared), with the same statistics:
    the same programs, decided alike."""
    require_engine(manifest_of(DEFAULT_VERSION), "vidur", "Vidur")
    default_env = {k: v for k, v in newest_env.items() if k != VERSION_VARIABLE}
    outputs = []
    for env in (default_env, newest_env):
        res = subprocess.run(
            [SCHEDSPEC, "verify", "--impl", "real-vidur-vllm", "--examples", "100"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        row = next(line for line in res.stdout.splitlines() if line.startswith("real-vidur-vllm "))
        outputs.append(row.split()[2:5])  # result, examples, steps
    assert outputs[0] == outputs[1], outputs
    assert outputs[0][0] == "PASS", outputs


@full_tier
def test_a_scheduler_the_release_dropped_is_refused_in_one_line(
    newest_env: dict[str, str],
) -> None:
    res = schedspec(newest_env, "verify", "--impl", "real-vidur-lightllm")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"Vidur {NEWEST} ships (vllm, sarathi, orca" in res.stderr, res.stderr
    assert f"unset {VERSION_VARIABLE}" in res.stderr, res.stderr
    listed = schedspec(newest_env, "list-impls")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("real-vidur-ft "))
    assert f"not in vidur {NEWEST}" in row, row


def test_an_unknown_release_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, VERSION_VARIABLE: "0.0.1"}
    for argv in (("verify", "--impl", "real-vidur-vllm"), ("install-engines", "vidur")):
        res = schedspec(env, *argv)
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
        assert "0.0.25, 0.0.26" in res.stderr, res.stderr
