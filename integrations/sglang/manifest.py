"""What SGLang 0.5.23 needs on a CPU machine (see docs/engines/sglang.md, "SGLang 0.5.23").

The cp311 manylinux wheel is installed with `--no-deps` (its Rust extensions are never imported)
with the few small packages its scheduler path really uses. Everything else it imports at
module level (triton, zmq, transformers, fastapi, ...) is answered in-process by
`integrations.sglang.stubs`, never installed. The project's torch 2.13.0 CPU build is used.
The list is complete on top of what `pip install schedspec[engine]` installs (torch and its
dependencies, safetensors, pyyaml, numpy, hypothesis, z3-solver): the installed-wheel test
imports and runs the engine from such an environment.
"""

from __future__ import annotations

from integrations.manifest import EngineManifest, Package

VERSION = "0.5.23"

MANIFEST = EngineManifest(
    engine="sglang",
    version=VERSION,
    packages=(
        Package("sglang", VERSION),
        # the newest releases when the adapter was written; pins keep the install reproducible
        Package("msgspec", "0.22.0"),
        Package("orjson", "3.13.0"),
        Package("psutil", "7.2.2"),
        Package("pybase64", "1.5.1"),
        Package("dill", "0.4.1"),
        Package("tqdm", "4.70.1"),
        Package("regex", "2026.11.19"),
        # imported at module level (sglang/srt/utils/common.py) and not in what
        # `pip install schedspec[engine]` brings: a development venv has them through its
        # test and plotting tools, a user's does not (the versions constraints.txt pins)
        Package("packaging", "26.3"),
        Package("pillow", "13.0.0"),
    ),
    # imports the scheduler path the adapter drives, with the in-process stubs installed
    import_check="integrations.sglang.check",
    runs_on_torch=True,
    # what the adapter drives: the dLLM path, the memory pools, the scheduler and its policy,
    # the sampling parameters its stop checks read, and each other module it imports (about
    # 280 files; all of sglang/srt/, 2,199, took 0.24 s a run)
    sources=(
        "sglang/srt/dllm/",
        "sglang/srt/mem_cache/",
        "sglang/srt/managers/",
        "sglang/srt/sampling/",
        "sglang/srt/speculative/spec_info.py",
        "sglang/srt/runtime_context.py",
        "sglang/srt/disaggregation/utils.py",
    ),
)
