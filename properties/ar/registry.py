"""Built-in AR implementations, by name, as import strings (`module:factory`).

The lead merges these into `schedspec verify` / `list-impls` (see
`properties.registry.all_builtins`); each is checked by
`properties.ar.conformance:ar_conformance_machine`. A factory refuses configurations it does not
support with `ConfigError` (the machine then discards that example). `AR_IMPLEMENTATIONS`
names the same built-ins as `spec.implementation.ArImplementation` objects with profiles.
"""

from __future__ import annotations

AR_BUILTINS: dict[str, str] = {
    "vllm-v1": "reference.ar.vllm_v1:make_vllm_v1",
    "vllm-v1-prefix": "reference.ar.prefix_cache:make_vllm_v1_prefix",
    "vidur-vllm": "reference.ar.vidur:make_vidur_vllm",
    "vidur-sarathi": "reference.ar.vidur:make_vidur_sarathi",
    "vidur-orca": "reference.ar.vidur:make_vidur_orca",
    "vidur-lightllm": "reference.ar.vidur:make_vidur_lightllm",
    "vidur-ft": "reference.ar.vidur:make_vidur_ft",
}

# The same built-ins as declared implementations (`ArImplementation`: factory + profile), for
# the CLI's registry; `vllm-v1` points at the factory until reference.ar.vllm_v1 declares
# `VLLM_V1` (the vLLM engineer's).
AR_IMPLEMENTATIONS: dict[str, str] = {
    "vllm-v1": "reference.ar.vllm_v1:make_vllm_v1",
    "vllm-v1-prefix": "reference.ar.prefix_cache:VLLM_V1_PREFIX",
    "vidur-vllm": "reference.ar.vidur:VIDUR_VLLM",
    "vidur-sarathi": "reference.ar.vidur:VIDUR_SARATHI",
    "vidur-orca": "reference.ar.vidur:VIDUR_ORCA",
    "vidur-lightllm": "reference.ar.vidur:VIDUR_LIGHTLLM",
    "vidur-ft": "reference.ar.vidur:VIDUR_FT",
}
