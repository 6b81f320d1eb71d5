"""Autoregressive conformance machine, policy properties, trace formats and the AR registry."""
