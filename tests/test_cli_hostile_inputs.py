"""What a reviewer fed the command line to break its contract (exit 0, 1 or 2 with one line; no
traceback; never a hang), each now answered: a decision twin that hangs, an output path that
is an input, text the terminal cannot encode, a pool of a 320-digit page count, an attribute
whose lookup raises, a module whose import never returns, an implementation that leaves a
thread running, standard input closed. Each test fails without its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedspec_cli.main import main
from tests.script_module import load_script

SCHEDSPEC = Path(sys.executable).parent / "schedspec"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """A dLLM log `dllm.jsonl` and an AR one `ar.jsonl` of the reference schedulers."""
    load_script("fuzz_cli").recorded_inputs(tmp_path)
    return tmp_path


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    """`name` importable from `tmp_path` (the current directory, as `--impl` reads it)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


SPINNING_TWIN = """
    from reference.ar.vllm_v1 import VllmV1Scheduler


    class Spin(VllmV1Scheduler):
        calls = 0

        def step(self):
            Spin.calls += 1
            if Spin.calls > 1:  # the implementation's own first step is served
                while True:
                    pass
            return super().step()


    def spin_twin(config, sink):
        return Spin(config, sink)
"""


def test_a_twin_that_hangs_is_a_bad_twin_in_one_line_not_a_failure_of_the_implementation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its calls run under the implementation's deadline (they ran under none: the run hung,
    `--call-timeout` notwithstanding); the run stops at once (no shrinking that waits it out
    again), and the hang is the twin's: exit 2, as `check-trace` says it (a review found it
    first charged to the implementation as `[progress]`)."""
    _module(tmp_path, monkeypatch, "spinning_twin_a", SPINNING_TWIN)
    argv = ["verify", "--impl", "vllm-v1", "--twin", "spinning_twin_a:spin_twin"]
    assert main([*argv, "--examples", "5", "--call-timeout", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "invalid --twin='spinning_twin_a:spin_twin'" in err, err
    assert "the decision twin did not return from its step within 1 s" in err, err


HANGING_TWINS = """
    import time

    from reference.dllm import REFERENCE_TWIN


    def hang_given_a_run(events, config):
        if events:  # the probe's empty run returns
            while True:
                time.sleep(0.05)
        return REFERENCE_TWIN(events, config)


    def hang_at_once(events, config):
        while True:
            time.sleep(0.05)
