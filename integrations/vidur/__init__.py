"""Vidur's five replica schedulers (vLLM, Sarathi, Orca, LightLLM, FasterTransformer) under the
AR spec. Importing this package does not import Vidur: the factories do, after
`MANIFEST.activate()`."""

from integrations.vidur.manifest import MANIFEST

__all__ = ["MANIFEST"]
