"""Implementation profiles for dLLM schedulers: what an implementation supports and promises.

A real engine makes deliberate choices that the idealised spec must not forbid. An
implementation therefore declares, as typed data beside its factory:

- its **configuration space** (`DllmConfigSpace`): which `DllmConfig` values it can run.
  Strategies draw only inside it; a configuration outside it is refused with
  `ConfigOutsideProfile`, naming the field and the declared space.
- its **policy** (`DllmPolicy`): named options the spec's rules take as parameters. Each option
  documents the engine behaviour that motivates it.
- its **accepted deviations** (`AcceptedDeviation`): rules it is known to break on purpose,
  each with a reason; a campaign reports them as "accepted", not as failures.

The default profile is the idealised spec: every configuration, FCFS admission, nothing
reserved, no deviation.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from spec.config import DllmConfig, Mode
from spec.errors import ConfigError
from spec.rules import Rule


class ProfileError(ConfigError):
    """A profile that contradicts itself (names the field and why)."""


class ConfigOutsideProfile(ConfigError):
    """A configuration outside the implementation's declared space."""


class DllmAdmission(enum.Enum):
    """Which queued request may be admitted, and how batches are formed across phases."""

    # The idealised spec: one queue, admitted strictly in submission order; a round's batch may
    # mix requests feeding prompt blocks and requests decoding output blocks.
    FCFS = "fcfs"
    # SGLang's dLLM path (0.5.23, `Scheduler.get_next_batch_to_run`): a batch is prefill-only or
    # decode-only, and a round with admissible queued work runs the prefill batch first, so
    # admission is FCFS within each kind (first block prompt-only or not), and a request of the
    # first kind may pass queued requests of the second.
    PREFILL_FIRST = "prefill-first"


@dataclass(frozen=True, slots=True)
class AcceptedDeviation:
    """A rule the implementation breaks on purpose, and why (reported, not failed)."""

    rule: str
    reason: str

    def __post_init__(self) -> None:
        if not self.rule.strip():
            raise ProfileError("deviation.rule", self.rule, "the name of a spec rule")
        if not self.reason.strip():
            raise ProfileError(
                "deviation.reason", self.reason, f"a reason for accepting {self.rule!r}"
            )