"""


@pytest.mark.parametrize(
    ("twin", "said"),
    [("hang_given_a_run", "being given the run"), ("hang_at_once", "being given an empty run")],
)
def test_a_twin_that_hangs_in_its_first_call_is_a_bad_twin(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    twin: str,
    said: str,
) -> None:
    """The twin's outer call (given the run's events) and the probe before any run were
    outside every deadline: the command hung (a second review's finding)."""
    _module(tmp_path, monkeypatch, "hanging_twins_mod", HANGING_TWINS)
    argv = ["verify", "--impl", "reference-dllm", "--twin", f"hanging_twins_mod:{twin}"]
    assert main([*argv, "--examples", "3", "--call-timeout", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"did not return from {said} within 1 s" in err, err


def test_a_twin_that_refuses_the_implementations_configuration_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A `module:attribute` twin declares no space: the caching reference's twin refuses every
    configuration without the cache, which failed every example as `[twin_decisions]`."""
    argv = ["verify", "--impl", "reference-dllm", "--twin", "reference.prefix_cache:CACHED_TWIN"]
    assert main([*argv, "--examples", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "the decision twin refuses the configuration it was given" in err


def test_check_trace_with_a_twin_that_hangs_is_a_bad_twin_in_one_line(
    logs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _module(logs, monkeypatch, "spinning_twin_b", SPINNING_TWIN)
    argv = ["check-trace", str(logs / "ar.jsonl"), "--twin", "spinning_twin_b:spin_twin"]
    assert main([*argv, "--call-timeout", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "invalid --twin='spinning_twin_b:spin_twin'" in err, err
    assert "a twin that returns (the decision twin did not return from its step" in err, err
    assert "the deadline per call is --call-timeout" in err, err


def test_a_header_of_a_kind_that_does_not_exist_is_named(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`{"kind": "ar_config", ...}` was taken for an AR header, then refused as no header at all
    ("...or pass --config PATH", with --config passed)."""
    lines = (logs / "ar.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    del header["family"]
    header["kind"] = "ar_config"
    bad = logs / "ar_config.jsonl"
    bad.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert main(["check-trace", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        ':1: a header\'s kind is "config" (an AR one: {"kind": "config", '
        '"family": "ar", ...}), not "ar_config"'
    ), err


def test_a_family_against_a_log_without_a_header_names_what_told_it(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (logs / "ar.jsonl").read_text().splitlines()
    config = logs / "ar-config.json"
    config.write_text(lines[0])
    bare = logs / "ar-bare.jsonl"
    bare.write_text("\n".join(lines[1:]) + "\n")
    argv = ["check-trace", str(bare), "--config", str(config), "--family", "dllm"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "which its first event's kind says is ar" in err and "header" not in err, err


@pytest.mark.parametrize("flag", ["file", "--config"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    logs: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """`--json` naming the log (or `--config`'s file) replaced it with the verdict."""
    log = logs / "dllm.jsonl"
    before = log.read_text()
    argv = ["check-trace", str(log), "--json"]
    if flag == "file":
        assert main([*argv, str(log)]) == 2
    else:
        config = logs / "config.json"
        config.write_text(before.splitlines()[0])
        assert main([*argv, str(config), "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "which it would overwrite" in err, err
    assert log.read_text() == before


def test_verify_refuses_a_json_that_is_its_accept_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accept = tmp_path / "accept.txt"
    accept.write_text("progress: known\n")
    argv = ["verify", "--impl", "reference-dllm", "--examples", "2", "--accept", str(accept)]
    assert main([*argv, "--json", str(accept)]) == 2
    err = capsys.readouterr().err
    assert "another path than --accept's" in err, err
    assert accept.read_text() == "progress: known\n"


def test_a_lone_surrogate_in_a_log_is_printed_escaped_not_a_traceback(logs: Path) -> None:
    """Valid JSON (`"\\ud800"`) that UTF-8 cannot encode, in a request id the verdict prints:
    the violation is reported (exit 1), escaped, by the installed command."""
    lines = (logs / "ar.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"r0"', '"\\ud800"', 1)
    assert '"\\ud800"' in lines[1]
    bad = logs / "surrogate.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    ran = subprocess.run(
        [str(SCHEDSPEC), "check-trace", str(bad)], capture_output=True, text=True, env=env
    )
    assert ran.returncode == 1, ran
    assert "Traceback" not in ran.stderr and "\\ud800" in ran.stdout, ran


def test_a_pool_past_what_a_float_holds_is_refused_in_words(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 320-digit `kv_pages`: the memory estimate's message overflowed a float."""
    lines = (logs / "dllm.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["kv_pages"] = 10**320
    huge = logs / "huge.jsonl"
    huge.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert main(["check-trace", str(huge)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "invalid kv_pages=" in err, err
    assert "GiB" in err or "exceeds" in err, err


@pytest.mark.parametrize(
    ("source", "target", "said"),
    [
        (
            "def __getattr__(name):\n    raise RuntimeError('lazy load failed for ' + name)\n",
            "raising_getattr_mod:make",
            "reading 'make' raised RuntimeError: lazy load failed for make",
        ),
        (
            "class Holder:\n    @property\n    def make(self):\n        raise ValueError('boom')\n"
            "holder = Holder()\n",
            "raising_property_mod:holder.make",
            "reading 'make' raised ValueError: boom",
        ),
    ],
)
def test_an_attribute_whose_lookup_raises_is_a_usage_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    target: str,
    said: str,
) -> None:
    _module(tmp_path, monkeypatch, target.split(":")[0], source)
    assert main(["verify", "--impl", target, "--examples", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and said in err, err


def test_a_module_whose_import_never_returns_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its import runs under a deadline of its own, `loader.IMPORT_TIMEOUT_S` (it ran under
    none: every command hung; under `--call-timeout` a torch import could not pass 1 s)."""
    import schedspec_cli.loader as loader

    monkeypatch.setattr(loader, "IMPORT_TIMEOUT_S", 1.0)  # 300 s: a torch import takes seconds
    _module(tmp_path, monkeypatch, "import_spins_mod", "while True:\n    pass\n")
    argv = ["verify", "--impl", "import_spins_mod:x", "--examples", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "its import had not returned after 1 s" in err, err


def _command_in(where: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The installed `schedspec` run in `where` (its modules importable from there); a run that
    has not ended in two minutes fails the test instead of hanging it."""
    if argv[0] == "verify":
        argv = (*argv, "--examples", "2")
    return subprocess.run(
        [str(SCHEDSPEC), *argv], capture_output=True, text=True, cwd=where, timeout=120
    )


def test_the_command_exits_though_the_implementation_left_a_thread_running(
    tmp_path: Path,
) -> None:
    """A non-daemon thread an adapter started (an engine's worker) kept the process alive for
    ever after the verdict; now it exits with the verdict's status and says why it did not
    wait (the installed console script, `entry`)."""
    (tmp_path / "thread_leak_mod.py").write_text(
        textwrap.dedent(
            """
            import threading
            import time

            from reference.dllm import make_scheduler


            def leaky(config, sink):
                threading.Thread(target=time.sleep, args=(10**6,), name="worker").start()
                return make_scheduler(config, sink)
            """
        ),
        encoding="utf-8",
    )
    ran = _command_in(tmp_path, "verify", "--impl", "thread_leak_mod:leaky", "--family", "dllm")
    assert ran.returncode == 0, ran
    assert "thread(s) the implementation started still run (worker" in ran.stderr, ran.stderr
    assert "exiting with status 0 without waiting for them" in ran.stderr, ran.stderr


def test_check_trace_of_standard_input_when_it_is_closed_says_so(logs: Path) -> None:
    ran = subprocess.run(
        ["bash", "-c", f"'{SCHEDSPEC}' check-trace - <&-"], capture_output=True, text=True
    )
    assert ran.returncode == 2, ran
    err = ran.stderr.strip()
    assert "\n" not in err and "'-' with standard input open" in err, err


def test_a_json_that_cannot_be_written_at_the_end_names_its_path(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`/dev/full` passes every check made before the run (it is writable) and fails only when
    written: the error names it (it said only "No space left on device")."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this platform")
    assert main(["check-trace", str(logs / "dllm.jsonl"), "--json", "/dev/full"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "schedspec: error: /dev/full: No space left on device", err


ADAPTER_LIMITS = """
    from reference.dllm import REFERENCE_PROFILE, ReferenceDllmScheduler
    from spec.config import Mode
    from spec.errors import CannotDrive
    from spec.events import Admitted
    from spec.implementation import DllmImplementation


    class RuleThenLimit(ReferenceDllmScheduler):
        rounds = 0

        def run_round(self):
            self.rounds += 1
            try:
                if self.rounds == 3:
                    self.sink(Admitted("ghost", 0))  # a rule broken
                super().run_round()
            except Exception as err:  # an engine's handler that reaches the adapter's limit
                raise CannotDrive("the handler read an attribute not built") from err


    class LimitInFdfo(ReferenceDllmScheduler):
        def run_round(self):
            if self.config.mode is Mode.FDFO:
                raise CannotDrive("Scheduler has no attribute 'fdfo_thing': set it in build")
            if not getattr(self, "ghosted", False):
                self.ghosted = True
                self.sink(Admitted("ghost", 0))
            super().run_round()


    RULE_THEN_LIMIT = DllmImplementation(RuleThenLimit, REFERENCE_PROFILE, "x")
    LIMIT_IN_FDFO = DllmImplementation(LimitInFdfo, REFERENCE_PROFILE, "x")
"""


def test_a_rule_broken_before_the_adapters_limit_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In one call: the violation recorded first is the verdict (exit 1), not `CannotDrive`."""
    _module(tmp_path, monkeypatch, "adapter_limits_a", ADAPTER_LIMITS)
    assert main(["verify", "--impl", "adapter_limits_a:RULE_THEN_LIMIT", "--examples", "20"]) == 1
    assert "violation of [lifecycle]" in capsys.readouterr().out


def test_failures_found_before_the_adapters_limit_stand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A campaign that meets the adapter's limit after a failure reports the failure (exit 1,
    the JSON too) and why it stopped; it was exit 2 with the failure dropped."""
    _module(tmp_path, monkeypatch, "adapter_limits_b", ADAPTER_LIMITS)
    out = tmp_path / "v.json"
    argv = ["verify", "--impl", "adapter_limits_b:LIMIT_IN_FDFO", "--keep-going"]
    assert main([*argv, "--examples", "50", "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "violation of [lifecycle]" in printed, printed
    assert "it could not be driven further: Scheduler has no attribute 'fdfo_thing'" in printed
    data = json.loads(out.read_text())
    assert data["rules"] == ["lifecycle"], data


def test_the_command_ends_after_a_traceback_with_a_thread_left_running(tmp_path: Path) -> None:
    """A bug of ours (a traceback) with an implementation's thread still running: the command
    still ends (it hung after printing the traceback; a second review's finding)."""
    (tmp_path / "twin_thread_mod.py").write_text(
        textwrap.dedent(
            """
            import threading
            import time

            from reference.dllm import REFERENCE_TWIN

            threading.Thread(target=time.sleep, args=(10**6,), name="worker").start()


            class Unforeseen(BaseException):
                pass


            def twin(events, config):
                if events:
                    raise Unforeseen("past every handler")
                return REFERENCE_TWIN(events, config)
            """
        ),
        encoding="utf-8",
    )
    load_script("fuzz_cli").recorded_inputs(tmp_path)
    ran = _command_in(tmp_path, "check-trace", "dllm.jsonl", "--twin", "twin_thread_mod:twin")
    assert ran.returncode == 1, ran
    assert "Unforeseen: past every handler" in ran.stderr, ran.stderr
    assert "exiting with status 1 without waiting for them" in ran.stderr, ran.stderr
