"""The sizes of an encoding (concrete) and the policy part of the configuration (symbolic).

`Geometry` bounds the finite domains: block size B, page size P, at most K KV pages, N requests
and R request-pool rows. `SymConfig` is the rest of a `DllmConfig`, and the `DllmPolicy` rules
the relation takes as parameters, as z3 terms: one query over `SymConfig.symbolic()` covers
every mode, every such policy and every pool size up to K pages at once;
`SymConfig.concrete(config, policy)` pins one configuration and policy.

Of `DllmPolicy`, the encoding takes the seven fields that change which events the spec allows:
`work_conserving`, `admission` (FCFS or PREFILL_FIRST), `rows_released_between_rounds`,
`aborts_after_commit`, `priority_order` (the queue by priority), `longest_output_first`
(the queue by `max_new_tokens`, longest first, after the priority), submission order breaking
ties, and `free_queue_order` (no order is checked). `DllmConfig.prefix_cache` is a field too,
on only in a geometry that has the cache (`Geometry.prefix_cache`).
The reserved pages and rows lie outside the spec's pools (an adapter's id mapping), so no
guard reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import z3

from properties.symbolic.codes import EOS_TOKEN
from properties.symbolic.terms import Values, Z, model_value
from spec.config import DllmConfig, Mode
from spec.errors import ConfigError
from spec.profile import DllmAdmission, DllmPolicy


@dataclass(frozen=True, slots=True)
class Geometry:
    """The concrete, bounded sizes of an encoding."""

    block_size: int
    page_size: int
    kv_pages: int
    requests: int = 4  # request indices 0..requests-1 (ids "r0", "r1", ...)
    rows: int = 4  # request-pool rows represented; req_pool_rows <= rows
    running: int = 4  # max_running_requests <= running
    # configurations with `DllmConfig.prefix_cache` on are in the encoding's space
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size", self.block_size, ">= 1")
        if self.page_size % self.block_size:
            raise ConfigError("page_size", self.page_size, f"a multiple of {self.block_size}")
        if self.kv_pages < 1:
            raise ConfigError("kv_pages", self.kv_pages, ">= 1")

    @property
    def kv_slots(self) -> int:
        """Slots of the largest pool: `page_size * kv_pages`."""
        return self.page_size * self.kv_pages

    @property
    def blocks_per_page(self) -> int:
        """Blocks that fit in one page: `page_size // block_size`."""
        return self.page_size // self.block_size

    def label(self) -> str:
        """The sizes in one line, e.g. `B=2 P=2 S<=4 N=2 R=2` (S: the largest pool's slots;
        ` cache` when the prefix cache is in the space)."""
        return (
            f"B={self.block_size} P={self.page_size} S<={self.kv_slots} N={self.requests} "
            f"R={self.rows}" + (" cache" if self.prefix_cache else "")
        )

    @classmethod
    def of(cls, config: DllmConfig, requests: int = 4) -> Geometry:
        """The smallest geometry that holds `config` (and `requests` requests)."""
        return cls(
            config.block_size,
            config.page_size,
            config.kv_pages,
            requests,
            max(config.req_pool_rows, 1),
            max(config.max_running_requests, 1),
            config.prefix_cache,
        )


@dataclass(frozen=True, slots=True)
class SymConfig:
    """The policy part of a `DllmConfig`, and of its `DllmPolicy`, as z3 terms (symbolic or
    concrete)."""

    sync: Z
    reuse: Z
    reloop: Z
    max_running: Z
    rows: Z
    max_context: Z
    eos: Z  # an EOS token id is configured
    kv_pages: Z  # pages in the pool (the pool is kv_pages * page_size slots)
    work_conserving: Z  # DllmPolicy.work_conserving
    prefill_first: Z  # DllmPolicy.admission is PREFILL_FIRST
    rows_released: Z  # DllmPolicy.rows_released_between_rounds
    aborts_after_commit: Z  # DllmPolicy.aborts_after_commit
    priority_order: Z  # DllmPolicy.priority_order
    longest_output_first: Z  # DllmPolicy.longest_output_first
    free_queue_order: Z  # DllmPolicy.free_queue_order
    prefix_cache: Z  # DllmConfig.prefix_cache

    @classmethod
    def symbolic(cls, prefix: str = "cfg") -> SymConfig:
        """Fresh, unconstrained variables named `<prefix>.<field>` (see `constraints`)."""
        return cls(
            z3.Bool(f"{prefix}.sync"),
            z3.Bool(f"{prefix}.reuse"),
            z3.Bool(f"{prefix}.reloop"),
            z3.Int(f"{prefix}.max_running"),
            z3.Int(f"{prefix}.rows"),
            z3.Int(f"{prefix}.max_context"),
            z3.Bool(f"{prefix}.eos"),
            z3.Int(f"{prefix}.kv_pages"),
            z3.Bool(f"{prefix}.work_conserving"),
            z3.Bool(f"{prefix}.prefill_first"),
            z3.Bool(f"{prefix}.rows_released"),
            z3.Bool(f"{prefix}.aborts_after_commit"),
            z3.Bool(f"{prefix}.priority_order"),
            z3.Bool(f"{prefix}.longest_output_first"),
            z3.Bool(f"{prefix}.free_queue_order"),
            z3.Bool(f"{prefix}.prefix_cache"),
        )

    @classmethod
    def concrete(cls, config: DllmConfig, policy: DllmPolicy | None = None) -> SymConfig:
        """`config` and `policy` (default: the idealised spec's `DllmPolicy()`) as constants."""
        v = config_values(config, policy)
        return cls(*(z3.BoolVal(x) if isinstance(x, bool) else z3.IntVal(x) for x in v.values()))

    def terms(self) -> dict[str, Z]:
        """Every term by field name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def pinned_to(self, config: DllmConfig, policy: DllmPolicy | None = None) -> Z:
        """Every field equals the value of `config` and `policy` (default `DllmPolicy()`)."""
        values = config_values(config, policy)
        return z3.And([t == values[f] for f, t in self.terms().items()])

    def constraints(self, geom: Geometry) -> Z:
        """What `DllmConfig` validation accepts, within the geometry's bounds:
        1 <= max_running <= running, 1 <= rows <= R, B | max_context >= B,
        1 <= kv_pages <= K, sync ⇒ ¬reuse ∧ ¬reloop, free_queue_order ⇒ ¬priority_order ∧
        ¬longest_output_first, prefix_cache ⇒ the geometry has the cache."""
        b = geom.block_size
        return z3.And(
            self.max_running >= 1,
            self.max_running <= geom.running,
            self.rows >= 1,
            self.rows <= geom.rows,
            self.max_context >= b,
            self.max_context % b == 0,
            self.kv_pages >= 1,
            self.kv_pages <= geom.kv_pages,
            z3.Implies(self.sync, z3.And(z3.Not(self.reuse), z3.Not(self.reloop))),
            z3.Implies(
                self.free_queue_order,
                z3.And(z3.Not(self.priority_order), z3.Not(self.longest_output_first)),
            ),
            z3.Implies(self.prefix_cache, z3.BoolVal(geom.prefix_cache)),
        )

    def decode(self, model: Z, geom: Geometry) -> DllmConfig:
        """The concrete configuration chosen by a model."""

        def ev(x: Z) -> int:
            return int(model_value(model, x))

        return DllmConfig(
            block_size=geom.block_size,
            page_size=geom.page_size,
            kv_pages=ev(self.kv_pages),
            req_pool_rows=ev(self.rows),
            max_running_requests=ev(self.max_running),
            max_context=ev(self.max_context),
            mode=Mode.SYNC if model_value(model, self.sync) else Mode.FDFO,
            in_place_reuse=bool(model_value(model, self.reuse)),
            reloop=bool(model_value(model, self.reloop)),
            mask_token_id=-1,
            eos_token_id=EOS_TOKEN if model_value(model, self.eos) else None,
            prefix_cache=bool(model_value(model, self.prefix_cache)),
        )

    def decode_policy(self, model: Z) -> DllmPolicy:
        """The policy chosen by a model (its encoded fields; nothing reserved)."""
        return DllmPolicy(
            admission=(
                DllmAdmission.PREFILL_FIRST
                if model_value(model, self.prefill_first)
                else DllmAdmission.FCFS
            ),
            work_conserving=bool(model_value(model, self.work_conserving)),
            rows_released_between_rounds=bool(model_value(model, self.rows_released)),
            aborts_after_commit=bool(model_value(model, self.aborts_after_commit)),
            priority_order=bool(model_value(model, self.priority_order)),
            longest_output_first=bool(model_value(model, self.longest_output_first)),
            free_queue_order=bool(model_value(model, self.free_queue_order)),
        )


def policy_label(policy: DllmPolicy) -> str:
    """The encoded fields of a policy, for a counterexample's heading."""
    return (
        f"admission={policy.admission.value} work_conserving={policy.work_conserving} "
        f"rows_released_between_rounds={policy.rows_released_between_rounds} "
        f"aborts_after_commit={policy.aborts_after_commit}"
        + (" priority_order=True" if policy.priority_order else "")
        + (" longest_output_first=True" if policy.longest_output_first else "")
        + (" free_queue_order=True" if policy.free_queue_order else "")
    )


def config_values(config: DllmConfig, policy: DllmPolicy | None = None) -> Values:
    """The values of the `SymConfig` fields, by field name, for a concrete configuration and
    policy (default: the idealised spec's `DllmPolicy()`)."""
    policy = DllmPolicy() if policy is None else policy
    return {
        "sync": config.mode is Mode.SYNC,
        "reuse": config.in_place_reuse,
        "reloop": config.reloop,
        "max_running": config.max_running_requests,
        "rows": config.req_pool_rows,
        "max_context": config.max_context,
        "eos": config.eos_token_id is not None,
        "kv_pages": config.kv_pages,
        "work_conserving": policy.work_conserving,
        "prefill_first": policy.admission is DllmAdmission.PREFILL_FIRST,
        "rows_released": policy.rows_released_between_rounds,
        "aborts_after_commit": policy.aborts_after_commit,
        "priority_order": policy.priority_order,
        "longest_output_first": policy.longest_output_first,
        "free_queue_order": policy.free_queue_order,
        "prefix_cache": config.prefix_cache,
    }
