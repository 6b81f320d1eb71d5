"""The gate every real-engine test module passes first: the engine is installed, or its tests
are skipped (SCHEDSPEC_SKIP_ENGINES=1, saying so) or fail naming the install command."""

from __future__ import annotations

import os

import pytest

from integrations.manifest import EngineManifest


def require_engine(manifest: EngineManifest, engine: str, name: str, *, command: str = "") -> None:
    """Skip or fail the calling test unless `manifest`'s engine is installed (`engine`: its
    install-engines name; `name`: as people write it, e.g. "vLLM"; `command`: the install
    command to name, when it is not `schedspec install-engines <engine>`)."""
    if manifest.installed():
        return
    label = f"{name} {manifest.version}"
    if os.environ.get("SCHEDSPEC_SKIP_ENGINES") == "1":
        pytest.skip(f"SCHEDSPEC_SKIP_ENGINES=1: {label} not installed, its tests skipped")
    pytest.fail(
        f"{label} is not installed in {manifest.directory}: run "
        f"`{command or f'schedspec install-engines {engine}'}` (or set SCHEDSPEC_SKIP_ENGINES=1 "
        "to skip)",
        pytrace=False,
    )
