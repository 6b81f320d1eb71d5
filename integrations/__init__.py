"""Adapters and profiles for real serving engines (vLLM, SGLang, Vidur).

Depends on `spec` only; each engine is imported lazily, when its factory is first called, from
its own install directory under the project's engine cache (see `integrations.manifest` and
`schedspec install-engines`). Importing this package never imports an engine.
"""
