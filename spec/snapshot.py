"""What an implementation reports about its own pools after a round.

The snapshot is read from the implementation's real data structures (its allocator's free
list, its request-to-token table, its running batch), not from its event log: that is how a leak
inside the implementation's allocator is caught even when its events look right.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from spec.events import FinishReason

SlotOwner = tuple[str, int]  # (request id, block index)


@dataclass(frozen=True, slots=True)
class FinishedOutput:
    """What an implementation returns to its client for a finished request.

    tokens: the output tokens (the spec's `request_output`: generated tokens cut at
        max_new_tokens and after the first EOS).
    reason: why it finished (must match its `Finished` event).
    """

    tokens: tuple[int, ...]
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An implementation's own view of its pools.

    free_slots: KV slots its allocator considers free.
    slot_owners: slot -> (request id, block index) for every slot in use.
    rows: request-pool row -> request id for every held row.
    running: requests in its running set.
    carrying: requests whose incomplete_ids are non-empty (an unfinished block carried to the
        next round).
    cached_slots: with a prefix cache, the slots it holds (neither free nor owned by a
        request); None where the implementation does not say (not compared).
    """

    free_slots: frozenset[int]
    slot_owners: Mapping[int, SlotOwner]
    rows: Mapping[int, str]
    running: frozenset[str]
    carrying: frozenset[str] = field(default_factory=frozenset)
    cached_slots: frozenset[int] | None = None

    def leaked_slots(self) -> int:
        """Slots in use. After a drain every slot must be free: any in use is a leak."""
        return len(self.slot_owners)

    def held_rows(self) -> int:
        """Rows held. After a drain every row must be free: any held is a leak."""
        return len(self.rows)


# What each declared container type accepts: any set compares and subtracts as a frozenset does,
# a list reads as a tuple does; a list where a set is declared compares unequal to every set.
_ACCEPTED: dict[str, tuple[type, ...]] = {
    "frozenset": (Set,),
    "Mapping": (Mapping,),
    "tuple": (tuple, list),
}


def container_fields(cls: type) -> dict[str, tuple[str, bool]]:
    """The fields of the snapshot dataclass `cls`: name -> (its declared container type, as
    `_ACCEPTED` names it, whether None is allowed), read from the annotations once."""
    out: dict[str, tuple[str, bool]] = {}
    for f in dataclasses.fields(cls):
        declared = str(f.type)
        optional = declared.replace(" ", "").endswith("|None")
        base = declared.split("[", 1)[0].split("|", 1)[0].strip()
        if base in _ACCEPTED:
            out[f.name] = (base, optional)
    return out


def wrong_container(
    snap: object, fields: Mapping[str, tuple[str, bool]], source: str = "snapshot()"
) -> str | None:
    """The first field of `snap` (of those `container_fields` gave) whose value is not of its
    declared container type, said in one line (`snapshot() returned free_slots as list, not
    frozenset`; `source` names what returned it), or None. Checks each field's own type, never
    its elements: O(fields), cheap enough to run after every event."""
    for name, (declared, optional) in fields.items():
        value = getattr(snap, name, None)
        if value is None and optional:
            continue
        if not isinstance(value, _ACCEPTED[declared]):
            allowed = f"{declared} or None" if optional else declared
            return f"{source} returned {name} as {type(value).__name__}, not {allowed}"
    return None


def wrong_output(output: object, source: str) -> str | None:
    """Why `output`, which `source` says where it came from (`collect_outputs()['r0'] is`,
    `golden_output(request 'r0') returned`), is not a `FinishedOutput` of tokens (a tuple, or a
    list, which reads as one) and a `FinishReason`, said in one line; None when it is one."""
    if not isinstance(output, FinishedOutput):
        return f"{source} {type(output).__name__}, not a spec.FinishedOutput"
    if not isinstance(output.tokens, tuple | list):
        return (
            f"{source} a FinishedOutput whose tokens is {type(output.tokens).__name__}, "
            "not a tuple of token ids"
        )
    if not isinstance(output.reason, FinishReason):
        return (
            f"{source} a FinishedOutput whose reason is {type(output.reason).__name__}, "
            "not a spec.FinishReason"
        )
    return None


def wrong_outputs(reported: object) -> str | None:
    """Why what `collect_outputs()` returned is not a Mapping of request id to
    `FinishedOutput` (`wrong_output` for each value), said in one line; None when it is one."""
    if not isinstance(reported, Mapping):
        return (
            f"collect_outputs() returned {type(reported).__name__}, not a Mapping of request id "
            "to spec.FinishedOutput"
        )
    for rid, output in reported.items():
        if not isinstance(rid, str):
            return (
                f"collect_outputs() returned a key {rid!r} ({type(rid).__name__}), not a "
                "request id (str)"
            )
        wrong = wrong_output(output, f"collect_outputs()[{rid!r}] is")
        if wrong is not None:
            return wrong
    return None


SNAPSHOT_FIELDS = container_fields(Snapshot)
"""`Snapshot`'s fields and their declared container types (`wrong_container`)."""
