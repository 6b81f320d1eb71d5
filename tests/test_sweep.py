"""`schedspec simulate sweep`: the same grid on Ray and in one process gives identical figures;
bad flags are typed errors before any work; without Ray the command says how to install it."""

from __future__ import annotations

import builtins
import json
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reference.sim import sweep as sw
from reference.sim.errors import SimConfigError, Unschedulable
from schedspec_cli.main import main as cli_main
from schedspec_cli.simulate import simulate_main
from spec.errors import ConfigError

SMALL = dict(requests=40, prefill="8-200", decode="4-40", exec_model="linear:0.01,1e-5,2e-4,1e-7")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_and_one_process_give_identical_figures(local_ray: Any) -> None:
    points = sw.grid([2.0, 20.0], ["vidur-vllm", "vidur-orca"], [1, 2], [2048], **SMALL)
    assert len(points) == 8
    seen: list[int] = []
    on_ray = sw.run_grid(points, "ray", progress=lambda done, total, r: seen.append(done))
    here = sw.run_grid(points, "local")
    assert [r.point for r in on_ray] == points  # grid order, whatever order they finished in
    assert [r.figures() for r in on_ray] == [r.figures() for r in here]
    assert sorted(seen) == list(range(1, 9))
    assert all(r.completed == 40 for r in here)
    # the grid is not degenerate: load and pool change the figures
    assert len({r.e2e_p90 for r in here}) > 1


