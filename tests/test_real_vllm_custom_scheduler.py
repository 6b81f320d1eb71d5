"""A vLLM maintainer's own scheduler class, checked as vLLM builds it
(`SCHEDSPEC_VLLM_SCHEDULER_CLS`, vLLM's `scheduler_cls`): the suite runs their class, a bug
planted in it is caught (a double free under `refcount_matches`, a free queue a double free
broke named as such, an assert of vLLM's own named by its line and the
user's frame), the run's record names the class, and a bad name is one line, exit 2.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from integrations.manifest import EngineManifest
from integrations.vllm import MANIFEST, make_real_vllm
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.custom_scheduler import SCHEDULER_VARIABLE
from properties.conformance_base import NATIVE_NOTE
from schedspec_cli.main import main
from spec.ar.config import ArConfig
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.tier import full_tier
from tests.user_module import verify_run, write_user_module

#: The user's module: vLLM imported at its top, as a subclass in a vLLM checkout would.
USER_MODULE = '''
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.diffusion_scheduler import DiffusionAsyncScheduler, DiffusionScheduler
from vllm.v1.core.sched.scheduler import Scheduler


class Audited:
    """A mixin: the class must still be built as vLLM builds it (no __class__ swap)."""


class Unchanged(Audited, Scheduler):
    pass


class OverAdmits(Scheduler):
    """Admits one request past max_num_seqs; vLLM's own assert catches it."""

    def schedule(self):
        cap = self.max_num_active_reqs
        self.max_num_active_reqs = cap + 1
        try:
            return super().schedule()
        finally:
            self.max_num_active_reqs = cap


class FreesTwice(Scheduler):
    """A finished request's blocks are freed a second time: their ref_cnt goes to -1."""

    def _free_blocks(self, request):
        blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks[0]
        super()._free_blocks(request)
        self.kv_cache_manager.block_pool.free_blocks(list(blocks))


class QueuesTwice(Scheduler):
    """The last block put back on the free queue is put back again: the list cycles."""

    def _free_blocks(self, request):
        super()._free_blocks(request)
        queue = self.kv_cache_manager.block_pool.free_block_queue
        last = queue.fake_free_list_tail.prev_free_block
        if last is not queue.fake_free_list_head:
            queue.append(last)


class FreesTwiceAsync(FreesTwice, AsyncScheduler):
    """FreesTwice, for both engine-core loops (an AsyncScheduler, as they build)."""


class MyDiffusion(DiffusionScheduler):
    pass


class MyDiffusionAsync(DiffusionAsyncScheduler):
    pass


