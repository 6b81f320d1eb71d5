"""A Vidur maintainer's own change, checked: a replica scheduler subclass named in
`SCHEDSPEC_VIDUR_SCHEDULER_CLS` is built where the built-in builds Vidur's and caught when it
leaks; a `module:attribute` of one's own may import Vidur at its top; another copy of Vidur on
the path is named as not the one checked; a patched install is compared over the whole package;
the record names all of it, and a bad name or a missing install is one line, exit 2.

Needs Vidur installed (`schedspec install-engines vidur`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from integrations.manifest import LAYOUT
from integrations.vidur import MANIFEST
from integrations.vidur.custom_scheduler import SCHEDULER_VARIABLE
from tests.engine_gate import require_engine
from tests.user_module import verify_run, write_user_module

#: The user's module: Vidur imported at its top, as a change in a Vidur checkout would.
USER_MODULE = '''
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler
from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler

from integrations.vidur import REAL_VIDUR_SARATHI as IMPL


class Unchanged(SarathiReplicaScheduler):
    pass


class LeaksOnFree(SarathiReplicaScheduler):
    """Drops a freed request's record but keeps one of its blocks in the allocated count."""

    def free(self, *request_ids):
        for request_id in request_ids:
            self._num_allocated_blocks -= self._allocation_map.pop(request_id) - 1


class PureVllm(VLLMReplicaScheduler):
    pass


class RecomputesForNothing(VLLMReplicaScheduler):
    """Restarts a running request whenever one is pending, blocks free or not, and forms no
    batch: vLLM v0's recompute is declared only for a decode short of a free block."""

    def _get_next_batch(self, time):
        if self._preempted_requests:
            victim = self._preempted_requests.pop(-1)
            victim.restart()
            self.free(victim.id)
            self._request_queue = [victim] + self._request_queue
            return None
        return super()._get_next_batch(time)


