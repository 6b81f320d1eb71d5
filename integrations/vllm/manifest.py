"""What vLLM needs to import its v1 scheduler on a CPU-only machine; which release is selected.

vLLM 0.33.0 is the default: every candidate fix and upstream report of this project is written
against it. 0.34.0, the newest release, is selected by setting `SCHEDSPEC_VLLM_VERSION=0.34.0`
(for `install-engines` and for the command that runs it alike). One process imports one release
(both are the package `vllm`), so the version is chosen per process, from the environment, when
this module is imported; each release installs into a directory of its own.

`pip install --no-deps --target <cache>/vllm-0.33.0-<pins>` of the vLLM wheel (about 813 MB
installed) plus the pure-Python (or self-contained binary) packages below, each with
`--no-deps`: the list is exactly what `import vllm.v1.core.sched.scheduler` and building a
`VllmConfig` from a local model directory asked for on top of what `pip install
schedspec[engine]` installs (torch 2.13.0 CPU with filelock, jinja2 and fsspec, numpy, pyyaml,
safetensors, hypothesis, z3-solver): the installed-wheel test imports and runs the engine from
such an environment. xgrammar must be installed with `--no-deps`: its dependencies pull a 5 GB
CUDA torch.

Pins: where vLLM 0.33.0's metadata pins or bounds a package that the registry holds, we follow
it (transformers <5.21, fastapi <0.137 — newer fastapi imports opentelemetry —, xgrammar 0.2.8,
apache-tvm-ffi 0.1.11); llguidance is the newest the registry holds (1.6.1; vLLM asks for 1.7,
which no index here serves, and the scheduler never calls it). Everything else is the newest
release at the time of writing; pins keep the install reproducible. vLLM 0.34.0's metadata
bounds the same packages (transformers <5.23, huggingface_hub >=2.0, tokenizers >=0.23.3), and
the pins above meet them, so both releases share every pin but vLLM's own.
"""

from __future__ import annotations

from integrations.manifest import EngineManifest, Package, selected_release

DEFAULT_VERSION = "0.33.0"
NEWEST_VERSION = "0.34.0"
VERSIONS = (DEFAULT_VERSION, NEWEST_VERSION)
VERSION_VARIABLE = "SCHEDSPEC_VLLM_VERSION"


def selected_version() -> str:
    """$SCHEDSPEC_VLLM_VERSION, else the default; a `ConfigError` naming the supported
    releases when it is another (`integrations.manifest.selected_release`)."""
    return selected_release(VERSION_VARIABLE, "vLLM", VERSIONS, DEFAULT_VERSION)


def manifest_of(version: str) -> EngineManifest:
    """The install of vLLM `version` (one of `VERSIONS`): its wheel and the shared pins."""
    return EngineManifest(
        engine="vllm",
        version=version,
        packages=(Package("vllm", version), *_SHARED),
        import_check="vllm.v1.core.sched.scheduler",
        runs_on_torch=True,
        env=_ENV,
        load_check="integrations.vllm.custom_scheduler:check_selected",
        # the v1 engine (scheduler, KV cache manager, block pool, request), the configs the
        # scheduler reads and the sampling parameters its stop checks read
        sources=("vllm/v1/", "vllm/config/", "vllm/sampling_params.py"),
    )


_SHARED = (
    # named by issue 11 (what importing the scheduler needs)
    Package("pydantic", "2.14.3"),
    Package("pydantic-core", "2.50.4"),
    Package("annotated-types", "0.8.0"),
    Package("typing-inspection", "0.4.5"),
    Package("regex", "2026.11.15"),
    Package("cachetools", "8.0.1"),
    Package("psutil", "7.2.2"),
    Package("msgspec", "0.22.0"),
    Package("cloudpickle", "3.1.2"),
    Package("cbor2", "6.3.0"),
    Package("pyzmq", "27.3.0"),
    Package("urllib3", "2.8.0"),
    Package("transformers", "5.20.2"),
    Package("aiohttp", "3.14.5"),
    Package("requests", "2.34.2"),
    Package("openai-harmony", "0.0.8"),
    Package("openai", "3.54.0"),
    Package("pybase64", "1.5.1"),
    Package("uvloop", "0.23.0"),
    Package("py-cpuinfo", "9.0.0"),
    Package("prometheus-client", "0.26.0"),
    Package("xgrammar", "0.2.8"),
    Package("fastapi", "0.136.3"),
    Package("partial-json-parser", "0.2.1.1.post7"),
    Package("llguidance", "1.6.1"),
    Package("einops", "0.8.2"),
    # what those import in turn (found by importing until nothing was missing)
    Package("huggingface-hub", "2.4.0"),
    Package("tokenizers", "0.23.3"),
    Package("tqdm", "4.70.1"),
    Package("httpx2", "2.16.2"),
    Package("httpcore2", "2.16.2"),
    Package("h11", "0.16.0"),
    Package("idna", "3.20"),
    Package("truststore", "0.10.5"),
    Package("certifi", "2026.10.18"),
    Package("multidict", "7.2.1"),
    Package("yarl", "1.25.1"),
    Package("propcache", "0.5.4"),
    Package("attrs", "26.1.0"),
    Package("aiohappyeyeballs", "2.7.1"),
    Package("aiosignal", "1.4.0"),
    Package("frozenlist", "1.8.0"),
    Package("sniffio", "1.3.1"),
    Package("anyio", "4.16.0"),
    Package("apache-tvm-ffi", "0.1.11"),
    Package("starlette", "1.10.0"),
    Package("annotated-doc", "0.0.7"),
    # a development venv has these through its test and plotting tools, a user's does not
    # (found from the installed wheel; the versions constraints.txt pins): vllm/config
    # imports packaging, vllm/sampling_params PIL, and requests warns on every import
    # without a character-detection package
    Package("packaging", "26.3"),
    Package("pillow", "13.0.0"),
    Package("charset-normalizer", "3.5.2"),
)
_ENV = (
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("VLLM_LOGGING_LEVEL", "ERROR"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("DO_NOT_TRACK", "1"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
)

VLLM_VERSION = selected_version()
MANIFEST = manifest_of(VLLM_VERSION)

__all__ = [
    "DEFAULT_VERSION",
    "MANIFEST",
    "NEWEST_VERSION",
    "VERSIONS",
    "VERSION_VARIABLE",
    "VLLM_VERSION",
    "manifest_of",
    "selected_version",
]
