"""The call deadline: an implementation call that never returns is a `progress` finding with
the calls that led to it, exit status 1 — never a hung run (`properties.deadline`)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

from properties.deadline import (
    DEFAULT_CALL_TIMEOUT_S,
    CallDeadlineExceeded,
    call_deadline,
    call_timeout,
    call_timeout_set,
)
from properties.verify import verify_implementation
from schedspec_cli.impls import resolve
from schedspec_cli.main import main
from tests.hang_adapters import SpinsInEveryStepFromTheThird, spin

HANGS = "tests.hang_adapters"


def _verify(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["verify", "--examples", "20", "--call-timeout", "1", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_a_round_that_never_returns_is_a_progress_violation_with_its_program(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_json = tmp_path / "v.json"
    code, out, _ = _verify(["--impl", f"{HANGS}:spins_in_a_round", "--json", str(out_json)], capsys)
    assert code == 1
    assert "violation of [progress]" in out
    assert "did not return from run_round within 1 s" in out
    program = out.split("--- program ---", 1)[1]
    lines = [line for line in program.splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("configure(config=DllmConfig(")
    assert sum(line == "run_round()" for line in lines) == 3  # the hang is the third round
    assert lines[-1] == "run_round()"
    report = json.loads(out_json.read_text())
    assert report["rules"] == ["progress"]
    assert "hung" in report["stopped"]


def test_a_deadlock_in_drain_is_found_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _verify(["--impl", f"{HANGS}:deadlocks_in_drain"], capsys)
    assert code == 1
    assert "did not return from drain within 1 s" in out


def test_an_ar_step_that_never_returns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _verify(["--impl", f"{HANGS}:spins_in_a_step"], capsys)
    assert code == 1
    assert "violation of [progress]" in out
    assert "did not return from step within 1 s" in out
    assert "configure(config=ArConfig(" in out


def test_after_a_hang_the_teardown_calls_nothing_more(capsys: pytest.CaptureFixture[str]) -> None:
    """An implementation that stays hung once it hung: the step that hung is reported, and the
    teardown's drain does not call into it again (that would wait out the deadline twice and
    blame the drain)."""
    SpinsInEveryStepFromTheThird.spins = 0
    code, out, _ = _verify(["--impl", f"{HANGS}:spins_in_every_step_from_the_third"], capsys)
    assert code == 1
    assert "did not return from step within 1 s" in out
    assert out.rstrip().splitlines()[-1] == "step()"
    assert SpinsInEveryStepFromTheThird.spins == 1


def test_a_factory_that_never_returns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _verify(["--impl", f"{HANGS}:spins_when_built"], capsys)
    assert code == 1
    assert "did not return from building the implementation within 1 s" in out


def test_a_campaign_stops_at_a_hang_instead_of_waiting_it_out_again() -> None:
    implementation = resolve(f"{HANGS}:spins_in_a_round", "dllm").implementation
    result = verify_implementation("spins", implementation, 20, keep_going=True, call_timeout=1)
    assert result.rules == ["progress"]
    assert result.stopped == "the implementation hung; it cannot be driven any further"


def test_parity_impl_reports_a_hung_run_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--impl", f"{HANGS}:deadlocks_in_drain", "--run-timeout", "1", "--prompts", "2"]
    code = main(["parity", *argv])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert "[progress]" in err and "did not finish the sync@1 run within 1 s" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--impl", "reference-dllm", "--call-timeout", "-1"], "--call-timeout"),
        (["verify", "--impl", "reference-dllm", "--call-timeout", "soon"], "--call-timeout"),
        (["parity", "--run-timeout", "5"], "--impl engine"),
        (["parity", "--impl", "reference-dllm", "--run-timeout", "1e9"], "--run-timeout"),
    ],
)
def test_bad_timeouts_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _timer_left() -> float:
    """What the real-time timer has left (pytest-timeout's, when it runs by signal; else 0)."""
    return signal.getitimer(signal.ITIMER_REAL)[0]


def _same_timer(before: float) -> bool:
    return abs(_timer_left() - before) < 5.0 if before else _timer_left() == 0.0


def test_the_deadline_interrupts_a_spin_and_restores_the_signal_state() -> None:
    handler, timer = signal.getsignal(signal.SIGALRM), _timer_left()
    with (
        call_timeout_set(0.2),
        pytest.raises(CallDeadlineExceeded) as caught,
        call_deadline("spinning"),
    ):
        spin()
    assert caught.value.rule == "progress" and caught.value.what == "spinning"
    assert signal.getsignal(signal.SIGALRM) is handler
    assert _same_timer(timer)


def test_no_deadline_arms_nothing() -> None:
    assert call_timeout() == DEFAULT_CALL_TIMEOUT_S
    timer = _timer_left()
    with call_timeout_set(0), call_deadline("x"):
        assert call_timeout() is None
        assert _same_timer(timer)
    with call_timeout_set(5), call_deadline("x"):
        assert 0.0 < _timer_left() <= 5.0
    assert _same_timer(timer)
    assert call_timeout() == DEFAULT_CALL_TIMEOUT_S
    with pytest.raises(ValueError, match=">= 0"), call_timeout_set(-1):
        pass


def test_an_outer_timer_keeps_its_place() -> None:
    """A timer already armed (an outer call, pytest-timeout) is never cancelled: one that fires
    first stays in charge, a later one is re-armed after the call with what it had left."""
    with call_timeout_set(30), call_deadline("outer"):
        outer = signal.getitimer(signal.ITIMER_REAL)[0]
        with call_timeout_set(1), call_deadline("inner"):
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 1.0  # the inner one runs
        assert 1.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= outer  # the outer is back
        with call_timeout_set(60), call_deadline("inner"):
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= outer  # the outer fires first
    with (
        call_timeout_set(30),
        call_deadline("outer"),
        pytest.raises(CallDeadlineExceeded),
        call_timeout_set(0.2),
        call_deadline("inner"),
    ):
        spin()


def test_off_the_main_thread_nothing_is_armed() -> None:
    timer = _timer_left()
    seen: list[bool] = []

    def worker() -> None:
        with call_timeout_set(1), call_deadline("x"):
            seen.append(_same_timer(timer))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [True]
