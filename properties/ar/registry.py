"""Built-in AR implementations, by name, as import strings (`module:factory`).

The lead merges these into `schedspec verify` / `list-impls` (see
`properties.registry.all_builtins`); each is checked by
`properties.ar.conformance:ar_conformance_machine`. A factory refuses configurations it does not
support with `ConfigError` (the machine then discards that example).
"""

from __future__ import annotations

AR_BUILTINS: dict[str, str] = {
    "vllm-v1": "reference.ar.vllm_v1:make_vllm_v1",
    "vidur-vllm": "reference.ar.vidur:make_vidur_vllm",
    "vidur-sarathi": "reference.ar.vidur:make_vidur_sarathi",
    "vidur-orca": "reference.ar.vidur:make_vidur_orca",
    "vidur-lightllm": "reference.ar.vidur:make_vidur_lightllm",
    "vidur-ft": "reference.ar.vidur:make_vidur_ft",
}
