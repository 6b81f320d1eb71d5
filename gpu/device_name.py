"""The device a measurement or a check ran on, named so that two runs can be told apart."""

from __future__ import annotations

import torch

from gpu.host import cpu_model


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels dispatch to ("AVX512", "AVX2", "DEFAULT", ...)."""
    return str(torch.backends.cpu.get_cpu_capability())


def device_name(dev: torch.device) -> str:
    """The device as torch reports it, e.g. "cuda:0 (NVIDIA H200)"; a CPU with its model, as
    the OS names it, and the instruction set torch uses on it, e.g. "cpu (AMD EPYC 7B13, AVX2;
    torch 2.13.0+cpu, 1 thread)" — the figures of a model this small move with the CPU, and two
    CPUs the OS names alike ("Intel(R) Xeon(R) Processor") can differ in speed and in the
    kernels' rounding, so a recorded run must say which one it was."""
    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    threads = torch.get_num_threads()
    model = ", ".join(part for part in (cpu_model(), cpu_capability()) if part)
    named = f"{model}; " if model else ""
    return (
        f"{dev} ({named}torch {torch.__version__}, {threads} thread{'s' if threads != 1 else ''})"
    )