def test_a_point_that_fails_on_ray_is_the_same_one_line_error_as_in_one_process(
    local_ray: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request longer than max_model_len can never run: `RequestRefused` (an
    `Unschedulable` with the scheduler's own reason), raised while the
    point runs (validation does not draw the workload). On Ray that error used to come back as
    Ray's `UnserializableException` with the worker's whole traceback, exit 1: the error's
    `__init__` cannot be rebuilt from its pickle. Now the worker returns it as data and the
    driver raises `PointFailed` with the same message (found by fuzzing the command line)."""
    model = "linear:0.01,1e-5,2e-4,1e-7"
    point = sw.SweepPoint(
        2.0,
        "vidur-vllm",
        1,
        4096,
        requests=5,
        prefill="200",
        decode="20",
        max_model_len=128,
        exec_model=model,
    )
    with pytest.raises(Unschedulable) as here:
        sw.run_grid([point], "local")
    with pytest.raises(sw.PointFailed) as on_ray:
        sw.run_grid([point], "ray")
    assert str(on_ray.value) == str(here.value) and on_ray.value.kind == "RequestRefused"
    argv = ["simulate", "sweep", "--qps", "2", "--scheduler", "vidur-vllm", "--replicas", "1"]
    argv += ["--kv-tokens", "4096", "--requests", "5", "--prefill", "200", "--decode", "20"]
    argv += ["--max-model-len", "128", "--exec-model", model]
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err  # a progress line, then the error
    assert err.splitlines()[-1] == f"schedspec: error: {here.value}", err
    assert "Traceback" not in err and "Unserializable" not in err, err


def test_cli_writes_table_json_csv_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    argv = ["sweep", "--backend", "local", "--qps", "5,50", "--scheduler", "vidur-vllm,simple"]
    argv += ["--replicas", "1", "--kv-tokens", "4096", "--requests", "30"]
    argv += ["--prefill", "8-100", "--decode", "4-20", "--max-model-len", "256"]
    argv += ["--json", str(tmp_path / "s.json"), "--csv", str(tmp_path / "s.csv")]
    argv += ["--plots", str(tmp_path / "plots")]
    assert simulate_main(argv) == 0
    out = capsys.readouterr().out
    assert "vidur-vllm" in out and "simple" in out
    rows = json.loads((tmp_path / "s.json").read_text())["results"]
    assert len(rows) == 4 and {r["scheduler"] for r in rows} == {"vidur-vllm", "simple"}
    assert (tmp_path / "s.csv").read_text().count("\n") == 5
    assert (tmp_path / "plots" / "sweep_e2e_p90.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--qps", "2,x", "--qps"),
        ("--qps", "0", "--qps"),
        ("--replicas", "0", "--replicas"),
        ("--kv-tokens", "", "--kv-tokens"),
        ("--scheduler", "vidur-nope", "scheduler"),
    ],
)
def test_bad_flags_are_typed_errors_before_work(flag: str, value: str, field: str) -> None:
    with pytest.raises(SimConfigError) as err:
        simulate_main(["sweep", "--backend", "local", flag, value])
    assert err.value.field == field


@pytest.mark.parametrize(("flag", "value"), [("--requests", "0"), ("--num-cpus", "0")])
def test_out_of_range_counts_are_usage_errors_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["simulate", "sweep", "--backend", "local", flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and "valid: 1.." in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--csv", "--json", "--plots"])
def test_an_output_that_cannot_be_written_is_refused_before_the_sweep_runs(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reference.sim import sweep

    def must_not_run(*args: object) -> None:
        raise AssertionError("the sweep ran before its outputs were checked")

    monkeypatch.setattr(sweep, "run_grid", must_not_run)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "out"  # under a file: can never be written
    assert cli_main(["simulate", "sweep", "--backend", "local", flag, str(out)]) == 2
    err = capsys.readouterr().err
    assert flag in err and "is a file" in err and "Traceback" not in err


def test_impossible_configuration_is_named_before_work() -> None:
    # a pool smaller than one request: the replica configuration is rejected up front
    with pytest.raises(ConfigError):
        simulate_main(
            ["sweep", "--backend", "local", "--scheduler", "vidur-orca", "--kv-tokens", "64"]
        )


def test_without_ray_the_command_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def no_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    points = sw.grid([2.0], ["simple"], [1], [2048], **SMALL)
    with pytest.raises(sw.RayMissing, match=r"pip install 'schedspec\[sweep\]'"):
        sw.run_grid(points, "ray")


def test_a_ray_folder_on_the_path_is_no_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Ray installed, run from a directory holding a `ray/` folder (Ray's session
    folder /tmp/ray, say), `import ray` found the folder as a namespace package and the sweep
    ended in `AttributeError: module 'ray' has no attribute 'is_initialized'`."""
    (tmp_path / "ray").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    real = builtins.__import__

    def only_the_folder(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray":  # as where Ray is not installed: the folder is all there is
            namespace = types.ModuleType("ray")
            namespace.__path__ = [str(tmp_path / "ray")]
            return namespace
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", only_the_folder)
    points = sw.grid([2.0], ["simple"], [1], [2048], **SMALL)
    with pytest.raises(sw.RayMissing, match=r"pip install 'schedspec\[sweep\]'"):
        sw.run_grid(points, "ray")
    monkeypatch.setattr(builtins, "__import__", real)
    from schedspec_cli.loader import module_available

    # a namespace package is no installed package (the folder is found, Ray's is not here)
    (tmp_path / "not_installed_pkg").mkdir()
    assert not module_available("not_installed_pkg")
    assert module_available("json")


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize(
    "address", ["bogus://x", "head", "head:port", "localhost:0", "localhost:70000", "CLOSED"]
)
def test_an_address_ray_would_crash_or_hang_on_is_refused_in_one_line(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray answers a malformed address with a traceback and retries an unreachable one for
    minutes; both are refused before `ray.init`, exit 2, naming --address and the forms."""
    address = address.replace("CLOSED", f"127.0.0.1:{_closed_port()}")
    argv = ["simulate", "sweep", "--address", address, "--requests", "10"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"invalid --address={address!r}" in err and "ray://HOST:PORT" in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    if address.startswith("127.0.0.1"):
        assert "cannot connect" in err


def test_a_reachable_address_ray_rejects_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `ray.init` raises for an address that answers but is no Ray cluster is a typed
    error too (a stand-in `ray` module: the test needs no cluster)."""
    calls: list[str] = []

    def init(address: str, **_: Any) -> None:
        calls.append(address)
        raise ConnectionError("Failed to connect to Ray cluster")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        points = sw.grid([2.0], ["simple"], [1], [2048], **SMALL)
        with pytest.raises(SimConfigError, match="Failed to connect to Ray cluster") as err:
            sw.run_grid(points, "ray", address=address)
    assert err.value.field == "--address" and calls == [address]
