"""Measured request profiles: what the model did on each prompt of a dLLM workload.

A `RequestProfile` is one request as the engine served it: its prompt length, the forwards each
of its output blocks took (the final-KV forward included; the block count already reflects an
EOS finish) and the output tokens it counted. The per-block forward counts of a prompt are a
property of the model and the prompt, not of the batch (the engine's forwards are
batch-invariant: FDFO does the same row-forwards at every max_running), so a workload of
profiles replays the engine's work exactly; the simulator only supplies the time.

`ProfileWorkload.requests(n, block_size, order, rng)` builds n simulated requests from the
profiles:

- "cycle": request i is profile i mod len(profiles) (the engine benchmark's own order: it cycles
  the prompt set), so the simulated work is the measured work;
- "sample": every request draws one whole profile (its prompt and every block's forward count
  together, so the correlation between blocks of one request is kept) uniformly at random.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from reference.sim.errors import SimConfigError

ORDERS = ("cycle", "sample")


@dataclass(frozen=True, slots=True)
class RequestProfile:
    """One measured request: prompt_len tokens, forwards per output block, tokens counted."""

    prompt_len: int
    forwards: tuple[int, ...]
    tokens: int

    def check(self, block_size: int) -> None:
        """Raise SimConfigError unless the profile can be replayed at this block size."""
        if self.prompt_len < 1 or not self.forwards or self.tokens < 0:
            raise SimConfigError(
                "profile", self.to_json(), "prompt_len >= 1, at least one output block"
            )
        masks = block_size - self.prompt_len % block_size  # the first output block's masks
        for k, f in enumerate(self.forwards):
            top = (masks if k == 0 else block_size) + 1
            if not 2 <= f <= top:
                raise SimConfigError(
                    "profile.forwards",
                    self.forwards,
                    f"block {k}: 2..{top} forwards (one unmasking forward per mask at most, "
                    "plus the final-KV one)",
                )

    def max_new_tokens(self, block_size: int) -> int:
        """The token budget whose whole-block footprint is exactly the measured blocks."""
        prompt_blocks = self.prompt_len // block_size
        return (prompt_blocks + len(self.forwards)) * block_size - self.prompt_len

    def total_blocks(self, block_size: int) -> int:
        """Blocks the request spans at `block_size`: the prompt's whole blocks plus its output
        blocks."""
        return self.prompt_len // block_size + len(self.forwards)

    def to_json(self) -> dict[str, Any]:
        """The profile as a calibration table's `profiles` entry (`from_json` reads it back)."""
        return {
            "prompt_len": self.prompt_len,
            "forwards": list(self.forwards),
            "tokens": self.tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestProfile:
        """A profile from its `to_json` form, unchecked (see `check`); a missing or malformed field
        raises `KeyError`, `TypeError` or `ValueError`."""
        return cls(
            int(data["prompt_len"]), tuple(int(f) for f in data["forwards"]), int(data["tokens"])
        )


@dataclass(frozen=True, slots=True)
class SimRequest:
    """A request as the simulator submits it, with the forwards of each output block."""

    request_id: str
    prompt_len: int
    max_new_tokens: int
    forwards: tuple[int, ...]
    tokens: int


@dataclass(frozen=True, slots=True)
class ProfileWorkload:
    """The measured profiles of a workload's requests, in the order it submitted them."""

    profiles: tuple[RequestProfile, ...]

    def check(self, block_size: int) -> None:
        """Raise `SimConfigError` unless there is a profile and every one passes
        `RequestProfile.check` at `block_size`."""
        if not self.profiles:
            raise SimConfigError("profiles", (), "at least one measured request")
        for p in self.profiles:
            p.check(block_size)

    def requests(
        self, n: int, block_size: int, order: str = "cycle", rng: np.random.Generator | None = None
    ) -> list[SimRequest]:
        """`n` simulated requests r0, r1, ...: 'cycle' takes profile i mod len(profiles), 'sample'
        draws one whole profile per request from `rng` (a seed-0 generator if None); each one's
        token budget spans exactly its measured blocks. Another `order` raises `SimConfigError`."""
        if order not in ORDERS:
            raise SimConfigError("profile_order", order, " or ".join(ORDERS))
        if order == "cycle":
            picks = [i % len(self.profiles) for i in range(n)]
        else:
            gen = rng if rng is not None else np.random.default_rng(0)
            picks = [int(x) for x in gen.integers(0, len(self.profiles), size=n)]
        out = []
        for i, j in enumerate(picks):
            p = self.profiles[j]
            out.append(
                SimRequest(
                    f"r{i}", p.prompt_len, p.max_new_tokens(block_size), p.forwards, p.tokens
                )
            )
        return out

    def max_blocks(self, block_size: int) -> int:
        """The most blocks any profile's request spans (`total_blocks`)."""
        return max(p.total_blocks(block_size) for p in self.profiles)

    def histogram(self) -> dict[int, int]:
        """Forwards per output block over every profile (what an i.i.d. model would draw)."""
        hist: dict[int, int] = {}
        for p in self.profiles:
            for f in p.forwards:
                hist[f] = hist.get(f, 0) + 1
        return dict(sorted(hist.items()))
