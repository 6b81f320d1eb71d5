"""The sizes of an encoding (concrete) and the policy part of the configuration (symbolic).

`Geometry` bounds the finite domains: block size B, page size P, at most K KV pages, N requests
and R request-pool rows. `SymConfig` is the rest of a `DllmConfig` as z3 terms: one query over
`SymConfig.symbolic()` covers every policy and pool size up to K pages at once;
`SymConfig.concrete(config)` pins one configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import z3

from properties.symbolic.codes import EOS_TOKEN
from properties.symbolic.terms import Values, Z, model_value
from spec.config import DllmConfig, Mode
from spec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Geometry:
    """The concrete, bounded sizes of an encoding."""

    block_size: int
    page_size: int
    kv_pages: int
    requests: int = 4  # request indices 0..requests-1 (ids "r0", "r1", ...)
    rows: int = 4  # request-pool rows represented; req_pool_rows <= rows
    running: int = 4  # max_running_requests <= running

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size", self.block_size, ">= 1")
        if self.page_size % self.block_size:
            raise ConfigError("page_size", self.page_size, f"a multiple of {self.block_size}")
        if self.kv_pages < 1:
            raise ConfigError("kv_pages", self.kv_pages, ">= 1")

    @property
    def kv_slots(self) -> int:
        return self.page_size * self.kv_pages

    @property
    def blocks_per_page(self) -> int:
        return self.page_size // self.block_size

    def label(self) -> str:
        return (
            f"B={self.block_size} P={self.page_size} S<={self.kv_slots} N={self.requests} "
            f"R={self.rows}"
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
        )


@dataclass(frozen=True, slots=True)
class SymConfig:
    """The policy part of a `DllmConfig` as z3 terms (symbolic or concrete)."""

    sync: Z
    reuse: Z
    reloop: Z
    max_running: Z
    rows: Z
    max_context: Z
    eos: Z  # an EOS token id is configured
    kv_pages: Z  # pages in the pool (the pool is kv_pages * page_size slots)

    @classmethod
    def symbolic(cls, prefix: str = "cfg") -> SymConfig:
        return cls(
            z3.Bool(f"{prefix}.sync"),
            z3.Bool(f"{prefix}.reuse"),
            z3.Bool(f"{prefix}.reloop"),
            z3.Int(f"{prefix}.max_running"),
            z3.Int(f"{prefix}.rows"),
            z3.Int(f"{prefix}.max_context"),
            z3.Bool(f"{prefix}.eos"),
            z3.Int(f"{prefix}.kv_pages"),
        )

    @classmethod
    def concrete(cls, config: DllmConfig) -> SymConfig:
        v = config_values(config)
        return cls(*(z3.BoolVal(x) if isinstance(x, bool) else z3.IntVal(x) for x in v.values()))

    def terms(self) -> dict[str, Z]:
        """Every term by field name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def pinned_to(self, config: DllmConfig) -> Z:
        """Every field equals `config`'s value."""
        values = config_values(config)
        return z3.And([t == values[f] for f, t in self.terms().items()])

    def constraints(self, geom: Geometry) -> Z:
        """What `DllmConfig` validation accepts, within the geometry's bounds:
        1 <= max_running <= running, 1 <= rows <= R, B | max_context >= B,
        1 <= kv_pages <= K, sync ⇒ ¬reuse ∧ ¬reloop."""
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
        )


def config_values(config: DllmConfig) -> Values:
    """A concrete configuration's values of the `SymConfig` fields, by field name."""
    return {
        "sync": config.mode is Mode.SYNC,
        "reuse": config.in_place_reuse,
        "reloop": config.reloop,
        "max_running": config.max_running_requests,
        "rows": config.req_pool_rows,
        "max_context": config.max_context,
        "eos": config.eos_token_id is not None,
        "kv_pages": config.kv_pages,
    }
