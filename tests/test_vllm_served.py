"""`load_vllm` in a process that serves vLLM itself (where `VllmEventLog` attaches to the
server's scheduler): the process's own vLLM is used, without schedspec's engine install, and
a release whose internals the adapter does not read is refused naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import integrations.vllm.adapter as adapter
from integrations.vllm import MANIFEST
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.tier import full_tier

ROOT = Path(__file__).resolve().parents[1]

#: A server's process: its environment's vLLM imported first, no schedspec install anywhere.
SERVER = """
import sys
sys.path.insert(0, sys.argv[1])  # the server's own environment
import vllm
from integrations.vllm.adapter import load_vllm
print(load_vllm().scheduler.__file__)
"""


# another packaging (a server's process, a subprocess importing vLLM: 6 s): full tier
@full_tier
def test_the_servers_own_vllm_is_used_without_an_install(tmp_path: Path) -> None:
    require_engine(MANIFEST, "vllm", "vLLM")
    env = {
        **os.environ,
        **dict(MANIFEST.env),
        "PYTHONPATH": str(ROOT),
        "SCHEDSPEC_ENGINE_CACHE": str(tmp_path / "no-install-here"),
    }
    site = str(MANIFEST.site_packages)
    run = subprocess.run(
        [sys.executable, "-c", SERVER, site], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]  # it said: vllm is not installed
    assert run.stdout.strip().startswith(site), run.stdout


def test_a_served_release_the_adapter_does_not_read_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = types.ModuleType("vllm")
    served.__version__ = "0.99.0"  # type: ignore[attr-defined]
    served.__file__ = "/srv/env/vllm/__init__.py"
    monkeypatch.setattr(adapter, "_MODULES", None)
    monkeypatch.setitem(sys.modules, "vllm", served)
    with pytest.raises(ConfigError, match=r"this process imported vllm 0\.99\.0 from /srv/env"):
        adapter.load_vllm()
