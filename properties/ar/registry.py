"""Built-in AR implementations, by name, as import strings (`module:factory`).

The lead merges these into `schedspec verify` / `list-impls` (see
`properties.registry.all_builtins`); each is checked by
`properties.ar.conformance:ar_conformance_machine`.
"""

from __future__ import annotations

AR_BUILTINS: dict[str, str] = {
    "vllm-v1": "reference.ar.vllm_v1:make_vllm_v1",
}
