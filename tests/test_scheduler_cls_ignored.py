"""A scheduler class of one's own named for an engine no implementation verified runs is said
to be ignored (`schedspec_cli.impls.ignored_scheduler_cls`): `vllm-v1` is a pure-Python
reference of vLLM's policy, not vLLM, so `SCHEDSPEC_VLLM_SCHEDULER_CLS` changes nothing there.
No engine needed: the built-ins are resolved, not run."""

from __future__ import annotations

import pytest

from schedspec_cli.impls import ignored_scheduler_cls, resolve
from schedspec_cli.main import main


def test_a_class_no_target_builds_is_said_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDSPEC_VLLM_SCHEDULER_CLS", "my_sched.Mine")
    monkeypatch.delenv("SCHEDSPEC_VIDUR_SCHEDULER_CLS", raising=False)
    line = ignored_scheduler_cls([resolve("vllm-v1", None), resolve("vllm-v1-prefix", None)])
    assert line is not None and "\n" not in line
    assert line.startswith("SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.Mine ignored: ")
    assert "(vllm-v1, vllm-v1-prefix)" in line and "real-vllm, real-vllm-prefix" in line
    assert "real-vidur" not in line


def test_nothing_is_said_when_unset_or_a_target_runs_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCHEDSPEC_VLLM_SCHEDULER_CLS", raising=False)
    monkeypatch.delenv("SCHEDSPEC_VIDUR_SCHEDULER_CLS", raising=False)
    assert ignored_scheduler_cls([resolve("vllm-v1", None)]) is None
    monkeypatch.setenv("SCHEDSPEC_VLLM_SCHEDULER_CLS", "my_sched.Mine")
    assert ignored_scheduler_cls([resolve("vllm-v1", None), resolve("real-vllm", None)]) is None


def test_verify_says_it_on_stderr_and_still_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCHEDSPEC_VLLM_SCHEDULER_CLS", "my_sched.Mine")
    monkeypatch.delenv("SCHEDSPEC_VIDUR_SCHEDULER_CLS", raising=False)
    assert main(["verify", "--impl", "vllm-v1", "--examples", "3"]) == 0
    err = capsys.readouterr().err
    assert "SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.Mine ignored: " in err, err


def test_blanks_for_an_engine_no_target_runs_are_noted_not_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blanks are refused only by a run that reads the variable (exit 2 there); elsewhere they
    are noted as ignored, as any other value is."""
    monkeypatch.setenv("SCHEDSPEC_VIDUR_SCHEDULER_CLS", "  ")
    monkeypatch.delenv("SCHEDSPEC_VLLM_SCHEDULER_CLS", raising=False)
    assert main(["verify", "--impl", "vllm-v1", "--examples", "3"]) == 0
    err = capsys.readouterr().err
    assert "SCHEDSPEC_VIDUR_SCHEDULER_CLS='  ' ignored: " in err, err
