"""Reference autoregressive schedulers (vLLM v1, Vidur replicas, global and stage schedulers)."""
