"""A user's module and a `verify` run of it, as the custom-scheduler tests of each engine use
them (`SCHEDSPEC_VLLM_SCHEDULER_CLS`, `SCHEDSPEC_VIDUR_SCHEDULER_CLS`)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from schedspec_cli.main import main


def write_user_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str
) -> Path:
    """`source` as the module `name` in `tmp_path`, importable (and not yet imported) for the
    rest of the test."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return path


def verify_run(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    impl: str,
    n: int = 100,
    extra: Sequence[str] = (),
) -> tuple[int, str, str, dict[str, Any]]:
    """`schedspec verify --impl IMPL --examples N --json ... EXTRA` in this process: the exit
    status, what it printed to stdout and stderr, and its JSON ({} when none was written)."""
    out_json = tmp_path / "verify.json"
    argv = ["verify", "--impl", impl, "--examples", str(n), "--json", str(out_json), *extra]
    code = main(argv)
    cap = capsys.readouterr()
    data = json.loads(out_json.read_text()) if out_json.exists() else {}
    return code, cap.out, cap.err, data