NOT_A_CLASS = 3
'''


@pytest.fixture(autouse=True, scope="module")
def _vidur_installed() -> None:
    require_engine(MANIFEST, "vidur", "Vidur")


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's module, importable as `my_vidur` (fresh in each test)."""
    return write_user_module(tmp_path, monkeypatch, "my_vidur", USER_MODULE)


def _verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str, n: int = 100
) -> tuple[int, str, str, dict[str, Any]]:
    return verify_run(capsys, tmp_path, impl, n)


def test_the_named_class_is_built_checked_and_recorded(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_vidur.Unchanged")
    code, out, _, data = _verify(capsys, tmp_path, "real-vidur-sarathi", n=30)
    assert code == 0, out
    assert data["engine"]["scheduler_cls"] == "my_vidur.Unchanged", data
    assert f"real-vidur-sarathi: vidur {MANIFEST.version}, scheduler_cls my_vidur.Unchanged" in out


def test_a_leak_in_the_allocated_count_is_caught_as_a_pool_that_differs(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Vidur's admission reads `_num_allocated_blocks`; a `free` that leaves part of it
    counted shows as a block neither free nor held (before, the adapter read only the
    per-request record, and the leak surfaced later as a stall, `[progress]`)."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_vidur.LeaksOnFree")
    code, out, _, data = _verify(capsys, tmp_path, "real-vidur-sarathi")
    assert code == 1, out
    assert data["rules"] == ["snapshot_matches"], out[-3000:]
    assert "[snapshot_matches] free blocks differ: implementation also frees [], lacks [" in out


def test_a_recompute_with_blocks_free_gets_no_waiver(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`preemption_may_empty_step` (real-vidur-vllm's declaration) waives an empty step only
    when its preemptions were made with no block free: a vLLM that recomputes for nothing
    stalls."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_vidur.RecomputesForNothing")
    code, out, _, data = _verify(capsys, tmp_path, "real-vidur-vllm", n=60)
    assert code == 1, out
    assert data["rules"] == ["progress"], out[-3000:]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("my_vidur.NOT_A_CLASS", "(my_vidur.NOT_A_CLASS is int)"),
        ("my_vidur.Missing", "(my_vidur has no attribute 'Missing')"),
        ("builtins.dict", "a subclass of one of Vidur's replica schedulers"),
        ("my_vidur.Unchanged", "the built-ins it subclasses: real-vidur-sarathi"),
        ("no_such_module.X", "ModuleNotFoundError: No module named 'no_such_module'"),
        # a module that exits while imported: before, exit 0 (or its status) and nothing said
        ("exits_at_import.X", "(importing exits_at_import raised SystemExit: 0)"),
        # blanks only: a name lost on its way; before, the engine's own class ran and passed
        (" ", "or nothing (unset, or empty) for the engine's own scheduler"),
    ],
)
def test_a_bad_class_is_one_line_exit_2_before_any_run(
    value: str,
    says: str,
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Sarathi subclass under real-vidur-vllm is refused up front: run in the suite, every
    configuration would be refused and the run end as Hypothesis's `Unsatisfiable`."""
    (user_module.parent / "exits_at_import.py").write_text("import sys\n\nsys.exit(0)\n")
    monkeypatch.delitem(sys.modules, "exits_at_import", raising=False)
    monkeypatch.setenv(SCHEDULER_VARIABLE, value)
    code, out, err, _ = _verify(capsys, tmp_path, "real-vidur-vllm", n=5)
    assert code == 2 and not out, out
    assert err.count("\n") == 1 and SCHEDULER_VARIABLE in err and says in err, err


def test_a_module_of_ones_own_may_import_vidur_at_its_top(user_module: Path) -> None:
    """Before, `--impl my_vidur:IMPL` said `No module named 'vidur'`: the install was not yet
    active when the user's module was imported. Run as a user runs it, in a fresh process
    (this one has imported Vidur already), which also names the release the module drove."""
    out_json = user_module.parent / "verify.json"
    argv = ["verify", "--impl", "my_vidur:IMPL", "--examples", "20", "--json", str(out_json)]
    res = _fresh(user_module.parent, *argv)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert json.loads(out_json.read_text())["engine"]["name"] == "vidur"
    assert f"my_vidur:IMPL: vidur {MANIFEST.version}" in res.stdout


def _fresh(
    cwd: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`schedspec ARGV` in a fresh process, run from `cwd` (where the user's module is)."""
    return subprocess.run(
        [sys.executable, "-m", "schedspec_cli.main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_with_a_vidur_checkout_on_the_path_a_module_of_ones_own_binds_the_install(
    tmp_path: Path,
) -> None:
    """The usual maintainer's setup: a Vidur checkout on PYTHONPATH. The module's own
    `import vidur` binds the install the adapter drives, not the checkout (before, it bound
    the checkout, and a module importing a scheduler module failed on its scikit-learn
    import); the output says the checkout is not what ran."""
    checkout = tmp_path / "checkout"
    (checkout / "vidur").mkdir(parents=True)
    (checkout / "vidur" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "my_bound.py").write_text(textwrap.dedent(BOUND_MODULE), encoding="utf-8")
    argv = ["verify", "--impl", "my_bound:IMPL", "--examples", "10"]
    res = _fresh(tmp_path, *argv, env={**os.environ, "PYTHONPATH": str(checkout)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert f"; NOT the vidur at {checkout / 'vidur'}, which the install comes before" in res.stdout


#: A module of one's own that imports Vidur's scheduler modules at its top and refuses to run
#: bound to the checkout.
BOUND_MODULE = """
import vidur
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler

from integrations.vidur import REAL_VIDUR_SARATHI as IMPL

if "checkout" in vidur.__file__:
    raise RuntimeError(f"bound the checkout's vidur: {vidur.__file__}")
"""


def test_a_missing_install_is_named_by_the_implementation_that_needs_it(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, both said `invalid impl='vidur'`. The user's module runs in a fresh process,
    where Vidur is not imported yet (this one has imported it)."""
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(tmp_path / "empty-cache"))
    code, out, err, _ = _verify(capsys, tmp_path, "real-vidur-sarathi", n=5)
    fresh = _fresh(user_module.parent, "verify", "--impl", "my_vidur:IMPL")
    runs = [("real-vidur-sarathi", code, out, err)]
    runs.append(("my_vidur:IMPL", fresh.returncode, fresh.stdout, fresh.stderr))
    for impl, code, out, err in runs:
        assert code == 2 and not out, out
        assert err.startswith(f"schedspec: error: invalid impl='{impl}': an installed engine"), err
        assert "run `schedspec install-engines vidur`" in err, err


def test_a_missing_release_chosen_by_its_variable_is_installed_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the command said `schedspec install-engines vidur`, which installs 0.0.25."""
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("SCHEDSPEC_VIDUR_VERSION", "0.0.26")
    code, out, err, _ = _verify(capsys, tmp_path, "real-vidur-sarathi", n=5)
    assert code == 2 and not out, out
    assert "run `SCHEDSPEC_VIDUR_VERSION=0.0.26 schedspec install-engines vidur`" in err, err


def test_another_vidur_on_the_path_is_named_as_not_the_one_checked(
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Vidur checkout on PYTHONPATH is behind the install once it is active: its changes
    are not what ran, and the output says so rather than let it pass for them; the way to
    check a change names the variable only while it is unset."""
    checkout = tmp_path / "checkout"
    (checkout / "vidur").mkdir(parents=True)
    (checkout / "vidur" / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.setattr(sys, "path", [*sys.path, str(checkout)])  # behind the install
    code, out, _, data = _verify(capsys, tmp_path, "real-vidur-sarathi", n=10)
    assert code == 0, out
    assert data["engine"]["shadowed"] == str(checkout / "vidur"), data
    assert f"; NOT the vidur at {checkout / 'vidur'}, which the install comes before" in out
    assert "(to check a change: patch the install or set SCHEDSPEC_VIDUR_SCHEDULER_CLS)" in out
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_vidur.Unchanged")
    code, out, _, _ = _verify(capsys, tmp_path, "real-vidur-sarathi", n=10)
    assert code == 0, out
    assert "(to check a change: patch the install)" in out, out


def test_a_patched_entity_is_named_as_modified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedulers read `vidur/entities/` (Request, Batch) as much as their own module: a
    change there is a modified install too, not the release (before, only vidur/scheduler/
    was compared)."""
    copy = tmp_path / "cache" / MANIFEST.directory.name
    shutil.copytree(MANIFEST.directory, copy, symlinks=True)
    request = copy / LAYOUT / "vidur" / "entities" / "request.py"
    request.write_text(request.read_text() + "\n# a change\n", encoding="utf-8")
    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(tmp_path / "cache"))
    assert MANIFEST.directory == copy  # the manifest reads the cache it is pointed at
    assert MANIFEST.modified_sources() == ("vidur/entities/request.py",)


def test_an_unknown_vidur_release_does_not_stop_a_run_that_drives_no_vidur(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `verify --impl reference-dllm` read SCHEDSPEC_VIDUR_VERSION to learn whether
    Vidur had been activated, and a bad value stopped it (exit 2)."""
    monkeypatch.setenv("SCHEDSPEC_VIDUR_VERSION", "bogus")
    code, out, _, _ = _verify(capsys, tmp_path, "reference-dllm", n=5)
    assert code == 0, out


@pytest.mark.parametrize("twin", ["real-vidur-sarathi", "real-vidur-vllm"])
def test_a_real_vidur_twin_is_refused_while_the_variable_names_a_class(
    twin: str,
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`real-vidur-sarathi` would build the Sarathi subclass as the twin too (the class compared
    with itself); `real-vidur-vllm` would refuse it, being of another kind. Either way the twin
    is never the stock release, and the refusal says both cases, not only the first."""
    monkeypatch.setenv(SCHEDULER_VARIABLE, "my_vidur.Unchanged")
    code, out, err, _ = verify_run(
        capsys, tmp_path, "real-vidur-sarathi", 5, extra=["--twin", twin]
    )
    assert code == 2 and not out, out
    assert err.count("\n") == 1, err
    assert f"invalid --twin={twin!r}: a twin that does not build your class" in err, err
    assert "or refuses it, when it is of another kind" in err, err
    assert "--twin vidur-sarathi-released for a Sarathi class" in err, err
    assert SCHEDULER_VARIABLE in err, err


@pytest.mark.parametrize("family", [[], ["--family", "ar"]])
def test_a_replica_scheduler_class_as_impl_is_told_how_it_is_checked(
    family: list[str], user_module: Path
) -> None:
    """Before, `--impl my_vidur:Unchanged` was refused as a factory whose family cannot be
    told, and with `--family ar` built as one: exit 1, `implementation_error` blaming the
    user's class. Now one line naming the variable and the built-in of its kind."""
    res = _fresh(user_module.parent, "verify", "--impl", "my_vidur:Unchanged", *family)
    assert res.returncode == 2 and not res.stdout, res.stdout[-2000:]
    assert res.stderr.count("\n") == 1, res.stderr
    assert (
        "a Vidur replica scheduler class is checked by naming it: "
        "SCHEDSPEC_VIDUR_SCHEDULER_CLS=my_vidur.Unchanged schedspec verify --impl "
        "real-vidur-sarathi"
    ) in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("impl", "says"),
    [
        (
            "real-vidur-sarathi",
            "--twin vidur-sarathi-released compares its decisions with the stock release's",
        ),
        # before, every kind was told its twin decides as the stock release; vLLM's decides as
        # the release without its needless restart, and a class changing nothing fails it
        ("real-vidur-vllm", "--twin vidur-vllm-released compares its decisions, step by step, "),
    ],
)
def test_a_run_of_ones_own_class_names_the_twin_of_its_kind_and_what_it_decides_as(
    impl: str,
    says: str,
    user_module: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cls = "my_vidur.Unchanged" if impl.endswith("sarathi") else "my_vidur.PureVllm"
    monkeypatch.setenv(SCHEDULER_VARIABLE, cls)
    code, out, _, _ = _verify(capsys, tmp_path, impl, n=10)
    assert code == 0, out[-3000:]
    assert says in out, out[-1500:]
    if impl == "real-vidur-vllm":
        assert "scripts/engine_fixes_diff.py vidur" in out, out[-1500:]
