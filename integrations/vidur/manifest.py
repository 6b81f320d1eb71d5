"""Vidur's pinned install: the `vidur` wheel alone, with --no-deps.

vidur 0.0.25 is the newest release on PyPI that still ships all five replica schedulers this
project checks (0.0.26 dropped LightLLM and FasterTransformer). Its declared dependencies
(pandas, scikit-learn, wandb, plotly, huggingface_hub, fasteners, ...) serve its execution-time
predictors, metrics and config search, none of which a replica scheduler calls; the adapter
stands in for the four that its scheduler modules import at module level (see
`integrations.vidur.engine`). numpy comes from the project's own environment.
"""

from __future__ import annotations

from integrations.manifest import EngineManifest, Package

VIDUR_VERSION = "0.0.25"

MANIFEST = EngineManifest(
    engine="vidur",
    version=VIDUR_VERSION,
    packages=(Package("vidur", VIDUR_VERSION),),
    import_check="vidur.entities",
)

__all__ = ["MANIFEST", "VIDUR_VERSION"]
