"""Where each rule of `spec.rules` is encoded: the rule index.

A rule is encoded as labelled guards of event kinds (`events/<kind>.py`, the label is the rule
`SpecMachine` names when the check fails), as a named invariant (`invariants.py`), or both.
`NOT_ENCODED` states why the rest are not. `python -m properties.symbolic.rules` prints the
index as the markdown table of docs/proofs.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from properties.symbolic.encoding import Encoding
from properties.symbolic.geometry import Geometry
from properties.symbolic.invariants import INVARIANTS
from spec.rules import RULES

NOT_ENCODED: Mapping[str, str] = MappingProxyType(
    {
        "snapshot_matches": "compares an implementation's own allocator with the spec state; "
        "no implementation is encoded (checked by the conformance harness)",
        "fdfo_sync_parity": "about output tokens, which the encoding abstracts away (checked "
        "by the Hypothesis suites and the GPU parity run)",
        "reported_output": "about output tokens an implementation reports, which the encoding "
        "abstracts away (checked by the conformance harness after every round)",
        "golden_output": "about output tokens against an implementation's own solo decoding, "
        "which the encoding abstracts away (checked by the conformance harness after every "
        "round)",
        "twin_decisions": "compares two implementations' decisions; no implementation is "
        "encoded (checked by the conformance harness when a twin is declared)",
        "implementation_error": "about exceptions an implementation raises; no implementation "
        "is encoded (checked by the conformance harness)",
    }
)

_PROBE = Geometry(2, 4, 1, requests=1, rows=1, running=1)  # any geometry has every guard


def rule_index() -> dict[str, tuple[str, ...]]:
    """rule -> where it is encoded, in spec order: `events/<kind>.py` (a guard of that kind
    carries the rule's label) and `invariants.py:<name>`. Rules in `NOT_ENCODED` are absent."""
    enc = Encoding(_PROBE)
    s, p = enc.state("probe"), enc.params("probe")
    places: dict[str, list[str]] = {}
    for kind, guards in enc.guards(s, p).items():
        for g in guards:
            where = f"events/{kind}.py"
            entries = places.setdefault(g.rule, [])
            if where not in entries:
                entries.append(where)
    for name in INVARIANTS:
        places.setdefault(name, []).append(f"invariants.py:{name}")
    return {rule: tuple(places[rule]) for rule in RULES if rule in places}


def markdown_table() -> str:
    """The rule index as a markdown table (rule | encoded in)."""
    index = rule_index()
    lines = ["| rule (`spec.rules`) | encoded in `properties/symbolic/` |", "|---|---|"]
    for rule in RULES:
        where = ", ".join(f"`{w}`" for w in index[rule]) if rule in index else ""
        lines.append(f"| `{rule}` | {where or 'not encoded: ' + NOT_ENCODED.get(rule, '?')} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    print(markdown_table())
