"""Checking one's own vLLM scheduler class against stock vLLM's decisions.

The rules bound what a scheduler may do, not which of the allowed choices it makes: a class
that never batches a second request passes them. `verify` says so under its table when it ran a
user's class (`SCHEDSPEC_VLLM_SCHEDULER_CLS`) without `--twin`, naming the twin that decides as
stock vLLM; and `--twin real-vllm` (which would run the user's class too, comparing it with
itself) is refused, exit 2, by `verify` and `check-trace` alike.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.custom_scheduler import SCHEDULER_VARIABLE
from schedspec_cli.main import main
from spec.ar.config import ArConfig
from spec.ar.trace import write_ar_trace
from tests.engine_gate import require_engine
from tests.user_module import verify_run, write_user_module

USER_MODULE = '''
from vllm.v1.core.sched.scheduler import Scheduler


class Unchanged(Scheduler):
    """vLLM's scheduler as released."""
'''

NOTE = "must never do, not that it decides as the stock scheduler"


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.fixture
def own_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_user_module(tmp_path, monkeypatch, "my_sched", USER_MODULE)
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.Unchanged")


def test_a_run_of_ones_own_class_says_what_the_rules_do_not_check(
    own_class: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _, _ = verify_run(capsys, tmp_path, "real-vllm", 5)
    assert code == 0, out
    assert f"real-vllm: the rules check what my_sched.Unchanged {NOTE}" in out
    assert "--twin vllm-v1 (vllm-v1-prefix with prefix caching) compares its decisions" in out
    # with the twin named, nothing more to say
    code = main(["verify", "--impl", "real-vllm", "--examples", "5", "--twin", "vllm-v1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert NOTE not in out


def test_stock_vllm_runs_say_nothing_of_a_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: without the variable there is no class of the user's to speak of."""
    monkeypatch.delenv(SCHEDULER_VARIABLE, raising=False)
    code, out, _, _ = verify_run(capsys, tmp_path, "real-vllm", 5)
    assert code == 0, out
    assert NOTE not in out


@pytest.mark.parametrize("twin", ["real-vllm", "real-vllm-prefix"])
def test_a_real_vllm_twin_of_ones_own_class_is_refused(
    twin: str, own_class: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--impl", "real-vllm", "--examples", "5", "--twin", twin]) == 2
    err = capsys.readouterr().err.strip()
    assert f"invalid --twin={twin!r}: a twin that does not build your class" in err, err
    assert "SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.Unchanged" in err and "--twin vllm-v1" in err
    assert len(err.splitlines()) == 1
    log = tmp_path / "log.jsonl"
    with log.open("w", encoding="utf-8") as out:
        write_ar_trace([], out, ArConfig())
    assert main(["check-trace", str(log), "--twin", twin]) == 2
    err = capsys.readouterr().err.strip()
    assert f"invalid --twin={twin!r}: a twin that does not build your class" in err, err
