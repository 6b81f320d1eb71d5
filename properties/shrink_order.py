"""Shrinking that does not depend on the process: one seed shrinks to one program.

Hypothesis's shrinker walks its `pass_to_descendant` pass over the distinct span labels of
the program it is shrinking, sorted by each label's value written out
(`Shrinker.distinct_labels`). Many labels are hashes of objects whose hash changes from one
process to the next:
- a stateful rule's label hashes the rule's function, which hashes by address;
- a `sampled_from` label hashes its elements, and `None` hashes by address on Python 3.11;
- a string hashes by the process's `PYTHONHASHSEED`.

So the order of that pass differs between two runs of the same command, and with it the
smaller programs tried, the counterexample a shrink ends at, and every later run of a campaign
that starts from it. Measured on `verify --impl real-sglang-dllm-under-pressure --seed 3
--keep-going` before this module: 2,009 and 6,657 examples in two runs.

`stable_shrink_order()` orders the labels by where each first occurs in the program instead,
which depends on the program alone. Inside it nothing else about shrinking changes.
`properties.verify.run_machine` runs every machine inside it.

Contract: on a Hypothesis whose shrinker has no `distinct_labels` property the context
changes nothing (shrinking is as Hypothesis does it; `tests/test_shrink_order.py` fails, so
that such a version is noticed before it ships).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from hypothesis.internal.conjecture import shrinker as _shrinker

_ATTRIBUTE = "distinct_labels"


def _labels_in_first_occurrence(shrinker: Any) -> list[int]:
    """The shrink target's distinct labels in the order their first spans start (a dict
    keeps the order its keys were inserted: `spans_by_label` walks the spans in order)."""
    return list(shrinker.spans_by_label)


def supported() -> bool:
    """Whether this Hypothesis's shrinker orders labels through the property replaced here."""
    return isinstance(_shrinker.Shrinker.__dict__.get(_ATTRIBUTE), property)


_lock = threading.Lock()
_active = 0  # contexts open now, in any thread
_hypothesis_own: property | None = None  # the shrinker's own order, while replaced


@contextlib.contextmanager
def stable_shrink_order() -> Iterator[None]:
    """Inside, Hypothesis shrinks in an order that depends on the program only. The first
    context to open replaces the shrinker's order and the last to close puts it back, whatever
    order they close in (nested, after an error, or overlapping in threads)."""
    global _active, _hypothesis_own
    with _lock:
        if _active == 0:
            own = _shrinker.Shrinker.__dict__.get(_ATTRIBUTE)
            if not isinstance(own, property):  # another Hypothesis: shrink as it does
                own = None
            _hypothesis_own = own
            if own is not None:
                setattr(_shrinker.Shrinker, _ATTRIBUTE, property(_labels_in_first_occurrence))
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _hypothesis_own is not None:
                setattr(_shrinker.Shrinker, _ATTRIBUTE, _hypothesis_own)
                _hypothesis_own = None


__all__ = ["stable_shrink_order", "supported"]