NOT_A_CLASS = 3
'''


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's module, importable as `my_sched` (a fresh name per test directory)."""
    return write_user_module(tmp_path, monkeypatch, "my_sched", USER_MODULE)


def _verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str = "real-vllm", n: int = 100
) -> tuple[int, str, str, dict[str, Any]]:
    return verify_run(capsys, tmp_path, impl, n)


def test_the_named_class_is_built_and_recorded(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.Unchanged")
    adapter = make_real_vllm(ArConfig(), lambda event: None)
    assert type(adapter.sched).__name__ == "Unchanged"  # type: ignore[attr-defined]
    code, out, _, data = _verify(capsys, tmp_path, n=30)
    assert code == 0, out
    assert data["engine"] == {
        "name": "vllm",
        "version": MANIFEST.version,
        "scheduler_cls": "my_sched.Unchanged",
    }
    assert f"real-vllm: vllm {MANIFEST.version}, scheduler_cls my_sched.Unchanged" in out


def test_an_engine_assert_names_its_line_and_the_users_frame(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.OverAdmits")
    code, out, _, _ = _verify(capsys, tmp_path)
    assert code == 1, out
    assert "[implementation_error] the implementation raised AssertionError: assert " in out
    assert f"; via {user_module}:" in out and "in schedule)" in out, out[-3000:]
    # the example again in vLLM's own calls, after the spec's: the class, its settings, the
    # requests as vLLM holds them, and what each call answered
    native = out.split(NATIVE_NOTE, 1)[1]
    assert "sched = OverAdmits(...)  # block_size=" in native and "max_num_seqs=" in native
    assert "sched.add_request(Request(request_id='r0', prompt_token_ids=" in native
    assert "out = sched.schedule()  # r0 " in native
    assert "sched.update_from_output(out, ModelRunnerOutput(sampled {'r0': [" in native


# with prefix caching too in the full tier (the same check on another configuration)
@pytest.mark.parametrize("impl", ["real-vllm", pytest.param("real-vllm-prefix", marks=full_tier)])
def test_a_double_free_breaks_refcount_matches(
    impl: str,
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, with prefix caching off the snapshot read no reference count, and with it on
    only positive ones: the -1 went unseen until vLLM's own assert fired on the block's reuse."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.FreesTwice")
    code, out, _, data = _verify(capsys, tmp_path, impl)
    assert code == 1, out
    assert data["rules"] == ["refcount_matches"], out[-3000:]
    assert ": (-1, 0)" in out, out[-3000:]


def test_a_broken_free_queue_is_a_finding(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A block put back on the free queue twice: the queue's links and count disagree, which
    the adapter's walk names (a queue this breaks into a cycle is `test_vllm_free_queue`'s)."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.QueuesTwice")
    code, out, _, data = _verify(capsys, tmp_path)
    assert code == 1, out
    assert (
        "FreeQueueCorrupt: vLLM's free block queue links 3 blocks but its num_free_blocks" in out
    ), out[-3000:]
    assert "progress" not in data["rules"], data["rules"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("my_sched.NOT_A_CLASS", "(my_sched.NOT_A_CLASS is int)"),
        ("my_sched.Audited", "a subclass of vLLM's Scheduler"),
        ("no_such_module.Scheduler", "ModuleNotFoundError: No module named 'no_such_module'"),
        ("Scheduler", "'package.module.Class'"),
        # a module that exits while imported: before, exit 0 (or its status) and nothing said
        ("exits_at_import.X", "(importing exits_at_import raised SystemExit: 0)"),
        # blanks only: a name lost on its way; before, the engine's own class ran and passed
        (" ", "or nothing (unset, or empty) for the engine's own scheduler"),
    ],
)
def test_a_bad_class_is_one_line_exit_2(
    value: str,
    says: str,
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (user_module.parent / "exits_at_import.py").write_text("import sys\n\nsys.exit(0)\n")
    monkeypatch.delitem(sys.modules, "exits_at_import", raising=False)
    monkeypatch.setenv(SCHEDULER_VARIABLE, value)
    code, out, err, _ = _verify(capsys, tmp_path, n=5)
    assert code == 2 and not out, out
    assert err.count("\n") == 1 and SCHEDULER_VARIABLE in err and says in err, err


def test_a_class_of_another_kind_than_vllm_builds_is_refused(
    user_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async scheduling builds AsyncScheduler: a Scheduler-only subclass is not run there."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.Unchanged")
    with pytest.raises(ConfigError, match=r"a subclass of .*AsyncScheduler"):
        RealVllmScheduler(ArConfig(), lambda event: None, async_scheduling=True)


def test_a_patched_install_is_named_in_the_record_and_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release whose sources were patched in place (to check a change to vLLM) is not
    reported as the release: the JSON lists the differing files and the output says MODIFIED.
    (`EngineManifest.modified_sources` itself: tests/test_engines_install.py.)"""
    patched = tuple(f"vllm/v1/core/f{i}.py" for i in range(7))
    monkeypatch.setattr(EngineManifest, "modified_sources", lambda self: patched)
    code, out, _, data = _verify(capsys, tmp_path, n=5)
    assert code == 0, out
    assert data["engine"]["modified"] == list(patched)
    shown = ", ".join(patched[:5])
    assert (
        f"real-vllm: vllm {MANIFEST.version}; MODIFIED from the release: {shown}, ... (7 files)"
        in out
    )


def _script(
    name: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int | str | None, str, str]:
    """`scripts/<name>.py ARGV` in this process: its exit status (returned, or raised as
    `SystemExit` by a usage error), stdout and stderr."""
    script = load_script(name)
    try:
        code: int | str | None = script.main(argv)
    except SystemExit as stop:
        code = stop.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize(
    ("name", "value", "wants"),
    [
        # both loops run: a Scheduler-only class cannot be built in the async loop; before, each
        # program was counted "refused by vLLM" (exit 0, nothing checked)
        ("vllm_async_check", "my_sched.Unchanged", "AsyncScheduler, the class vLLM builds"),
        ("vllm_async_check", "my_sched.MyDiffusionAsync", "is a diffusion scheduler"),
        # before, a traceback (rc 1) from the first program's build
        ("vllm_dllm_check", "my_sched.Unchanged", "DiffusionScheduler, the class vLLM builds"),
        ("vllm_dllm_check", "my_sched.MyDiffusion", "class Both(DiffusionAsyncScheduler, "),
    ],
)
def test_a_check_script_refuses_a_class_of_the_wrong_kind_up_front(
    name: str,
    value: str,
    wants: str,
    user_module: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SCHEDULER_VARIABLE, value)
    code, out, err = _script(name, ["--programs", "3"], capsys)
    assert code == 2 and not out, out
    assert err.count("\n") == 1 and SCHEDULER_VARIABLE in err and wants in err, err


@pytest.mark.parametrize("script", ["vllm_shrink", "vllm_dllm_shrink"])
def test_a_shrink_script_refuses_a_class_of_the_wrong_kind_up_front(
    script: str,
    user_module: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, the program was "refused by vLLM as drawn": nothing to shrink, exit 0."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.Unchanged")
    code, out, err = _script(script, ["--seed", "0", "--loop", "async"], capsys)
    assert code == 2 and not out, out
    assert err.count("\n") == 1 and SCHEDULER_VARIABLE in err, err


def test_a_diffusion_subclass_runs_in_the_dllm_loops(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A subclass of vLLM's diffusion scheduler is built and checked (before, `_build` compared
    the class's name with vLLM's: a ConfigError traceback), and the output names it."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.MyDiffusionAsync")
    out_json = tmp_path / "dllm.json"
    argv = ["--programs", "3", "--json", str(out_json)]
    code, out, err = _script("vllm_dllm_check", argv, capsys)
    assert code == 0, out + err
    named = f"vllm {MANIFEST.version}, scheduler_cls my_sched.MyDiffusionAsync"
    assert out.splitlines()[0] == named and "3 pass both loops" in out, out
    assert json.loads(out_json.read_text())["scheduler_cls"] == "my_sched.MyDiffusionAsync"
    # the synchronous loop alone takes a DiffusionScheduler subclass
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.MyDiffusion")
    code, out, err = _script("vllm_dllm_shrink", ["--seed", "0", "--loop", "sync"], capsys)
    assert code == 0 and "nothing to shrink" in out, out + err


def test_the_scripts_name_the_class_and_reproduce_with_it(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A finding of the user's class is reported with the class: the output's first line and
    the JSON name it, and each shrink command printed sets the variable (pasted in a fresh
    shell, it checks the class, not stock vLLM)."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_sched.FreesTwiceAsync")
    out_json = tmp_path / "async.json"
    argv = ["--programs", "2", "--json", str(out_json)]
    code, out, err = _script("vllm_async_check", argv, capsys)
    assert code == 1, out + err
    named = f"vllm {MANIFEST.version}, scheduler_cls my_sched.FreesTwiceAsync"
    assert out.splitlines()[0] == named, out
    commands = [line for line in out.splitlines() if line.startswith("shrink [")]
    assert {c.split("]: ", 1)[0] for c in commands} == {
        "shrink [implementation_error, sync loop",
        "shrink [implementation_error, async loop",
    }, out
    selector = f"{SCHEDULER_VARIABLE}=my_sched.FreesTwiceAsync .venv/bin/python"
    assert all(selector in c for c in commands), commands
    assert json.loads(out_json.read_text())["scheduler_cls"] == "my_sched.FreesTwiceAsync"
    shrunk_json = tmp_path / "shrink.json"
    argv = ["--seed", "0", "--loop", "async", "--budget", "20", "--json", str(shrunk_json)]
    code, out, err = _script("vllm_shrink", argv, capsys)
    assert code == 1, out + err
    assert out.startswith("scheduler_cls my_sched.FreesTwiceAsync"), out
    assert f"with {SCHEDULER_VARIABLE}=my_sched.FreesTwiceAsync set:" in out, out
    assert json.loads(shrunk_json.read_text())["scheduler_cls"] == "my_sched.FreesTwiceAsync"


def test_a_scheduler_class_as_impl_is_told_how_it_is_checked(
    user_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `--impl my_sched:Unchanged` was refused as a factory whose family cannot be
    told (and with `--family ar` built as one, blaming the user's class)."""
    for family in ([], ["--family", "ar"]):
        assert main(["verify", "--impl", "my_sched:Unchanged", *family]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert (
            "a vLLM scheduler class is checked by naming it: "
            "SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.Unchanged schedspec verify --impl real-vllm"
        ) in err, err
