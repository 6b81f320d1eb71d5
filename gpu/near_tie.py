"""Float ties in a decoding decision: where two outcomes lie closer than float noise.

The golden oracle (`gpu.golden`) decodes with the dense forward, the engine with the paged one.
Both compute the same logits up to float re-association, within `tolerance(logits)` of each
other (`tests/test_gpu_attention.py` holds them to it). A token decision is then the same on
both paths unless two of its outcomes are closer than that noise: two candidate tokens' logits
(the argmax), a confidence and a threshold (commit or not), or two masked positions'
confidences (the single most confident one is committed when none clears the threshold). Such a
decision is a *near-tie*: either outcome is a correct decoding, so a golden mismatch that
follows one can be float noise rather than a scheduling bug. `first_near_tie` finds one in a
forward's logits so a report can say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

# Dense and paged float32 logits agree to max(ABS, REL * max|logit|) (release.md's bound;
# tests/test_gpu_attention.py holds the two paths to it).
ABS_TOLERANCE = 1e-5
REL_TOLERANCE = 2e-6


def tolerance(logits: torch.Tensor) -> float:
    """The float noise bound of `logits` (finite entries): max(ABS, REL * max |logit|)."""
    finite = logits[torch.isfinite(logits)]
    biggest = float(finite.abs().max()) if finite.numel() else 0.0
    return max(ABS_TOLERANCE, REL_TOLERANCE * biggest)


@dataclass(frozen=True, slots=True)
class NearTie:
    """One decision within float noise of flipping.

    position: the block position; kind: "argmax" (two tokens' logits), "threshold" (a
    confidence and the commit threshold) or "fallback" (two masked positions' confidences,
    the other being `other`); gap: how far apart the two sides are; bound: the noise bound
    the gap lies within; tokens: the two candidate token ids (argmax) in the model's ids.
    """

    position: int
    kind: Literal["argmax", "threshold", "fallback"]
    gap: float
    bound: float
    tokens: tuple[int, int] | None = None
    other: int | None = None

    def describe(self) -> str:
        """One clause: what lay how close, against which bound."""
        if self.kind == "argmax" and self.tokens is not None:
            what = f"the logits of tokens {self.tokens[0]} and {self.tokens[1]}"
        elif self.kind == "fallback":
            what = f"the confidences of positions {self.position} and {self.other}"
        else:
            what = "the confidence and the threshold"
        return (
            f"at position {self.position} {what} lie {self.gap:.1e} apart, within the float "
            f"noise {self.bound:.1e}"
        )


def first_near_tie(
    logits: torch.Tensor,
    masked: torch.Tensor,
    editable: torch.Tensor,
    threshold: float,
) -> NearTie | None:
    """The first of `near_ties`, or None."""
    found = near_ties(logits, masked, editable, threshold)
    return found[0] if found else None


def near_ties(
    logits: torch.Tensor,
    masked: torch.Tensor,
    editable: torch.Tensor,
    threshold: float,
) -> list[NearTie]:
    """Every near-tie of one forward's decision that can change what the step does: argmax
    ties (by position), then threshold ties, then the fallback's.

    logits [B, V] as the step sees them (the mask token's logit -inf); masked [B]: positions
    still masked (mask-to-token decides them); editable [B]: other positions whose token the
    step may replace by its argmax (JointThreshold's edits); threshold: the commit threshold.

    The noise bound b (`tolerance`) holds per logit. Two logits then move 2b apart at most; a
    confidence p (the argmax's probability) moves its log by at most 2b(1 - p) (its logit up by
    b, every other down by b), so p itself by about 2b·p(1 - p). A masked position's argmax
    matters only where the step commits it; a threshold tie only where the commit can change
    (the most confident position is committed either way when no other clears the threshold)."""
    z = logits.float()
    bound = tolerance(z)
    top = torch.topk(z, 2, dim=-1)
    gaps = (top.values[:, 0] - top.values[:, 1]).tolist()
    probs = torch.softmax(z, dim=-1).max(dim=-1).values.tolist()
    masked_at = [i for i, m in enumerate(masked.tolist()) if m]
    committed = _committed(probs, masked_at, threshold)
    found: list[NearTie] = []
    for i, e in enumerate(editable.tolist()):
        if (i in committed or e) and gaps[i] <= 2 * bound:
            ids = top.indices[i].tolist()
            found.append(NearTie(i, "argmax", gaps[i], 2 * bound, (int(ids[0]), int(ids[1]))))
    for i in masked_at:
        decides = any(probs[j] > threshold for j in masked_at if j != i) or probs[i] < max(
            probs[j] for j in masked_at
        )
        noise = _confidence_noise(probs[i], bound)
        if decides and abs(probs[i] - threshold) <= noise:
            found.append(NearTie(i, "threshold", abs(probs[i] - threshold), noise))
    below = sorted((i for i in masked_at if probs[i] <= threshold), key=lambda i: -probs[i])
    if len(below) == len(masked_at) and len(below) >= 2:
        a, b = below[0], below[1]
        gap = probs[a] - probs[b]
        noise = _confidence_noise(probs[a], bound) + _confidence_noise(probs[b], bound)
        if gap <= noise:
            found.append(NearTie(min(a, b), "fallback", gap, noise, other=max(a, b)))
    return found


def _confidence_noise(p: float, bound: float) -> float:
    """How far noise of `bound` per logit can move a confidence `p` (see `near_ties`)."""
    return 2 * bound * p * (1 - p)


def _committed(probs: list[float], masked_at: list[int], threshold: float) -> set[int]:
    """The masked positions mask-to-token commits, as `gpu.algorithms.mask_transfers` does:
    those above the threshold, else the most confident (first on ties)."""
    above = {i for i in masked_at if probs[i] > threshold}
    if above or not masked_at:
        return above
    return {max(masked_at, key=lambda i: (probs[i], -i))}


#: How far `flipped` may move one logit, in multiples of the noise bound (`tolerance`), by
#: the kind of tie: what noise within the bound can do to that decision (`near_ties`): two
#: logits 2b apart, a confidence's log 2b(1 - p) (one logit moved 2b does that), two
#: confidences each that far (one logit moved 4b at most does that).
MOST_MOVE_OF = {"argmax": 2.0, "threshold": 2.0, "fallback": 4.0}
MOST_MOVE = max(MOST_MOVE_OF.values())


def flipped(logits: torch.Tensor, tie: NearTie, threshold: float) -> torch.Tensor | None:
    """`logits` [B, V] as float32, with one logit at `tie.position` moved so that the decision
    `tie` names comes out the other way: the other of the two tokens wins the argmax, the
    confidence lands on the other side of `threshold`, or the other masked position becomes the
    most confident. The move is at most `MOST_MOVE_OF[tie.kind]` noise bounds (`tolerance`; an
    argmax's, the gap and one ulp), what noise within the bound can do to that decision, so
    the decision comes out as the serving path may take it; None when no such move flips it
    (then it is no tie)."""
    z = logits.float().clone()
    most = MOST_MOVE_OF[tie.kind] * tolerance(z)
    if tie.kind == "argmax" and tie.tokens is not None:
        row = z[tie.position]
        winner = int(torch.argmax(row))
        loser = tie.tokens[1] if winner == tie.tokens[0] else tie.tokens[0]
        lifted = torch.nextafter(row[winner], torch.tensor(float("inf")))
        if float(lifted - row[loser]) > most + float(lifted - row[winner]):  # the gap, one ulp
            return None
        row[loser] = lifted
        return z if int(torch.argmax(row)) == loser else None
    if tie.kind == "threshold":
        committed = _confidence(z[tie.position]) > _f32(threshold)
        return _moved(z, tie.position, lambda p: (p > _f32(threshold)) != committed, most)
    if tie.other is None:
        return None
    a, b = tie.position, tie.other
    chosen = a if _confidence(z[a]) >= _confidence(z[b]) else b  # argmax: first on ties
    other = b if chosen == a else a
    rival = _confidence(z[chosen])
    return _moved(z, other, lambda p: p > rival, most)


def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _confidence(row: torch.Tensor) -> torch.Tensor:
    """The float32 softmax probability of the argmax, as `gpu.algorithms` computes it."""
    return torch.softmax(row, dim=-1).max()


def _moved(
    z: torch.Tensor,
    position: int,
    flips: Callable[[torch.Tensor], torch.Tensor],
    most: float,
) -> torch.Tensor | None:
    """`z` with the argmax logit at `position` moved by the smallest of a few growing steps
    (up to `most`, either way) after which `flips(confidence)` holds; None when none does."""
    row = z[position]
    top = int(torch.argmax(row))
    base = float(row[top])
    for step in (most / 64, most / 16, most / 4, most):
        for signed in (step, -step):
            trial = row.clone()
            trial[top] = base + signed
            if int(torch.argmax(trial)) == top and bool(flips(_confidence(trial))):
                z[position] = trial
                return z
    return None
