"""Built-in implementations: name -> family, import string(s), parity policy, engine.

Every built-in is resolved by import string, exactly like a user's `module:attribute`, so the
project's own schedulers plug in the way a foreign one does. A built-in lists its targets in
order of preference: the implementation object that declares its profile first, then the bare
factory it wraps (kept working by its owner), so the registry works on either side of a rename.
Real engines (`real-*`) are imported lazily and only run when installed
(`schedspec install-engines`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from schedspec_cli.loader import load_object, module_available, split_target
from spec.errors import ConfigError
from spec.implementation import Family

ParityPolicy = Literal["always", "bs1", "never"]


@dataclass(frozen=True, slots=True)
class Builtin:
    """One built-in implementation.

    targets: import strings, most preferred first (the first that resolves is used).
    parity: the output check after every example ("always": outputs must not depend on
        batching; AR implementations have no outputs to compare: "never").
    engine: the `integrations` package of a real engine ("" for the project's own).
    default_verify: part of the main job (`schedspec verify` without --impl).
    twin: import string of its decision twin (`properties.decisions.DecisionTwin`): it then
        serves as `verify --twin NAME` ("" when it has none).
    checked_against: the main job ends every example of this built-in with that twin, a
        `--twin` name ("" for none).
    torch_profile: for the torch engine's built-ins (they need the engine extra, and the main
        job gives them a quarter of its examples), the profile `list-impls` shows without
        importing torch; "" for every other built-in.
    known_fixes: import string of a callable that takes the built-in's name and returns the
        fixes of its engine's known findings (`integrations.patches.KnownFix`), which `verify`
        tries on each failure ("" for none).
    """

    name: str
    family: Family
    targets: tuple[str, ...]
    description: str
    parity: ParityPolicy = "always"
    engine: str = ""
    default_verify: bool = True
    twin: str = ""
    checked_against: str = ""
    torch_profile: str = ""
    known_fixes: str = ""

    @property
    def is_torch_engine(self) -> bool:
        """Whether this is one of the torch engine's built-ins (`torch_profile` set)."""
        return bool(self.torch_profile)

    @property
    def target(self) -> str:
        """The import string that resolves here (the first that does, else the first)."""
        if len(self.targets) == 1 or self.is_torch_engine:
            # nothing to choose, or the torch engine's module (its first target resolves
            # wherever torch imports): do not import torch or an engine to name it
            return self.targets[0]
        for t in self.targets:
            module, attr = split_target(t)
            if module_available(module) and _has_attr(module, attr):
                return t
        return self.targets[0]


def _has_attr(module: str, attr: str) -> bool:
    try:
        load_object(f"{module}:{attr}")
    except ConfigError:
        return False
    return True


#: The SGLang built-ins' known findings: `integrations.sglang.fixes.known_fixes`.
SGLANG_KNOWN_FIXES = "integrations.sglang.fixes:known_fixes"


def _dllm(name: str, targets: tuple[str, ...], description: str, **kw: object) -> Builtin:
    return Builtin(name, Family.DLLM, targets, description, **kw)  # type: ignore[arg-type]


def _ar(name: str, targets: tuple[str, ...], description: str, **kw: object) -> Builtin:
    return Builtin(name, Family.AR, targets, description, parity="never", **kw)  # type: ignore[arg-type]


