"""Implementation profiles for autoregressive schedulers: what an implementation supports and
promises.

As for dLLM (`spec.profile`), an AR implementation declares beside its factory:

- its configuration space (`ArConfigSpace`): strategies draw only inside it; a configuration
  outside it is refused with `spec.profile.ConfigOutsideProfile`;
- its policy (`ArPolicy`): the ordering rules (`ArRules`) plus named options the rules take as
  parameters, each citing the engine behaviour that motivates it (vLLM 0.33's lone-request
  threshold exemption, victim choice among all running requests, the full-sequence admission
  gate; Vidur's watermark and same-step re-admission after preemption);
- its accepted deviations (`spec.profile.AcceptedDeviation`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from spec.ar.config import ArConfig, ArRules, Policy, VictimOrder, rules_for
from spec.ar.rules import ArRule
from spec.profile import AcceptedDeviation, ConfigOutsideProfile, ProfileError


class CacheReadLimits(enum.Enum):
    """Which per-request cache read limits (`ArRequest.cache_read_limit`) an implementation
    honours, so which the strategies draw."""

    NONE = "none"  # no request carries one
    SKIP = "skip"  # 0 (read nothing from the cache) or none: vLLM 0.33's skip_reading_prefix_cache
    BOUNDED = "bounded"  # any: vLLM 0.34's prefix_cache_hit_limit (prompt_logprob_start)


@dataclass(frozen=True, slots=True)
class ArConfigSpace:
    """The `ArConfig` values an implementation supports.

    policies: the scheduling policies it implements.
    block_sizes: allowed KV block sizes; None = any (LightLLM is token-level: {1}).
    chunked_prefill: the `enable_chunked_prefill` values it supports.
    null_block: the `reserve_null_block` values it supports (vLLM: block 0 is always the null
        block: {True}).
    prefix_caching: the `enable_prefix_caching` values it supports (vLLM 0.33: both; Vidur:
        {False}).
    long_prefill_threshold: whether it has `long_prefill_token_threshold` (Vidur: no, so only 0).
    pool_holds_max_model_len: it needs the usable pool to hold one max_model_len request
        (Vidur's Orca and FasterTransformer reserve that much per request at admission).
    pool_spare_tokens: with `pool_holds_max_model_len`, the usable pool holds max_model_len
        and this many tokens more. LightLLM's router refuses a request whose prompt and
        max_new_tokens and 1 exceed its pool (`req_total_len + 1 > max_total_token_num`): with
        1 spare token every request the spec admits is one LightLLM accepts.
    stages: the `num_stages` values it steps itself (None = any).
    cache_read_limits: the per-request cache read limits it honours (`CacheReadLimits`; with
        prefix caching only: a request then carries one now and then).
    max_loras: the largest `max_loras` it serves (0: no LoRA adapter; None: any). Asked
        for (`ar_conformance_machine(..., loras=True)`), the strategies draw 0 to min(this, 2)
        adapter slots, and requests of adapters 1 to 3 or the base model.
    """

    policies: frozenset[Policy] = frozenset(Policy)
    block_sizes: frozenset[int] | None = None
    chunked_prefill: frozenset[bool] = frozenset({False, True})
    null_block: frozenset[bool] = frozenset({False, True})
    prefix_caching: frozenset[bool] = frozenset({False, True})
    long_prefill_threshold: bool = True
    pool_holds_max_model_len: bool = False
    pool_spare_tokens: int = 0
    stages: frozenset[int] | None = frozenset({1})
    cache_read_limits: CacheReadLimits = CacheReadLimits.NONE
    max_loras: int | None = 0

    def __post_init__(self) -> None:
        if not self.policies:
            raise ProfileError("space.policies", "{}", "at least one policy")
        for name in ("chunked_prefill", "null_block", "prefix_caching"):
            if not getattr(self, name):
                raise ProfileError(f"space.{name}", "{}", "a non-empty subset of {False, True}")
        if self.stages is not None and (not self.stages or any(n < 1 for n in self.stages)):
            raise ProfileError("space.stages", sorted(self.stages), "positive integers or None")
        loras = self.max_loras
        if loras is not None and (
            isinstance(loras, bool) or not isinstance(loras, int) or loras < 0
        ):
            raise ProfileError(
                "space.max_loras", loras, "an integer >= 0 (0: no LoRA adapter) or None (any)"
            )
        spare = self.pool_spare_tokens
        if isinstance(spare, bool) or not isinstance(spare, int) or spare < 0:
            raise ProfileError("space.pool_spare_tokens", spare, "an integer >= 0")
        if spare and not self.pool_holds_max_model_len:
            raise ProfileError(
                "space.pool_spare_tokens", spare, "0 unless pool_holds_max_model_len is True"
            )
        if self.block_sizes is not None and (
            not self.block_sizes or any(b < 1 for b in self.block_sizes)
        ):
            raise ProfileError(
                "space.block_sizes", sorted(self.block_sizes), "positive integers or None"
            )

    def outside(self, config: ArConfig) -> tuple[str, object, str] | None:
        """(field, value, declared space) of the first field outside the space, else None."""
        if config.policy not in self.policies:
            return ("policy", config.policy.value, _names(p.value for p in self.policies))
        if self.block_sizes is not None and config.block_size not in self.block_sizes:
            return ("block_size", config.block_size, _names(map(str, self.block_sizes)))
        if config.enable_chunked_prefill not in self.chunked_prefill:
            return (
                "enable_chunked_prefill",
                config.enable_chunked_prefill,
                _names(map(str, self.chunked_prefill)),
            )
        if config.reserve_null_block not in self.null_block:
            return (
                "reserve_null_block",
                config.reserve_null_block,
                _names(map(str, self.null_block)),
            )
        if config.enable_prefix_caching not in self.prefix_caching:
            return (
                "enable_prefix_caching",
                config.enable_prefix_caching,
                _names(map(str, self.prefix_caching)),
            )
        if not self.long_prefill_threshold and config.long_prefill_token_threshold:
            return ("long_prefill_token_threshold", config.long_prefill_token_threshold, "{0}")
        needed = self.pool_blocks_needed(config)
        if config.usable_blocks < needed:
            spare = f" and {self.pool_spare_tokens} spare" if self.pool_spare_tokens else ""
            return (
                "num_blocks",
                config.num_blocks,
                f"a usable pool of at least {needed} blocks "
                f"(max_model_len={config.max_model_len} per request{spare})",
            )
        if self.stages is not None and config.num_stages not in self.stages:
            return ("num_stages", config.num_stages, _names(map(str, self.stages)))
        if self.max_loras is not None and config.max_loras > self.max_loras:
            return ("max_loras", config.max_loras, f"at most {self.max_loras} (0: no LoRA adapter)")
        return None

    def uncovered(self, other: ArConfigSpace) -> str | None:
        """The first kind of configuration `other` allows and this space does not, in words
        (`policy={aging}`, `enable_prefix_caching={True}`); None when every configuration of
        `other` is inside this space. A decision twin must run every configuration of the
        implementation it checks: one whose space does not cover it fails examples that say
        nothing of the implementation."""
        if not other.policies <= self.policies:
            return f"policy={_names(p.value for p in other.policies - self.policies)}"
        for name, allowed, wanted in (
            ("block_size", self.block_sizes, other.block_sizes),
            ("num_stages", self.stages, other.stages),
        ):
            if allowed is not None and (wanted is None or not wanted <= allowed):
                theirs = "any" if wanted is None else _names(map(str, wanted - allowed))
                return f"{name}={theirs} (this space: {_names(map(str, allowed))})"
        for name, mine, theirs_set in (
            ("enable_chunked_prefill", self.chunked_prefill, other.chunked_prefill),
            ("reserve_null_block", self.null_block, other.null_block),
            ("enable_prefix_caching", self.prefix_caching, other.prefix_caching),
        ):
            if not theirs_set <= mine:
                return f"{name}={_names(map(str, theirs_set - mine))}"
        if other.long_prefill_threshold and not self.long_prefill_threshold:
            return "long_prefill_token_threshold other than 0"
        if self.max_loras is not None and (
            other.max_loras is None or other.max_loras > self.max_loras
        ):
            theirs = "any" if other.max_loras is None else f"up to {other.max_loras}"
            return f"max_loras {theirs} (this space: at most {self.max_loras})"
        if self.pool_holds_max_model_len and (
            not other.pool_holds_max_model_len or other.pool_spare_tokens < self.pool_spare_tokens
        ):
            spare = f" and {self.pool_spare_tokens} spare tokens" if self.pool_spare_tokens else ""
            return f"pools that do not hold one max_model_len request{spare}"
        levels = list(CacheReadLimits)
        if True in other.prefix_caching and levels.index(other.cache_read_limits) > levels.index(
            self.cache_read_limits
        ):
            return (
                f"cache read limits {other.cache_read_limits.value} (this space: "
                f"{self.cache_read_limits.value})"
            )
        return None

    def pool_blocks_needed(self, config: ArConfig) -> int:
        """The usable blocks `config`'s pool must have: one max_model_len request and the
        spare tokens under `pool_holds_max_model_len`, else none."""
        if not self.pool_holds_max_model_len:
            return 0
        return config.blocks_for(config.max_model_len + self.pool_spare_tokens)

    def check(self, config: ArConfig) -> None:
        """Raise `ConfigOutsideProfile` naming the field if `config` is outside the space."""
        bad = self.outside(config)
        if bad is not None:
            name, value, valid = bad
            raise ConfigOutsideProfile(name, value, f"the implementation's declared space: {valid}")


@dataclass(frozen=True, slots=True)
class ArPolicy:
    """Deliberate policy choices; `ArSpecMachine` takes them as parameters. The default is the
    idealised spec (every option off).

    rules: the ordering rules (admission order, victim, token budget, ...); None =
        `rules_for(config)`, the vLLM-v1-style rules of the configured policy.
    victim: overrides `rules.victim` (None: keep it). `VictimOrder.LOWEST_PRIORITY_ANY` is
        vLLM 0.33's priority policy: the victim is the lowest priority (then latest arrival)
        among *all* running requests, including one already scheduled in this step, which is
        then unscheduled and its tokens returned to the budget (`Scheduler.schedule`,
        `vllm/v1/core/sched/scheduler.py`). Rule `preemption_victim`.
    lone_request_threshold_exempt: a request alone in the scheduler (nothing else running or
        waiting) may be scheduled more than `long_prefill_token_threshold` tokens (vLLM 0.33
        skips the threshold then; its source comment: there is nobody to starve). Rule
        `long_prefill_threshold`.
    adaptive_long_prefill_threshold: with `long_prefill_token_threshold` set, a request may
        be scheduled up to max(threshold, max_num_batched_tokens // (running + waiting
        requests)) tokens in one step: the threshold floored at a fair share of the budget
        (vLLM 0.33's `long_prefill_token_threshold_adaptive`, off by default, in
        `Scheduler.schedule`: "so it never cuts a request below max_num_batched_tokens / num
        requests"). Rule `long_prefill_threshold`.
    prefill_interval: vLLM 0.33's `prefill_schedule_interval` N (1: off, its default), the
        local prefill cadence in `Scheduler.schedule`: while a running request decodes, prefill
        rides one executed step in N, counted from the last executed step that carried
        prefill; a release step that leaves requests waiting lifts the hold until a release
        step drains them (vLLM #44558), requests its pass deferred not counted (awaiting their
        input, or skipped for their LoRA adapter). Beside LoRA adapters only under FCFS or
        priority (the spec then follows which requests each pass reached). Rule
        `prefill_cadence`.
    full_sequence_admission: a waiting request is admitted only when the blocks for its whole
        known sequence (prompt plus outputs so far, less cache hits) fit the free blocks, not
        just those for this step's chunk (vLLM 0.33's `scheduler_reserve_full_isl=True`, the
        default). Rule `full_sequence_admission`.
    watermark_fraction: admission leaves at least int(watermark_fraction * usable blocks)
        blocks free (Vidur's vLLM, Sarathi and Mnemosyne replica schedulers,
        `watermark_blocks_fraction`, in `_can_allocate_request` / `_can_allocate_blocks`; Vidur
        has no null block, so its pool is the usable blocks). Rule `admission_watermark`.
        Where `full_sequence_admission` is declared too, the whole sequence must fit above
        the watermark (vLLM: `num_blocks_to_allocate + watermark_blocks` against the free
        blocks, in `KVCacheManager.allocate_slots`). Rule `full_sequence_admission`.
    watermark_of_pool: the watermark is int(watermark_fraction * num_blocks), the null block
        counted (vLLM 0.33's `int(watermark * kv_cache_config.num_blocks)`), not a fraction
        of the usable blocks.
    watermark_beside_running: the watermark binds an admission only while another request
        is running, one admitted earlier in the same step included (vLLM 0.33's
        `allocate_slots(..., has_scheduled_reqs=bool(self.running))`); a request admitted
        with nothing running may take the pool down to no free block.
    admit_after_preemption: overrides `rules.admit_after_preemption` (None: keep it). True
        lets a step that preempted still admit, including re-admitting the request it just
        preempted (Vidur's Sarathi: a restarted request goes back to the head of the queue and
        the same batch admits from there). Such a request may be allocated blocks in the same
        scheduling phase; `preempted_holds_nothing` holds between steps (see docs/spec.md).
        Rule `no_admission_after_preemption`.
    cache_aware_window: vLLM 0.34's cache-aware admission (`cache_aware_admission_window`,
        0 by default: off). Under the FCFS policy with prefix caching on, at the start of the
        admission phase of a step that preempted nothing and is not held by the prefill
        cadence, the first `cache_aware_window` waiting requests are reordered when the pool
        is used at least `cache_aware_threshold` (1 - free blocks / usable blocks): the slots
        held by requests never scheduled keep their places in the queue and are refilled by
        those requests, deepest cached prefix first (whole cached blocks of at most its known
        tokens less one), queue order breaking ties; a preempted request keeps its place
        and nothing beyond the window moves. The order persists: FCFS then admits the head of
        the reordered queue (`Scheduler._reorder_waiting_by_cached_prefix`). Rules
        `fcfs_admission` and `waiting_order`. Ignored under other policies and without
        prefix caching, as vLLM ignores it.
    cache_aware_threshold: the pool usage below which `cache_aware_window` reorders nothing
        (vLLM 0.34's `cache_aware_admission_threshold`, 0.5 by default; 0.0: every step).
    hash_lookahead_tokens: with prefix caching, a block's cache key also covers the L tokens
        after it (vLLM's `num_hash_lookahead_tokens`: 1 with an EAGLE drafter, whose KV at a
        block's last position depends on the next token; 0: the block's own prefix). A block
        is cached only once the L tokens after it are known, a hit takes a block only where
        the request's own L tokens after it match too, and so only blocks within its known
        tokens less L; the cache-aware order ranks hits so. Rules `cache_hit_cached`,
        `cache_hit_bounded`, `fcfs_admission`.
    longest_cache_hit: with prefix caching, a request admitted from the queue takes the longest
        run of cached blocks holding its prefix, within what it may read (vLLM's
        `find_longest_cache_hit` over one full-attention group, blocks hashed by their tokens
        and LoRA adapter alone: no cache salt or multimodal input in any request; not beside an
        EAGLE drafter that drops a hit's last block, `disable_lookahead_block_hashes`). Rule
        `cache_hit_longest`: a hit shorter than that (or none) is a prefix cache that missed.
    admission_progress: the admission pass stops only at a request it cannot admit (vLLM's
        waiting loop: it `break`s only for a full batch, an exhausted budget or blocks that do
        not fit, and passes over, `continue`, only requests it may not admit yet). A step
        that preempted nothing, unpaused, ends with no waiting request the admission rules
        allow that fits: a free seat, the budget left covers all its known tokens (with
        chunked prefill, one: vLLM admits a chunk), and a drafter's extra tokens and rows,
        the free blocks cover the tokens it reaches (all; with chunked prefill and no
        whole-sequence gate, its cache hit and the budget left) above the binding
        watermark. Under FCFS or priority only, and not beside a prefill cadence, a
        look-ahead, static batches, aging, token caps or soft preemption. Rule
        `admission_progress`: it catches a pass that stops at a request it passes over
        (awaiting, or its adapter finds no room) and a pass that admits less than fits.
    """

    rules: ArRules | None = None
    victim: VictimOrder | None = None
    lone_request_threshold_exempt: bool = False
    adaptive_long_prefill_threshold: bool = False
    prefill_interval: int = 1
    full_sequence_admission: bool = False
    watermark_fraction: float = 0.0
    watermark_of_pool: bool = False
    watermark_beside_running: bool = False
    admit_after_preemption: bool | None = None
    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5
    hash_lookahead_tokens: int = 0
    longest_cache_hit: bool = False
    admission_progress: bool = False

    def __post_init__(self) -> None:
        if self.rules is not None and not isinstance(self.rules, ArRules):
            raise ProfileError("policy.rules", self.rules, "an ArRules or None")
        if self.victim is not None and not isinstance(self.victim, VictimOrder):
            raise ProfileError(
                "policy.victim", self.victim, _names(v.value for v in VictimOrder) + " or None"
            )
        for name in (
            "lone_request_threshold_exempt",
            "adaptive_long_prefill_threshold",
            "full_sequence_admission",
            "watermark_of_pool",
            "watermark_beside_running",
            "longest_cache_hit",
            "admission_progress",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ProfileError(f"policy.{name}", getattr(self, name), "True or False")
        if self.admit_after_preemption is not None and not isinstance(
            self.admit_after_preemption, bool
        ):
            raise ProfileError(
                "policy.admit_after_preemption", self.admit_after_preemption, "True, False or None"
            )
        n = self.prefill_interval
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ProfileError("policy.prefill_interval", n, "an integer >= 1 (1: no cadence)")
        w = self.watermark_fraction
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0.0 <= w < 1.0:
            raise ProfileError("policy.watermark_fraction", w, "a number in [0, 1)")
        n = self.cache_aware_window
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ProfileError(
                "policy.cache_aware_window", n, "an integer >= 0 (0: admission in arrival order)"
            )
        t = self.cache_aware_threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= t <= 1.0:
            raise ProfileError("policy.cache_aware_threshold", t, "a number in [0, 1]")
        n = self.hash_lookahead_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ProfileError(
                "policy.hash_lookahead_tokens", n, "an integer >= 0 (0: a block's own prefix)"
            )

    def rules_for(self, config: ArConfig) -> ArRules:
        """The effective ordering rules under `config`: `rules` (or the policy's defaults) with
        this policy's overrides applied."""
        base = self.rules if self.rules is not None else rules_for(config)
        changes: dict[str, object] = {}
        if self.victim is not None:
            changes["victim"] = self.victim
        if self.admit_after_preemption is not None:
            changes["admit_after_preemption"] = self.admit_after_preemption
        return dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]

    def watermark_blocks(self, config: ArConfig) -> int:
        """Blocks admission must leave free where the watermark binds: int(fraction * usable
        blocks) (Vidur's int(fraction * num_blocks) over its pool, which has no null block),
        or with `watermark_of_pool` int(fraction * num_blocks), the null block counted
        (vLLM's)."""
        pool = config.num_blocks if self.watermark_of_pool else config.usable_blocks
        return int(self.watermark_fraction * pool)


@dataclass(frozen=True, slots=True)
class ArProfile:
    """What an AR implementation supports (`space`), promises (`policy`) and knowingly breaks
    (`deviations`). `ArProfile()` is the idealised spec."""

    space: ArConfigSpace = field(default_factory=ArConfigSpace)
    policy: ArPolicy = field(default_factory=ArPolicy)
    deviations: tuple[AcceptedDeviation, ...] = ()

    def __post_init__(self) -> None:
        rules = [d.rule for d in self.deviations]
        if len(set(rules)) != len(rules):
            raise ProfileError("deviations", rules, "each rule listed once")
        unknown = [r for r in rules if r not in ArRule.__members__.values()]
        if unknown:
            raise ProfileError(
                "deviations", unknown, "names of AR rules (spec.ar.rules.ArRule), e.g. 'progress'"
            )

    def accepted(self, rule: str) -> AcceptedDeviation | None:
        """The deviation this profile accepts for `rule`, or None."""
        return next((d for d in self.deviations if d.rule == rule), None)


def _names(values: Iterable[object]) -> str:
    return "{" + ", ".join(sorted(str(v) for v in values)) + "}"


__all__ = ["ArConfigSpace", "ArPolicy", "ArProfile", "CacheReadLimits", "ConfigOutsideProfile"]
