"""Vidur's pinned install: the `vidur` wheel alone, with --no-deps; which release is selected.

vidur 0.0.25, the default, is the newest release on PyPI that still ships all six replica
schedulers this project checks. 0.0.26, the newest release, dropped LightLLM and
FasterTransformer and moved the block size, pool size and watermark into a `CacheConfig`; its
vLLM, Sarathi, Orca and Mnemosyne schedulers are checked by setting
`SCHEDSPEC_VIDUR_VERSION=0.0.26`
(for `install-engines` and for the command that runs them alike). One process imports one
release (both are the package `vidur`), so the version is chosen per process, from the
environment, when this module is imported. Each release installs into a directory of its own
(the cache names directories by their pins).

Vidur's declared dependencies (pandas, scikit-learn, wandb, plotly, huggingface_hub, fasteners,
...) serve its execution-time predictors, metrics and config search, none of which a replica
scheduler calls; the adapter stands in for the four that its scheduler modules import at module
level (see `integrations.vidur.engine`). numpy comes from the project's own environment.
"""

from __future__ import annotations

from integrations.manifest import EngineManifest, Package, selected_release

DEFAULT_VERSION = "0.0.25"
VERSION_VARIABLE = "SCHEDSPEC_VIDUR_VERSION"
# release -> the replica schedulers it ships, of those this project checks
KINDS_OF: dict[str, tuple[str, ...]] = {
    "0.0.25": ("vllm", "sarathi", "orca", "lightllm", "ft", "mnemosyne"),
    "0.0.26": ("vllm", "sarathi", "orca", "mnemosyne"),
}


def selected_version() -> str:
    """$SCHEDSPEC_VIDUR_VERSION, else the default; a `ConfigError` naming the supported
    releases when it is another (`integrations.manifest.selected_release`)."""
    return selected_release(VERSION_VARIABLE, "Vidur", KINDS_OF, DEFAULT_VERSION)


def manifest_of(version: str) -> EngineManifest:
    """The install of Vidur `version` (one of `KINDS_OF`)."""
    dropped = [k for k in KINDS_OF[DEFAULT_VERSION] if k not in KINDS_OF[version]]
    return EngineManifest(
        engine="vidur",
        version=version,
        packages=(Package("vidur", version),),
        import_check="vidur.entities",
        load_check="integrations.vidur.custom_scheduler:check_selected",
        # the whole package: the schedulers the adapters drive read entities/ (Request,
        # Batch, KV-parallel batches), config/ and events/ as much as scheduler/
        sources=("vidur/",),
        unavailable=tuple(
            (
                f"real-vidur-{kind}",
                f"a replica scheduler Vidur {version} ships ({', '.join(KINDS_OF[version])}; "
                f"it dropped {', '.join(dropped)}): unset {VERSION_VARIABLE} to check {kind} "
                f"on {DEFAULT_VERSION}",
            )
            for kind in dropped
        ),
    )


VIDUR_VERSION = selected_version()
MANIFEST = manifest_of(VIDUR_VERSION)

__all__ = [
    "DEFAULT_VERSION",
    "KINDS_OF",
    "MANIFEST",
    "VERSION_VARIABLE",
    "VIDUR_VERSION",
    "manifest_of",
    "selected_version",
]
