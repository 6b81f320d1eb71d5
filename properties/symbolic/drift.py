"""The drift guard's oracle: the symbolic relation evaluated on concrete states and events.

`SymbolicStepper(geom)` builds the encoding once for one geometry with a symbolic policy and
compiles it (per event kind) into plain Python (`compile`); a concrete configuration and
policy are then just more input values. For a spec state and a concrete event it answers: is
the event enabled
under the symbolic relation (and if not, which rules' guards are false), and what is the
successor on the encoded part of the state? No solving is involved.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from properties.symbolic.codes import KIND
from properties.symbolic.compile import Compiled, compile_terms
from properties.symbolic.concrete import encode_event, encode_state
from properties.symbolic.encoding import Encoding
from properties.symbolic.geometry import Geometry, SymConfig, config_values
from properties.symbolic.state import GHOST_FIELDS
from properties.symbolic.terms import Values, Z
from spec.config import DllmConfig
from spec.events import Event
from spec.profile import DllmPolicy
from spec.state import AbstractState


@dataclass(frozen=True, slots=True)
class SymVerdict:
    """What the symbolic relation says of one concrete event: enabled or not, and the successor."""

    enabled: bool
    failed_rules: tuple[str, ...]  # rules whose guards are false (empty when enabled)
    successor: Values | None  # non-ghost successor values when enabled


class SymbolicStepper:
    """Evaluates the symbolic transition relation for concrete configurations of one geometry."""

    def __init__(self, geom: Geometry) -> None:
        self.geom = geom
        self.cfg: SymConfig = SymConfig.symbolic("cfg")
        self.enc: Encoding = Encoding(geom, self.cfg)
        s, p = self.enc.state("s"), self.enc.params("p")
        inputs: dict[str, Z] = dict(s.items())
        inputs.update({f"p.{k}": t for k, t in p.items().items()})
        inputs.update({f"cfg.{k}": t for k, t in self.cfg.terms().items()})
        guards = self.enc.guards(s, p)
        nxt = self.enc.effects(s, p)
        self._rules: dict[str, list[str]] = {}
        self._kind_fns: dict[str, Compiled] = {}
        for kind, code in KIND.items():
            outputs: dict[str, Z] = {"__ok": self.enc.params_ok(s, p)}
            self._rules[kind] = [g.rule for g in guards[kind]]
            for j, g in enumerate(guards[kind]):
                outputs[f"__g{j}"] = g.expr
            fixed = [(p.kind, z3.IntVal(code))]
            for k, t in nxt.items(ghosts=False):
                outputs[k] = z3.simplify(z3.substitute(t, *fixed))
            self._kind_fns[kind] = compile_terms(outputs, inputs)
        self._inv_fn = compile_terms(self.enc.invariants(s), inputs)

    def _inputs(
        self, config: DllmConfig, policy: DllmPolicy | None, values: Values, params: Values | None
    ) -> Values:
        v: Values = dict(values)
        if params is not None:
            v.update({f"p.{k}": x for k, x in params.items()})
        v.update({f"cfg.{k}": x for k, x in config_values(config, policy).items()})
        return v

    def verdict(
        self, state: AbstractState, event: Event, policy: DllmPolicy | None = None
    ) -> SymVerdict:
        """Enabledness and successor of `event` in `state` under `policy` (default
        `DllmPolicy()`), per the symbolic relation. Raises `NotEncodable` if the state or event
        lies outside the encoding."""
        values = encode_state(state, self.geom, policy)
        params = encode_event(state, self.geom, event)
        out = self._kind_fns[event.kind](self._inputs(state.config, policy, values, params))
        if not out["__ok"]:
            return SymVerdict(False, ("params",), None)
        rules = self._rules[event.kind]
        failed = tuple(dict.fromkeys(r for j, r in enumerate(rules) if not out[f"__g{j}"]))
        if failed:
            return SymVerdict(False, failed, None)
        succ: Values = {k: x for k, x in out.items() if not k.startswith("__")}
        return SymVerdict(True, (), succ)

    def invariants(self, state: AbstractState, policy: DllmPolicy | None = None) -> dict[str, bool]:
        """The symbolic invariants evaluated on `state` (a machine's under `policy`)."""
        values = encode_state(state, self.geom, policy)
        out = self._inv_fn(self._inputs(state.config, policy, values, None))
        return {k: bool(x) for k, x in out.items()}


_STEPPERS: dict[Geometry, SymbolicStepper] = {}


def stepper_for(
    config: DllmConfig, requests: int = 4, rows: int = 4, running: int = 4, slots: int = 16
) -> SymbolicStepper:
    """A (cached) stepper whose geometry covers `config` (one per block and page size: every
    pool of up to `slots` slots shares it; with the prefix cache when `config` has it)."""
    geom = Geometry(
        config.block_size,
        config.page_size,
        max(config.kv_pages, slots // config.page_size),
        requests,
        max(rows, config.req_pool_rows),
        max(running, config.max_running_requests),
        config.prefix_cache,
    )
    if geom not in _STEPPERS:
        _STEPPERS[geom] = SymbolicStepper(geom)
    return _STEPPERS[geom]


def encoded(state: AbstractState, geom: Geometry, policy: DllmPolicy | None = None) -> Values:
    """The state's non-ghost encoded values (what the drift guard compares), its queue in the
    order of a machine under `policy`."""
    values = encode_state(state, geom, policy)
    return {k: v for k, v in values.items() if k.split("[")[0] not in GHOST_FIELDS}
