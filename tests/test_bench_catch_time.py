"""`scripts/bench_catch_time.py` hunts each seeded bug as the catalogue's own test does: under
the mutant's profile. Until 2026-11-26 it built every dLLM machine under the default profile,
so the mutants that need a declared option (`ignore_eos`, `stop_token_ids`, PREFILL_FIRST, rows
released between rounds) were reported as not caught or caught by another rule."""

from __future__ import annotations

import json
from pathlib import Path

from spec.profile import DllmProfile
from tests.mutants import MUTANTS
from tests.script_module import load_script

WITH_A_PROFILE = sorted(name for name, m in MUTANTS.items() if m.profile != DllmProfile())


def test_the_benchmark_catches_the_mutants_that_need_a_profile_with_their_rule(
    tmp_path: Path,
) -> None:
    assert len(WITH_A_PROFILE) >= 5, WITH_A_PROFILE  # the catalogue still has them
    bench = load_script("bench_catch_time")
    out = tmp_path / "catch.json"
    argv = ["--only", ",".join(WITH_A_PROFILE), "--seeds", "0", "--no-shrink", "--json", str(out)]
    code = bench.main(argv)
    rows = json.loads(out.read_text(encoding="utf-8"))["mutants"]
    caught = {r["mutant"]: r["rule"] for r in rows}
    assert caught == {n: MUTANTS[n].rule for n in WITH_A_PROFILE}
    assert code == 0
