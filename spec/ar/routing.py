"""How a global scheduler routes requests to replicas: round robin, or least outstanding
requests (Vidur's two deterministic global schedulers; the project's `reference.ar.cluster`).

A routing round takes the requests that arrived and sends each to one replica. `check_routing`
compares a round with `expected_routes` and raises `SpecViolation` naming `routing_order`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType

from spec.errors import ConfigError, SpecViolation

#: The routings checked: round robin and least outstanding requests.
ROUTINGS: tuple[str, ...] = ("round_robin", "lor")


class RoutingRule(StrEnum):
    """The rule of a global scheduler. A member equals (and hashes like) its string."""

    ROUTING_ORDER = "routing_order"


ROUTING_RULES: Mapping[RoutingRule, str] = MappingProxyType(
    {
        RoutingRule.ROUTING_ORDER: "Round robin: the k-th request routed (counting from 0, in "
        "arrival order) goes to replica k mod R. Least outstanding requests: each request "
        "goes to a replica with the fewest waiting requests, counting those routed to it "
        "earlier in the same round; on a tie, the lowest-numbered.",
    }
)


def expected_routes(routing: str, turn: int, waiting: Sequence[int], count: int) -> list[int]:
    """The replicas the next `count` requests go to, in order: `turn` requests were routed
    before this round, and `waiting[i]` requests wait at replica i when it starts."""
    if routing not in ROUTINGS:
        raise ConfigError("routing", routing, f"one of {', '.join(ROUTINGS)}")
    replicas = len(waiting)
    if routing == "round_robin":
        return [(turn + k) % replicas for k in range(count)]
    counts = list(waiting)
    routes = []
    for _ in range(count):
        least = counts.index(min(counts))
        routes.append(least)
        counts[least] += 1
    return routes


def check_routing(
    routing: str, turn: int, waiting: Sequence[int], routed: Sequence[tuple[str, int]]
) -> None:
    """Raise `SpecViolation` (`routing_order`) unless `routed` ((request id, replica) in the order
    the round routed them) is `expected_routes(routing, turn, waiting, len(routed))`."""
    expected = expected_routes(routing, turn, waiting, len(routed))
    for (rid, replica), want in zip(routed, expected, strict=True):
        if replica != want:
            raise SpecViolation(
                RoutingRule.ROUTING_ORDER,
                f"{rid!r} went to replica {replica}, not {want} ({routing}; {turn} requests "
                f"routed before this round, waiting per replica {list(waiting)}; this round "
                f"{[r for _, r in routed]})",
            )


__all__ = [
    "ROUTINGS",
    "ROUTING_RULES",
    "RoutingRule",
    "check_routing",
    "expected_routes",
]
