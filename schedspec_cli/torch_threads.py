"""How many intra-op threads torch uses while `verify`, `parity` or `bench conformance` checks an
implementation.

Conformance programs and parity runs are batches of a few small blocks, where a second torch
thread gains little. On a shared machine it costs a great deal: torch's default is one thread
per core in every process, and several checking processes at once oversubscribe the cores.
Measured on a 2-core machine (docs/implementers.md, section 8): two `verify --impl engine-lof`
runs at once with torch's default both failed `[progress]`, a drain past the 60 s call
deadline, where the whole run takes 9 s alone; with one thread each, both passed in 9 s. Two
128-token `parity` runs of the shipped engine at once took 137 s with torch's default and 28 s
with one thread each, as long as one run alone with either count.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from schedspec_cli.args import int_in

DEFAULT_CHECK_THREADS = 1
"""The default of `verify --impl`, `parity` and `bench conformance`: one intra-op thread per
checking process."""


def add_threads_argument(parser: argparse.ArgumentParser, why: str) -> None:
    """`--threads N` (0..4096, default `DEFAULT_CHECK_THREADS`) on `parser`; `why` ends the
    default's help text."""
    parser.add_argument(
        "--threads",
        type=int_in(0, 4096),
        default=DEFAULT_CHECK_THREADS,
        metavar="N",
        help=f"torch's intra-op threads (default {DEFAULT_CHECK_THREADS}{why}; 0: torch's own "
        "default)",
    )


def pin_torch_threads(threads: int) -> None:
    """Run torch on `threads` intra-op threads from now on (0: leave torch's own default).

    Never imports torch, so a run of an implementation without it stays torch-free: when an
    implementation has loaded torch already this sets it directly; otherwise it sets
    `OMP_NUM_THREADS`, which torch reads when an implementation imports it later (and which
    processes started from here inherit)."""
    if threads <= 0:
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)


@contextmanager
def torch_threads_while(threads: int) -> Iterator[None]:
    """Inside the block torch runs on `threads` intra-op threads when it is loaded already
    (0, or torch not loaded: nothing changes); after it, on as many as before. For one step of
    a longer job (the main job's conformance step) whose other steps keep their own count."""
    torch = sys.modules.get("torch")
    if threads <= 0 or torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_threads_now() -> int | None:
    """torch's intra-op thread count, for a report; None when no implementation loaded torch
    (never imports it)."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())
