"""The release gate: is a parity JSON good enough to call a run a release run?

A release run must have run on CUDA (a CPU run proves nothing about the GPU kernels that
serve), cover both algorithms with enough prompts and tokens, be byte-identical between FDFO and
sync at batch size 1 for every case, and leak no KV slot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REQUIRED_ALGORITHMS = frozenset({"LowConfidence", "JointThreshold"})
MIN_PROMPTS = 3  # SGLang's own check: 3 prompts x 128 tokens at temperature 0
# SGLang checks 128 tokens; the shipped model's whole context is 128 tokens (prompts up to 22
# characters leave at most 106 new tokens), so the gate asks for 64, two full blocks of 32.
MIN_TOKENS = 64


def release_problems(report: Mapping[str, Any]) -> list[str]:
    """Every reason this parity report does not qualify as a release run (empty = it does)."""
    problems: list[str] = []
    device = str(report.get("device", ""))
    if not device.startswith("cuda"):
        problems.append(f"ran on {device or 'an unknown device'!r}: a release run must run on CUDA")
    if report.get("identical") is not True:
        problems.append("FDFO and sync outputs are not byte-identical for every case")
    leaked = report.get("leaked_slots")
    if leaked != 0:
        problems.append(f"leaked_slots={leaked!r}: must be 0")
    cases = report.get("cases") or []
    algos = {str(c.get("algorithm")) for c in cases if isinstance(c, Mapping)}
    missing = sorted(REQUIRED_ALGORITHMS - algos)
    if missing:
        problems.append(f"no cases for {missing}: run with --algorithm all")
    for algo in sorted(REQUIRED_ALGORITHMS & algos):
        mine = [c for c in cases if c.get("algorithm") == algo]
        if len(mine) < MIN_PROMPTS:
            problems.append(f"{algo}: {len(mine)} prompts; at least {MIN_PROMPTS} are required")
        short = [c for c in mine if int(c.get("max_new_tokens", 0)) < MIN_TOKENS]
        if short:
            problems.append(f"{algo}: cases with fewer than {MIN_TOKENS} new tokens")
    return problems


def release_check_main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="schedspec release-check")
    p.add_argument("parity_json", help="the JSON written by `schedspec parity --json`")
    args = p.parse_args(argv)
    report = json.loads(Path(args.parity_json).read_text(encoding="utf-8"))
    problems = release_problems(report)
    if problems:
        print("NOT a release run:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print(
        f"release run OK: {report['device']}, {len(report['cases'])} cases, byte-identical, no leak"
    )
    return 0
