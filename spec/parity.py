"""Cross-run definitions used by the suites and the release check: parity and leaks.

Parity: two runs of the same requests are at parity when every request's output (its generated
tokens, cut at max_new_tokens and after the first end-of-sequence token) is byte-identical.
The reference point is the request run alone under sync at batch size 1
(`DllmConfig.solo_sync`); at batch size 1 FDFO and sync run identical forward shapes, so any
implementation must reach parity there.

Leak: after a drain, every KV slot must be free and every request-pool row unheld; each slot
still owned (and each row still held) is a leak.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spec.snapshot import Snapshot

Outputs = Mapping[str, tuple[int, ...]]

# The release gate's minimum new tokens per parity case (`schedspec release-check`), as in
# SGLang's own check (3 prompts x 128 tokens); the shipped model's context is 256 tokens, so
# every shipped prompt fits with 128 new tokens. Docs quote this constant; a test checks they
# agree.
RELEASE_MIN_NEW_TOKENS = 128


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One request whose outputs differ between two runs (None: missing from that run)."""

    request_id: str
    expected: tuple[int, ...] | None
    actual: tuple[int, ...] | None

    def describe(self) -> str:
        """One line: the request and where its outputs first differ, or which run lacks it."""
        if self.expected is None or self.actual is None:
            side = "expected run" if self.expected is None else "actual run"
            return f"{self.request_id}: missing from the {side}"
        first = next(
            (i for i, (a, b) in enumerate(zip(self.expected, self.actual, strict=False)) if a != b),
            min(len(self.expected), len(self.actual)),
        )
        return (
            f"{self.request_id}: outputs differ at token {first} "
            f"(expected {list(self.expected)}, got {list(self.actual)})"
        )


def compare_outputs(expected: Outputs, actual: Outputs) -> list[Mismatch]:
    """Every request whose output is not byte-identical in the two runs (sorted by id)."""
    out: list[Mismatch] = []
    for rid in sorted(set(expected) | set(actual)):
        e, a = expected.get(rid), actual.get(rid)
        if e != a:
            out.append(Mismatch(rid, e, a))
    return out


def encode_tokens(tokens: tuple[int, ...]) -> bytes:
    """The bytes compared for byte parity: each token id as 4 little-endian bytes."""
    return b"".join(int(t).to_bytes(4, "little", signed=True) for t in tokens)


@dataclass(frozen=True, slots=True)
class LeakReport:
    """What a drained implementation still holds: KV slots in use and request-pool rows."""

    leaked_slots: int
    held_rows: int

    @property
    def clean(self) -> bool:
        """Nothing leaked."""
        return self.leaked_slots == 0 and self.held_rows == 0


def leak_report(after_drain: Snapshot) -> LeakReport:
    """Leaks left in an implementation's pools after a drain."""
    return LeakReport(after_drain.leaked_slots(), after_drain.held_rows())
