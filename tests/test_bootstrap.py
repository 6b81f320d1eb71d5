"""`scripts/bootstrap.sh` (run by `./schedspec` and `./run-tests`) sets the environment up
once when two commands start together: the second waits for the first and then finds it
ready. Two pip runs into one virtual environment used to race (one failed with "No such file
or directory: .venv/bin/schedspec").

The test runs the real script in a scratch root with a stand-in `python3` on PATH whose
`-m venv` makes a directory and whose `pip install` logs its call, sleeps and fails if another
install is running at the same moment. No network, no real install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = r"""#!/usr/bin/env bash
# a stand-in for python3 and for the venv's python: only `-m venv DIR` and `-m pip install`
set -euo pipefail
log="$FAKE_LOG"
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin"
    cp "$0" "$3/bin/python"
    exit 0
fi
if [ "$1 $2 $3" = "-m pip install" ]; then
    busy="$FAKE_BUSY"
    if ! mkdir "$busy" 2>/dev/null; then
        echo "pip: another install is running" >&2
        exit 1
    fi
    echo "pip ${*: -1}" >> "$log"
    sleep 0.3
    rmdir "$busy"
    exit 0
fi
echo "unexpected: $*" >&2
exit 3
"""


@pytest.mark.skipif(shutil.which("flock") is None, reason="the lock needs util-linux flock")
def test_two_commands_started_together_set_up_once(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", root / "scripts" / "bootstrap.sh")
    (root / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (root / "constraints.txt").write_text("ruff==0.1.0\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    env = {
        **os.environ,
        "PATH": f"{fake_bin}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_BUSY": str(tmp_path / "busy"),
    }
    script = ["bash", str(root / "scripts" / "bootstrap.sh")]
    procs = [
        subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err.decode()
    # one setup: pip upgrade, torch, the project; the second command found it ready
    assert log.read_text().splitlines() == [
        "pip pip",
        "pip torch==2.13.0",
        f"pip {root}[engine,plots,dev]",
    ]
    settings = [err.decode().count("setting up") for _, err in results]
    assert sorted(settings) == [0, 1]
    # and a third run, with pyproject.toml and constraints.txt unchanged, does nothing
    subprocess.run(script, env=env, check=True, capture_output=True)
    assert len(log.read_text().splitlines()) == 3
    # a moved pin sets the environment up again
    (root / "constraints.txt").write_text("ruff==0.2.0\n")
    subprocess.run(script, env=env, check=True, capture_output=True)
    assert len(log.read_text().splitlines()) == 6


def test_every_dependency_is_pinned_within_its_declared_range() -> None:
    """constraints.txt pins every package pyproject.toml names (torch excepted: the bootstrap
    pins it itself), at a version the declared range admits: a range moved without a new pin,
    or a pin outside its range, fails here instead of in a fresh setup."""
    requirements = pytest.importorskip("packaging.requirements")
    utils = pytest.importorskip("packaging.utils")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared.extend(extra)
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a pin NAME==VERSION"
            pins[utils.canonicalize_name(name)] = version
    checked = 0
    for text in declared:
        req = requirements.Requirement(text)
        name = utils.canonicalize_name(req.name)
        if name == "torch":
            continue
        assert name in pins, f"{req.name} ({text}) has no pin in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {text!r}"
        )
        checked += 1
    assert checked >= 10