BUILTINS_LIST: tuple[Builtin, ...] = (
    _dllm(
        "reference-dllm",
        ("reference.dllm:REFERENCE_DLLM", "reference.dllm:make_scheduler"),
        "plain-Python reference dLLM scheduler, LowConfidence over pseudo-logits",
        twin="reference.dllm:REFERENCE_TWIN",
    ),
    _dllm(
        "reference-dllm-joint",
        ("reference.dllm:REFERENCE_DLLM_JOINT", "reference.dllm:make_joint_threshold_scheduler"),
        "the reference driven by JointThreshold (carries algorithm state between rounds)",
    ),
    _dllm(
        "reference-dllm-scripted",
        ("reference.dllm:REFERENCE_DLLM_SCRIPTED", "reference.dllm:make_scripted_scheduler"),
        "the reference with step-count patterns (1 to block_size+1 steps per block)",
    ),
    _dllm(
        "reference-dllm-prefill-first",
        (
            "reference.dllm:REFERENCE_DLLM_PREFILL_FIRST",
            "reference.dllm:make_prefill_first_scheduler",
        ),
        "the reference under PREFILL_FIRST: prefill-only or decode-only batches, prefill first",
        twin="reference.dllm:PREFILL_FIRST_TWIN",
    ),
    _dllm(
        "reference-dllm-rows-released",
        (
            "reference.dllm:REFERENCE_DLLM_ROWS_RELEASED",
            "reference.dllm:make_rows_released_scheduler",
        ),
        "the reference with rows released between rounds (FDFO without in-place reuse)",
        twin="reference.dllm:ROWS_RELEASED_TWIN",
    ),
    _dllm(
        "reference-dllm-priority",
        ("reference.dllm:REFERENCE_DLLM_PRIORITY", "reference.dllm:make_priority_scheduler"),
        "the reference with the queue in priority order (lower priority value first)",
        twin="reference.dllm:PRIORITY_TWIN",
    ),
    _dllm(
        "reference-dllm-lof",
        (
            "reference.dllm:REFERENCE_DLLM_LONGEST_OUTPUT_FIRST",
            "reference.dllm:make_longest_output_first_scheduler",
        ),
        "the reference with the queue by max_new_tokens, longest first (SGLang's lof)",
        twin="reference.dllm:LONGEST_OUTPUT_FIRST_TWIN",
    ),
    _dllm(
        "reference-dllm-cached",
        (
            "reference.prefix_cache:REFERENCE_DLLM_CACHED",
            "reference.prefix_cache:make_caching_scheduler",
        ),
        "the reference with a prefix cache (SGLang's radix cache): blocks cached, read, evicted",
        twin="reference.prefix_cache:CACHED_TWIN",
    ),
    _dllm(
        "sglang-dllm-order",
        (
            "reference.sglang_dllm:SGLANG_DLLM_ORDER",
            "reference.sglang_dllm:make_sglang_order_scheduler",
        ),
        "SGLang 0.5.23's dLLM admission order re-implemented on the reference (PREFILL_FIRST in "
        "its window, phase-separated)",
        twin="reference.sglang_dllm:SGLANG_ORDER_TWIN",
    ),
    _dllm(
        "sglang-dllm-order-priority",
        (
            "reference.sglang_dllm:SGLANG_DLLM_ORDER_PRIORITY",
            "reference.sglang_dllm:make_sglang_order_priority_scheduler",
        ),
        "sglang-dllm-order under priority scheduling (the queue in priority order, lower first)",
        twin="reference.sglang_dllm:SGLANG_ORDER_PRIORITY_TWIN",
    ),
    _dllm(
        "sglang-dllm-order-lof",
        (
            "reference.sglang_dllm:SGLANG_DLLM_ORDER_LOF",
            "reference.sglang_dllm:make_sglang_order_lof_scheduler",
        ),
        "sglang-dllm-order under --schedule-policy lof (the queue by max_new_tokens, longest "
        "first)",
        twin="reference.sglang_dllm:SGLANG_ORDER_LOF_TWIN",
    ),
    _dllm(
        "sglang-dllm-order-priority-lof",
        (
            "reference.sglang_dllm:SGLANG_DLLM_ORDER_PRIORITY_LOF",
            "reference.sglang_dllm:make_sglang_order_priority_lof_scheduler",
        ),
        "sglang-dllm-order under lof with priority scheduling (the queue by priority, lower "
        "first, then max_new_tokens, longest first)",
        twin="reference.sglang_dllm:SGLANG_ORDER_PRIORITY_LOF_TWIN",
    ),
    _dllm(
        "engine",
        ("gpu.engine:SMALL_ENGINE", "gpu.engine:make_small_engine"),
        "the torch engine: trained block-diffusion model, paged KV tensors (needs the engine "
        "extra)",
        checked_against="reference-dllm",
        torch_profile="idealised spec",
    ),
    _dllm(
        "engine-rows-released",
        (
            "gpu.engine:SMALL_ENGINE_ROWS_RELEASED",
            "gpu.engine:make_small_rows_released_engine",
        ),
        "the torch engine with rows released between rounds (FDFO without in-place reuse, as "
        "SGLang before #27877)",
        checked_against="reference-dllm-rows-released",
        torch_profile="rows_released_between_rounds=True",
    ),
    _dllm(
        "engine-priority",
        ("gpu.engine:SMALL_ENGINE_PRIORITY", "gpu.engine:make_small_priority_engine"),
        "the torch engine with the waiting queue by priority, lower value first (SGLang's "
        "--enable-priority-scheduling)",
        checked_against="reference-dllm-priority",
        torch_profile="priority_order=True",
    ),
    _dllm(
        "engine-cached",
        ("gpu.engine:SMALL_ENGINE_CACHED", "gpu.engine:make_small_engine"),
        "the torch engine with a prefix cache (SGLang's radix cache for dLLMs: committed "
        "blocks kept, read by later prompts, evicted least recently used)",
        checked_against="reference-dllm-cached",
        torch_profile="prefix_cache=True",
    ),
    _dllm(
        "engine-lof",
        ("gpu.engine:SMALL_ENGINE_LOF", "gpu.engine:make_small_lof_engine"),
        "the torch engine with the waiting queue by max_new_tokens, longest first (SGLang's "
        "--schedule-policy lof)",
        checked_against="reference-dllm-lof",
        torch_profile="longest_output_first=True",
    ),
    _ar(
        "vllm-v1",
        ("reference.ar.vllm_v1:VLLM_V1", "reference.ar.vllm_v1:make_vllm_v1"),
        "vLLM v1's scheduler decision rules, re-implemented in plain Python",
    ),
    _ar(
        "vllm-v1-prefix",
        (
            "reference.ar.prefix_cache:VLLM_V1_PREFIX",
            "reference.ar.prefix_cache:make_vllm_v1_prefix",
        ),
        "vLLM v1's decision rules with prefix caching (shared, reference-counted blocks)",
    ),
    _ar(
        "vllm-v1-watermark",
        (
            "reference.ar.vllm_settings:VLLM_V1_WATERMARK",
            "reference.ar.vllm_settings:make_vllm_v1_watermark",
        ),
        "vLLM v1's decision rules with its admission watermark (0.25), prefix caching off or on",
    ),
    _ar(
        "vllm-v1-adaptive",
        (
            "reference.ar.vllm_settings:VLLM_V1_ADAPTIVE",
            "reference.ar.vllm_settings:make_vllm_v1_adaptive",
        ),
        "vLLM v1's decision rules with its adaptive long-prefill threshold, prefix caching off "
        "or on",
    ),
    _ar(
        "vllm-v1-no-reserve",
        (
            "reference.ar.vllm_settings:VLLM_V1_NO_RESERVE",
            "reference.ar.vllm_settings:make_vllm_v1_no_reserve",
        ),
        "vLLM v1's decision rules without the whole-sequence reservation, prefix caching off or on",
    ),
    _ar(
        "vidur-vllm",
        ("reference.ar.vidur:VIDUR_VLLM", "reference.ar.vidur:make_vidur_vllm"),
        "Vidur's vLLM replica scheduler, re-implemented",
    ),
    _ar(
        "vidur-sarathi",
        ("reference.ar.vidur:VIDUR_SARATHI", "reference.ar.vidur:make_vidur_sarathi"),
        "Vidur's Sarathi-Serve replica scheduler, re-implemented",
    ),
    _ar(
        "vidur-vllm-released",
        (
            "reference.ar.vidur_released:VIDUR_VLLM_RELEASED",
            "reference.ar.vidur_released:make_vidur_vllm_released",
        ),
        "Vidur's vLLM replica scheduler as its releases decide (summed prefill tokens, "
        "watermark), re-implemented",
    ),
    _ar(
        "vidur-sarathi-released",
        (
            "reference.ar.vidur_released:VIDUR_SARATHI_RELEASED",
            "reference.ar.vidur_released:make_vidur_sarathi_released",
        ),
        "Vidur's Sarathi-Serve replica scheduler as its releases decide (one free block per "
        "decode, Vidur's restart, watermark), re-implemented",
    ),
    _ar(
        "vidur-orca",
        ("reference.ar.vidur:VIDUR_ORCA", "reference.ar.vidur:make_vidur_orca"),
        "Vidur's Orca replica scheduler, re-implemented",
    ),
    _ar(
        "vidur-lightllm",
        ("reference.ar.vidur:VIDUR_LIGHTLLM", "reference.ar.vidur:make_vidur_lightllm"),
        "Vidur's LightLLM replica scheduler, re-implemented",
    ),
    _ar(
        "vidur-ft",
        ("reference.ar.vidur:VIDUR_FT", "reference.ar.vidur:make_vidur_ft"),
        "Vidur's FasterTransformer replica scheduler, re-implemented",
    ),
    _ar(
        "vidur-mnemosyne",
        (
            "reference.ar.mnemosyne:VIDUR_MNEMOSYNE",
            "reference.ar.mnemosyne:make_vidur_mnemosyne",
        ),
        "Vidur 0.0.26's Mnemosyne FCFS fixed-chunk replica scheduler, re-implemented",
    ),
    _ar(
        "vidur-mnemosyne-one-queue",
        (
            "reference.ar.mnemosyne:VIDUR_MNEMOSYNE_ONE_QUEUE",
            "reference.ar.mnemosyne:make_vidur_mnemosyne_one_queue",
        ),
        "Vidur 0.0.25's Mnemosyne FCFS fixed-chunk replica scheduler (one queue), re-implemented",
    ),
    _ar(
        "real-vllm",
        ("integrations.vllm:REAL_VLLM",),
        "vLLM's own v1 Scheduler (prefix caching off)",
        engine="vllm",
        default_verify=False,
    ),
    _ar(
        "real-vllm-prefix",
        ("integrations.vllm:REAL_VLLM_PREFIX",),
        "vLLM's own v1 Scheduler with prefix caching on",
        engine="vllm",
        default_verify=False,
    ),
    _ar(
        "real-vllm-watermark",
        ("integrations.vllm:REAL_VLLM_WATERMARK",),
        "vLLM's own v1 Scheduler with watermark=0.25, prefix caching off or on",
        engine="vllm",
        default_verify=False,
    ),
    _ar(
        "real-vllm-adaptive",
        ("integrations.vllm:REAL_VLLM_ADAPTIVE",),
        "vLLM's own v1 Scheduler with long_prefill_token_threshold_adaptive=True, prefix "
        "caching off or on",
        engine="vllm",
        default_verify=False,
    ),
    _ar(
        "real-vllm-no-reserve",
        ("integrations.vllm:REAL_VLLM_NO_RESERVE",),
        "vLLM's own v1 Scheduler with scheduler_reserve_full_isl=False, prefix caching off or on",
        engine="vllm",
        default_verify=False,
    ),
    _dllm(
        "real-sglang-dllm",
        ("integrations.sglang:REAL_SGLANG_DLLM",),
        "SGLang 0.5.23's dLLM scheduler path with its real memory pools",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    _dllm(
        "real-sglang-dllm-radix",
        ("integrations.sglang:REAL_SGLANG_DLLM_RADIX",),
        "SGLang 0.5.23's dLLM scheduler path with its radix cache on (its dLLM default)",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    _dllm(
        "real-sglang-dllm-under-pressure",
        ("integrations.sglang:REAL_SGLANG_DLLM_UNDER_PRESSURE",),
        "SGLang's dLLM scheduler path on pools without headroom and fewer rows than seats, "
        "where its KV admission decides: 0.5.23 as released fails it (known findings; passes "
        "with the five fixes)",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    _dllm(
        "real-sglang-dllm-priority",
        ("integrations.sglang:REAL_SGLANG_DLLM_PRIORITY",),
        "SGLang 0.5.23's dLLM scheduler path under priority scheduling (lower values first)",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    _dllm(
        "real-sglang-dllm-lof",
        ("integrations.sglang:REAL_SGLANG_DLLM_LOF",),
        "SGLang 0.5.23's dLLM scheduler path under --schedule-policy lof (longest output first)",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    _dllm(
        "real-sglang-dllm-priority-lof",
        ("integrations.sglang:REAL_SGLANG_DLLM_PRIORITY_LOF",),
        "SGLang 0.5.23's dLLM scheduler path under lof with priority scheduling (lower values "
        "first, then the longest output)",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    _dllm(
        "real-sglang-dllm-lpm",
        ("integrations.sglang:REAL_SGLANG_DLLM_LPM",),
        "SGLang 0.5.23's dLLM scheduler path under --schedule-policy lpm (with the radix cache "
        "on, the longest cached prefix first: a free queue order)",
        engine="sglang",
        default_verify=False,
        known_fixes=SGLANG_KNOWN_FIXES,
    ),
    *(
        _ar(
            f"real-vidur-{short}",
            (f"integrations.vidur:REAL_VIDUR_{short.upper()}",),
            f"Vidur's own {title} replica scheduler",
            engine="vidur",
            default_verify=False,
            known_fixes="integrations.vidur.fixes:known_fixes",
        )
        for short, title in (
            ("vllm", "vLLM"),
            ("sarathi", "Sarathi-Serve"),
            ("orca", "Orca"),
            ("lightllm", "LightLLM"),
            ("ft", "FasterTransformer"),
            ("mnemosyne", "Mnemosyne (FCFS, fixed chunk)"),
        )
    ),
)

BUILTINS: dict[str, Builtin] = {b.name: b for b in BUILTINS_LIST}


NEEDS_TORCH = "needs torch: pip install 'schedspec[engine]'"


def engine_status(builtin: Builtin) -> str:
    """'-' for the project's own; for a real engine 'installed' (or 'installed, needs torch'
    for one that runs on the environment's torch when there is none), 'not installed (run
    ...)', 'other pins only (run ...)' (the cache holds it only for other pins), 'not in
    <engine> <version>' (a built-in the selected release does not ship) or
    'adapter not in this build'. Never imports the engine itself. An adapter that refuses its
    release setting (`SCHEDSPEC_VLLM_VERSION` naming a release it does not drive) raises that
    `ConfigError`."""
    if not builtin.engine:
        if builtin.is_torch_engine and not module_available("torch"):
            return NEEDS_TORCH
        return "-"
    package = f"integrations.{builtin.engine}"
    if not module_available(package):
        return "adapter not in this build"
    try:
        manifest: Any = load_object(f"{package}:MANIFEST", "impl")
    except ConfigError as err:
        if err.field != "impl":
            raise  # the adapter refused its own setting (a release not driven): say so, exit 2
        return "adapter not in this build"
    if manifest.why_unavailable(builtin.name) is not None:
        return f"not in {builtin.engine} {manifest.version}"
    if manifest.installed():
        if manifest.runs_on_torch and not module_available("torch"):
            return f"installed, {NEEDS_TORCH}"
        return "installed"
    if manifest.other_installs():
        return f"other pins only (schedspec install-engines {builtin.engine})"
    return f"not installed (schedspec install-engines {builtin.engine})"


__all__ = ["BUILTINS", "BUILTINS_LIST", "Builtin", "ParityPolicy", "engine_status"]
