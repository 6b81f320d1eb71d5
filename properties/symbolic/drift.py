"""The drift guard's oracle: the symbolic relation evaluated on concrete states and events.

`SymbolicStepper(config)` builds the encoding once for one concrete `DllmConfig` (the policy is
concrete, so the relation is a function of the state and the event parameters), then answers,
for a `SpecMachine` state and a concrete event: is the event enabled under the symbolic
relation, and what is the successor (on the encoded part of the state)? The answers come from
substituting the concrete values into the relation's terms and simplifying — no solving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from properties.symbolic.compile import Compiled, compile_terms
from properties.symbolic.encoding import (
    GHOST_FIELDS,
    KIND,
    Encoding,
    Geometry,
    SymConfig,
    Values,
    encode_event,
    encode_machine,
    param_terms,
)
from spec.config import DllmConfig, Mode
from spec.events import Event

Z = Any


@dataclass(frozen=True, slots=True)
class SymVerdict:
    enabled: bool
    failed_rules: tuple[str, ...]  # rules whose guards are false (empty when enabled)
    successor: Values | None  # non-ghost successor values when enabled


class SymbolicStepper:
    """Evaluates the symbolic transition relation for concrete configurations of one geometry.

    The relation is built once with a symbolic policy and compiled (per event kind) into plain
    Python; a concrete configuration is then just more input values.
    """

    def __init__(self, geom: Geometry) -> None:
        self.geom = geom
        self.cfg = SymConfig.symbolic("cfg")
        self.enc = Encoding(geom, self.cfg)
        s, p = self.enc.state("s"), self.enc.params("p")
        inputs: dict[str, Z] = dict(s.items())
        inputs.update({f"p.{k}": t for k, t in param_terms(p).items()})
        inputs.update(_cfg_terms(self.cfg))
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

    def _inputs(self, config: DllmConfig, values: Values, params: Values | None) -> Values:
        v: Values = dict(values)
        if params is not None:
            v.update({f"p.{k}": x for k, x in params.items()})
        v.update(_cfg_values(config))
        return v

    def verdict(self, machine: Any, event: Event) -> SymVerdict:
        """Enabledness and successor of `event` in `machine`'s state, per the symbolic relation.
        Raises `NotEncodable` if the state or event lies outside the encoding."""
        values = encode_machine(machine, self.geom)
        params = encode_event(machine, self.geom, event)
        out = self._kind_fns[event.kind](self._inputs(machine.config, values, params))
        if not out["__ok"]:
            return SymVerdict(False, ("params",), None)
        rules = self._rules[event.kind]
        failed = tuple(dict.fromkeys(r for j, r in enumerate(rules) if not out[f"__g{j}"]))
        if failed:
            return SymVerdict(False, failed, None)
        succ: Values = {k: x for k, x in out.items() if not k.startswith("__")}
        return SymVerdict(True, (), succ)

    def invariants(self, machine: Any) -> dict[str, bool]:
        """The symbolic invariants evaluated on the machine's state."""
        values = encode_machine(machine, self.geom)
        out = self._inv_fn(self._inputs(machine.config, values, None))
        return {k: bool(x) for k, x in out.items()}


def _cfg_terms(cfg: SymConfig) -> dict[str, Z]:
    return {
        "cfg.sync": cfg.sync,
        "cfg.reuse": cfg.reuse,
        "cfg.reloop": cfg.reloop,
        "cfg.max_running": cfg.max_running,
        "cfg.rows": cfg.rows,
        "cfg.max_context": cfg.max_context,
        "cfg.eos": cfg.eos,
        "cfg.kv_pages": cfg.kv_pages,
    }


def _cfg_values(config: DllmConfig) -> Values:
    return {
        "cfg.sync": config.mode is Mode.SYNC,
        "cfg.reuse": config.in_place_reuse,
        "cfg.reloop": config.reloop,
        "cfg.max_running": config.max_running_requests,
        "cfg.rows": config.req_pool_rows,
        "cfg.max_context": config.max_context,
        "cfg.eos": config.eos_token_id is not None,
        "cfg.kv_pages": config.kv_pages,
    }


_STEPPERS: dict[Geometry, SymbolicStepper] = {}


def stepper_for(
    config: DllmConfig, requests: int = 4, rows: int = 4, running: int = 4, slots: int = 16
) -> SymbolicStepper:
    """A (cached) stepper whose geometry covers `config` (one per block and page size: every
    pool of up to `slots` slots shares it)."""
    geom = Geometry(
        config.block_size,
        config.page_size,
        max(config.kv_pages, slots // config.page_size),
        requests,
        max(rows, config.req_pool_rows),
        max(running, config.max_running_requests),
    )
    if geom not in _STEPPERS:
        _STEPPERS[geom] = SymbolicStepper(geom)
    return _STEPPERS[geom]


def encoded(machine: Any, geom: Geometry) -> Values:
    """The machine's non-ghost encoded values (what the drift guard compares)."""
    return {
        k: v
        for k, v in encode_machine(machine, geom).items()
        if k.split("[")[0] not in GHOST_FIELDS
    }
