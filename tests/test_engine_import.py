"""A real engine that is installed but does not import in this Python environment is one typed
error, `EngineImportFailed` (exit 2 from the command line, naming the missing module and the
command that fixes it), raised before a run starts: never a "violation" of the suite, and never
half an engine left loaded.

The engine cache is shared by every environment of the user, while the install's import check
ran in the environment that installed it; a second environment may lack a module the first had.
Each case fakes that: in a temporary cache, the manifest's stamp (so the engine counts as
installed) and the engine's top-level package in the install's `site-packages/`, whose import
fails with ModuleNotFoundError. Each runs in a fresh process, since the real engine may already
be imported in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integrations.manifest import STAMP, EngineManifest
from integrations.sglang import MANIFEST as SGLANG
from integrations.vidur import MANIFEST as VIDUR
from integrations.vllm import MANIFEST as VLLM

SCHEDSPEC = Path(sys.executable).parent / "schedspec"
MISSING = "schedspec_no_such_module"

# (built-in implementation, its engine's manifest, the engine's top-level package, a call that
# loads the engine through its adapter's own loader)
ENGINES = (
    ("real-vllm", VLLM, "vllm", "from integrations.vllm.adapter import load_vllm as load"),
    (
        "real-sglang-dllm",
        SGLANG,
        "sglang",
        "from integrations.sglang.engine import import_engine as load",
    ),
    ("real-vidur-sarathi", VIDUR, "vidur", "from integrations.vidur.engine import load"),
)


def fake_install(cache: Path, manifest: EngineManifest, package: str) -> dict[str, str]:
    """A stamped install of `manifest` in `cache` whose `package` fails to import; the
    environment that points the engine cache there."""
    directory = cache / manifest.directory.name  # the name does not depend on the cache root
    packages = directory / manifest.site_packages.name
    (packages / package).mkdir(parents=True)
    (packages / package / "__init__.py").write_text(f"import {MISSING}\n", encoding="utf-8")
    stamp = {"packages": list(manifest.requirements)}
    (directory / STAMP).write_text(json.dumps(stamp), encoding="utf-8")
    return {**os.environ, "SCHEDSPEC_ENGINE_CACHE": str(cache)}


@pytest.mark.parametrize(
    ("impl", "manifest", "package", "_load"), ENGINES, ids=[e[0] for e in ENGINES]
)
def test_verify_refuses_an_engine_that_does_not_import_here(
    tmp_path: Path, impl: str, manifest: EngineManifest, package: str, _load: str
) -> None:
    env = fake_install(tmp_path, manifest, package)
    argv = [str(SCHEDSPEC), "verify", "--impl", impl, "--examples", "2"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "violation" not in res.stdout, res.stdout
    errors = [line for line in res.stderr.splitlines() if line.startswith("schedspec: error:")]
    assert len(errors) == 1, res.stderr
    assert f"No module named '{MISSING}'" in errors[0], errors[0]
    assert f"`schedspec install-engines {manifest.engine} --force`" in errors[0], errors[0]


@pytest.mark.parametrize(
    ("_impl", "manifest", "package", "load"), ENGINES, ids=[e[0] for e in ENGINES]
)
def test_a_failed_engine_import_is_typed_and_leaves_nothing_loaded(
    tmp_path: Path, _impl: str, manifest: EngineManifest, package: str, load: str
) -> None:
    """Through the adapter's own loader, twice: both attempts raise the typed error (SGLang's
    loader used to keep the modules imported before the failure, so its second attempt
    returned them as if loaded and the suite's replay failed elsewhere with a KeyError)."""
    env = fake_install(tmp_path, manifest, package)
    script = (
        f"{load}\n"
        "from integrations.manifest import EngineImportFailed\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        load()\n"
        "    except EngineImportFailed as err:\n"
        "        print('typed', err.error.name)\n"
        "    else:\n"
        "        print('loaded')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:2] == [f"typed {MISSING}"] * 2, res.stdout + res.stderr[-2000:]