@dataclass(frozen=True, slots=True)
class DllmConfigSpace:
    """The `DllmConfig` values an implementation supports.

    modes: the modes it runs.
    page_multiples: allowed `page_size // block_size`; None = any positive multiple
        (SGLang 0.5.23 caps page_size at block_size in `_dllm_page_size`: {1}).
    block_sizes: allowed block sizes; None = any.
    in_place_reuse / reloop: the switch values it supports (SGLang 0.5.23: reuse is
        unconditional, there is no re-loop: {True} / {False}).
    rows_equal_max_running: the request pool has exactly max_running_requests rows (SGLang sizes
        its ReqToTokenPool from max_running_requests).
    kv_headroom_pages: None = any pool size; k = only pools where each of max_running_requests
        requests has room for a whole max_context request plus k pages, and the pool k more
        (`min_kv_pages`). SGLang 0.5.23's admission estimate reserves more than the spec's
        worst case (a mask block, max_new_tokens and a page per request) and below such a pool
        it stalls, runs out of memory or truncates blocks — findings checked on their own,
        and SGLang patched with their fixes passes with no headroom (docs/engines/sglang.md).
    prefix_cache: the `DllmConfig.prefix_cache` values it runs ({False}: no prefix cache;
        SGLang 0.5.23's radix cache: {False, True}).
    """

    modes: frozenset[Mode] = frozenset(Mode)
    page_multiples: frozenset[int] | None = None
    block_sizes: frozenset[int] | None = None
    in_place_reuse: frozenset[bool] = frozenset({False, True})
    reloop: frozenset[bool] = frozenset({False, True})
    rows_equal_max_running: bool = False
    kv_headroom_pages: int | None = None
    prefix_cache: frozenset[bool] = frozenset({False})

    def __post_init__(self) -> None:
        if self.kv_headroom_pages is not None and (
            isinstance(self.kv_headroom_pages, bool)
            or not isinstance(self.kv_headroom_pages, int)
            or self.kv_headroom_pages < 0
        ):
            raise ProfileError("space.kv_headroom_pages", self.kv_headroom_pages, "None or >= 0")
        if not self.modes:
            raise ProfileError("space.modes", "{}", "at least one of sync, fdfo")
        for name, values in (
            ("in_place_reuse", self.in_place_reuse),
            ("reloop", self.reloop),
            ("prefix_cache", self.prefix_cache),
        ):
            if not values:
                raise ProfileError(f"space.{name}", "{}", "a non-empty subset of {False, True}")
        if self.page_multiples is not None and (
            not self.page_multiples or any(m < 1 for m in self.page_multiples)
        ):
            raise ProfileError(
                "space.page_multiples", sorted(self.page_multiples), "positive integers or None"
            )
        if self.block_sizes is not None and (
            not self.block_sizes or any(b < 1 for b in self.block_sizes)
        ):
            raise ProfileError(
                "space.block_sizes", sorted(self.block_sizes), "positive integers or None"
            )
        # The switches only exist under FDFO: restricting them while FDFO is excluded is a
        # contradiction (a profile that cannot mean what it says).
        if Mode.FDFO not in self.modes:
            for name, values in (("in_place_reuse", self.in_place_reuse), ("reloop", self.reloop)):
                if values != frozenset({False, True}) and values != frozenset({False}):
                    raise ProfileError(
                        f"space.{name}",
                        sorted(values),
                        f"{{False}} or both: {name} exists only under fdfo, which space.modes "
                        f"({_names(m.value for m in self.modes)}) excludes",
                    )

    def outside(self, config: DllmConfig) -> tuple[str, object, str] | None:
        """(field, value, declared space) of the first field outside the space, else None."""
        if config.mode not in self.modes:
            return ("mode", config.mode.value, _names(m.value for m in self.modes))
        multiple = config.page_size // config.block_size
        if self.page_multiples is not None and multiple not in self.page_multiples:
            return (
                "page_size",
                config.page_size,
                f"block_size x {_names(str(m) for m in self.page_multiples)}",
            )
        if self.block_sizes is not None and config.block_size not in self.block_sizes:
            return ("block_size", config.block_size, _names(str(b) for b in self.block_sizes))
        fdfo = config.mode is Mode.FDFO
        if fdfo and config.in_place_reuse not in self.in_place_reuse:
            return ("in_place_reuse", config.in_place_reuse, _names(map(str, self.in_place_reuse)))
        if fdfo and config.reloop not in self.reloop:
            return ("reloop", config.reloop, _names(map(str, self.reloop)))
        if config.prefix_cache not in self.prefix_cache:
            return ("prefix_cache", config.prefix_cache, _names(map(str, self.prefix_cache)))
        if self.rows_equal_max_running and config.req_pool_rows != config.max_running_requests:
            return (
                "req_pool_rows",
                config.req_pool_rows,
                f"equal to max_running_requests ({config.max_running_requests})",
            )
        need = self.min_kv_pages(config)
        if config.kv_pages < need:
            return ("kv_pages", config.kv_pages, f">= {need} (kv_headroom_pages)")
        return None

    def uncovered(self, other: DllmConfigSpace, modes: frozenset[Mode] | None = None) -> str | None:
        """The first kind of configuration `other` allows and this space does not, in words
        (`prefix_cache={True}`, `pools below 10 pages of headroom (kv_headroom_pages)`); None
        when every configuration of `other` (in `modes` only, when given) is inside this space.
        A decision twin must run every configuration of the implementation it checks: a twin
        whose space does not cover it fails examples that say nothing of the implementation."""
        runs = other.modes if modes is None else other.modes & modes
        if not runs <= self.modes:
            return f"mode={_names(m.value for m in runs - self.modes)}"
        if self.page_multiples is not None and (
            other.page_multiples is None or not other.page_multiples <= self.page_multiples
        ):
            theirs = (
                "any" if other.page_multiples is None else _names(map(str, other.page_multiples))
            )
            mine = _names(map(str, self.page_multiples))
            return f"page_size = block_size x {theirs} (this space: {mine})"
        if self.block_sizes is not None and (
            other.block_sizes is None or not other.block_sizes <= self.block_sizes
        ):
            theirs = "any" if other.block_sizes is None else _names(map(str, other.block_sizes))
            return f"block_size={theirs} (this space: {_names(map(str, self.block_sizes))})"
        if Mode.FDFO in runs:
            for name, allowed, wanted in (
                ("in_place_reuse", self.in_place_reuse, other.in_place_reuse),
                ("reloop", self.reloop, other.reloop),
            ):
                if not wanted <= allowed:
                    return f"{name}={_names(map(str, wanted - allowed))}"
        if not other.prefix_cache <= self.prefix_cache:
            return f"prefix_cache={_names(map(str, other.prefix_cache - self.prefix_cache))}"
        if self.rows_equal_max_running and not other.rows_equal_max_running:
            return "req_pool_rows other than max_running_requests"
        if self.kv_headroom_pages is not None and (
            other.kv_headroom_pages is None or other.kv_headroom_pages < self.kv_headroom_pages
        ):
            theirs = "any pool" if other.kv_headroom_pages is None else "pools"
            return f"{theirs} below {self.kv_headroom_pages} pages of headroom (kv_headroom_pages)"
        return None

    def min_kv_pages(self, config: DllmConfig) -> int:
        """The smallest pool inside the space for `config`'s other fields: with
        `kv_headroom_pages` = k, every one of max_running_requests requests can hold a whole
        max_context request plus k pages, and the pool k pages more; else 1."""
        if self.kv_headroom_pages is None:
            return 1
        k = self.kv_headroom_pages
        per_request = -(-config.max_context // config.page_size) + k
        return config.max_running_requests * per_request + k

    def check(self, config: DllmConfig) -> None:
        """Raise `ConfigOutsideProfile` naming the field if `config` is outside the space."""
        bad = self.outside(config)
        if bad is not None:
            name, value, valid = bad
            raise ConfigOutsideProfile(name, value, f"the implementation's declared space: {valid}")


@dataclass(frozen=True, slots=True)
class DllmPolicy:
    """Deliberate policy choices; the spec's rules take them as parameters.

    admission: see `DllmAdmission`.
    reserved_kv_pages / reserved_rows: pages and request-pool rows the engine keeps for itself
        (SGLang: KV page 0 and request-pool row 0 hold padding). They are outside the spec's
        pool: the engine has kv_pages + reserved_kv_pages pages and req_pool_rows +
        reserved_rows rows, and its adapter reports only the others (spec id = engine id -
        reserved).
    work_conserving: the scheduler never leaves a seat, a row and enough KV idle while the
        queue head fits (False for an engine that deliberately holds back).
    rows_released_between_rounds: FDFO without in-place reuse: a request whose block is carried
        unfinished gives its request-pool row back at the end of the round, with the block's KV,
        and takes one again (`RowAcquired`) in the next round's scheduler phase. Off: a running
        request holds its row from admission to the end (the idealised spec).
    aborts_after_commit: the engine may also abort a request inside a round, in its completion
        phase right after the request committed a block holding a generated token (SGLang
        0.5.23: `Req.to_finish`, set by a grammar failure or an invalid stop regex, takes
        effect in `update_finish_state` after the request's next commit). Off: aborts happen
        between rounds (the idealised spec).
    priority_order: the queue is ordered by `Submitted.priority`, lower first, submission order
        breaking ties: admission (FCFS, or PREFILL_FIRST within each kind) follows that order
        instead of submission order (SGLang 0.5.23 `--enable-priority-scheduling` with
        `--schedule-low-priority-values-first`: `SchedulePolicy._sort_by_priority_and_fcfs`;
        vLLM's priority policy). The property suites then give requests priorities. Off: the
        queue is in submission order and priorities are ignored (the idealised spec).
    longest_output_first: the queue is ordered by `max_new_tokens`, the longest first, after
        the priority when `priority_order` is on too, submission order breaking ties; admission
        reads that order as it reads `priority_order`'s (SGLang 0.5.23 `--schedule-policy lof`:
        `SchedulePolicy._sort_by_longest_output`, a stable sort before every round, its dLLM
        path included). Off: `max_new_tokens` does not order the queue (the idealised spec).
    free_queue_order: the queue is in an order of the engine's own that the spec does not
        model, so admission may take any queued request (`fcfs_admission` then only asks that
        it be queued) and `work_conserving` asks for an admission only when every queued
        request would fit, whichever the engine puts first (SGLang 0.5.23 with its radix
        cache on and a cache-aware `--schedule-policy`: `lpm`, `dfs-weight`, `hrrn` or
        `shortest-prefill-first` sort the waiting queue by what the tree holds before every
        round, `lpm` deprioritising requests that share a prefix with one ahead of them;
        `--schedule-policy random` shuffles it). Every other rule binds as before. It
        excludes `priority_order` and `longest_output_first`, which define the order. Off: the
        queue's order is checked (the idealised spec).
    """

    admission: DllmAdmission = DllmAdmission.FCFS
    reserved_kv_pages: int = 0
    reserved_rows: int = 0
    work_conserving: bool = True
    rows_released_between_rounds: bool = False
    aborts_after_commit: bool = False
    priority_order: bool = False
    longest_output_first: bool = False
    free_queue_order: bool = False

    def __post_init__(self) -> None:
        for name in ("reserved_kv_pages", "reserved_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ProfileError(f"policy.{name}", value, "an integer >= 0")
        if self.free_queue_order and self.orders_queue:
            raise ProfileError(
                "policy.free_queue_order",
                True,
                "False while priority_order or longest_output_first is on (those define the "
                "queue's order; a free order has none to check)",
            )

    @property
    def orders_queue(self) -> bool:
        """Whether the queue has an order of its own (`priority_order` or
        `longest_output_first`) rather than submission order."""
        return self.priority_order or self.longest_output_first

    def queue_key(self, priority: int, max_new_tokens: int) -> tuple[int, int]:
        """A queued request's place in the queue: a request with a smaller key is ahead, and
        submission order breaks ties. Under neither ordering option every key is equal (the
        queue is in submission order)."""
        return (
            priority if self.priority_order else 0,
            -max_new_tokens if self.longest_output_first else 0,
        )

    def describe_queue_order(self) -> str:
        """The queue's order in words, for a violation (empty in submission order or a free
        order)."""
        keys = [
            *(["priority, lower first"] if self.priority_order else []),
            *(["max_new_tokens, longest first"] if self.longest_output_first else []),
        ]
        return f"the queue is ordered by {', then '.join(keys)}" if keys else ""


@dataclass(frozen=True, slots=True)
class DllmProfile:
    """What a dLLM implementation supports (`space`), promises (`policy`) and knowingly breaks
    (`deviations`). `DllmProfile()` is the idealised spec.

    `ignore_eos`: it takes requests with `RequestSpec.ignore_eos` (runs them past their EOS and
    logs the flag on `Submitted`), so the property suites give it some; without it they give
    none (an adapter written before the option still conforms). `stop_token_ids`: likewise for
    requests with `RequestSpec.stop_token_ids` (ended with STOP at the first of them)."""

    space: DllmConfigSpace = field(default_factory=DllmConfigSpace)
    policy: DllmPolicy = field(default_factory=DllmPolicy)
    deviations: tuple[AcceptedDeviation, ...] = ()
    ignore_eos: bool = False
    stop_token_ids: bool = False

    def __post_init__(self) -> None:
        for option in ("ignore_eos", "stop_token_ids"):
            if not isinstance(getattr(self, option), bool):
                raise ProfileError(option, getattr(self, option), "true or false")
        known = {str(r) for r in Rule}
        seen: set[str] = set()
        for d in self.deviations:
            if d.rule not in known:
                raise ProfileError(
                    "deviations", d.rule, f"the name of a dLLM spec rule ({len(known)} exist)"
                )
            if d.rule in seen:
                raise ProfileError("deviations", d.rule, "each rule listed once")
            seen.add(d.rule)
        if "work_conserving" in seen and not self.policy.work_conserving:
            raise ProfileError(
                "deviations",
                "work_conserving",
                "not both: policy.work_conserving=False already turns the rule off",
            )

    def accepted(self, rule: str) -> AcceptedDeviation | None:
        """The accepted deviation for `rule`, if declared."""
        return next((d for d in self.deviations if d.rule == rule), None)


def _names(values: Iterable[object]) -> str:
    return "{" + ", ".join(sorted(str(v) for v in values)) + "}"


__all__ = [
    "AcceptedDeviation",
    "ConfigOutsideProfile",
    "DllmAdmission",
    "DllmConfigSpace",
    "DllmPolicy",
    "DllmProfile",
    "ProfileError",
]
