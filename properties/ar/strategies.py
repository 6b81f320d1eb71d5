"""Hypothesis strategies for AR configurations and requests.

Pools range from one request's worst case (exact fit: preemption pressure) to roomy; budgets
from the seat cap to several prompts; chunked prefill on and off; block size 1 often enough for
LightLLM. Requests are sometimes invalid on purpose (longer than max_model_len).
"""

from __future__ import annotations

from hypothesis import strategies as st

from spec.ar.config import ArConfig, Policy
from spec.ar.profile import ArConfigSpace, CacheReadLimits


@st.composite
def ar_configs(
    draw: st.DrawFn,
    policies: tuple[Policy, ...] = (Policy.FCFS,),
    chunked: tuple[bool, ...] = (True, False),
    block_sizes: st.SearchStrategy[int] | None = None,
    thresholds: bool = True,
    max_seqs: int = 4,
    stages: tuple[int, ...] = (1,),
    replicas: tuple[int, ...] = (1,),
    prefix_caching: tuple[bool, ...] = (False,),
    null_block: tuple[bool, ...] = (False, True),
    max_loras: tuple[int, ...] = (0,),
    speculative_tokens: tuple[int, ...] = (0,),
) -> ArConfig:
    """An AR configuration: `max_model_len` 4..24, 1..`max_seqs` seats, a token budget of at
    least the seat count (and `max_model_len` without chunked prefill) up to twice
    `max_model_len`, a pool from one request's most blocks to about twice that (plus the null
    block when reserved); every other option drawn from the choices given for it (LoRA
    adapter slots, `max_loras`, and then the drafts a step may verify,
    `num_speculative_tokens` with the drafter's lookahead slots and input rows, drawn last
    and only where there is a choice, so that the examples without them are drawn as
    before)."""
    bs = draw(block_sizes if block_sizes is not None else st.sampled_from([1, 1, 2, 3, 4]))
    max_model_len = draw(st.integers(4, 24))
    chunk = draw(st.sampled_from(chunked))
    seqs = draw(st.integers(1, max_seqs))
    low = max(seqs, 1 if chunk else max_model_len)
    budget = draw(st.integers(low, max(low, 2 * max_model_len)))
    one = -(-(max_model_len - 1) // bs)  # blocks one request can hold at most
    reserve = draw(st.sampled_from(null_block))
    usable = draw(st.integers(one, 2 * one + 1))
    threshold = 0
    if chunk and thresholds and draw(st.booleans()):
        threshold = draw(st.integers(1, max_model_len))
    config = ArConfig(
        block_size=bs,
        num_blocks=usable + (1 if reserve else 0),
        reserve_null_block=reserve,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_model_len=max_model_len,
        long_prefill_token_threshold=threshold,
        enable_chunked_prefill=chunk,
        policy=draw(st.sampled_from(policies)),
        max_wait_steps=draw(st.integers(1, 6)),
        fair_token_cap=draw(st.integers(0, 6)) if chunk else 0,
        max_waiting_iters=draw(st.integers(1, 4)),
        num_stages=draw(st.sampled_from(stages)),
        num_replicas=draw(st.sampled_from(replicas)),
        enable_prefix_caching=draw(st.sampled_from(prefix_caching)),
        max_loras=draw(st.sampled_from(max_loras)) if max_loras != (0,) else 0,
        num_speculative_tokens=(
            draw(st.sampled_from(speculative_tokens)) if speculative_tokens != (0,) else 0
        ),
    )
    k = config.num_speculative_tokens
    if not k:
        return config
    # the drafter: ngram (no KV of its own), EAGLE (k lookahead slots), a draft model (k
    # slots and an input row per scheduled request, where the budget has room beside it)
    drafter = draw(st.sampled_from(DRAFTERS))
    # (soft preemption, the spec's own policy, asks room for a request's next token, not for
    # a drafter's slots past it: vLLM has no soft preemption to say what it would ask)
    if drafter == "ngram" or config.policy is Policy.PRIORITY_SOFT:
        return _room_to_pad(config)
    rows = 1 if drafter == "draft_model" and budget > seqs else 0
    # vLLM refuses a pool that cannot hold one sequence with its lookahead slots
    most = -(-max_model_len // bs)
    return _room_to_pad(
        config.replace(
            num_lookahead_tokens=k,
            num_drafting_slots=rows,
            num_blocks=max(config.num_blocks, most + int(reserve)),
        )
    )


def _room_to_pad(config: ArConfig) -> ArConfig:
    """`config` with a budget and a long-prefill threshold that hold vLLM's padding of a new
    decode (1 + k tokens, beside the drafter's rows): below the budget vLLM never admits a
    request with one token left after a cache hit, and below the threshold its `schedule()`
    asserts (a known finding, `integrations.vllm.spec_pad_fix`), which no suite need find
    again."""
    k = config.num_speculative_tokens
    if not k:
        return config
    threshold = config.long_prefill_token_threshold
    return config.replace(
        max_num_batched_tokens=max(
            config.max_num_batched_tokens, 1 + k + config.num_drafting_slots
        ),
        long_prefill_token_threshold=max(threshold, 1 + k) if threshold else 0,
    )


def ar_configs_in(
    space: ArConfigSpace,
    max_seqs: int = 4,
    replicas: tuple[int, ...] = (1,),
    loras: bool = False,
    drafts: bool = False,
) -> st.SearchStrategy[ArConfig]:
    """Configurations inside an implementation's declared space (only there); with `loras`,
    LoRA adapter slots too (`lora_slot_choices`), where the space serves adapters; with
    `drafts`, speculative decoding (`num_speculative_tokens` 0 to 3, `DRAFT_CHOICES`, by
    one of `DRAFTERS`)."""
    sizes = st.sampled_from(sorted(space.block_sizes)) if space.block_sizes is not None else None
    stages = tuple(sorted(space.stages)) if space.stages is not None else (1, 2)
    base = ar_configs(
        policies=tuple(sorted(space.policies, key=lambda p: p.value)),
        chunked=tuple(sorted(space.chunked_prefill)),
        block_sizes=sizes,
        thresholds=space.long_prefill_threshold,
        max_seqs=max_seqs,
        stages=stages,
        replicas=replicas,
        prefix_caching=tuple(sorted(space.prefix_caching)),
        null_block=tuple(sorted(space.null_block)),
        max_loras=lora_slot_choices(space) if loras else (0,),
        speculative_tokens=DRAFT_CHOICES if drafts else (0,),
    )
    if space.pool_holds_max_model_len:
        base = base.map(
            lambda c: c.replace(
                num_blocks=max(
                    c.num_blocks, space.pool_blocks_needed(c) + int(c.reserve_null_block)
                )
            )
        )
    return base.filter(lambda c: space.outside(c) is None)


#: `num_speculative_tokens` drawn where the suite drafts: none a quarter of the time.
DRAFT_CHOICES = (0, 1, 2, 3)
#: The drafters drawn beside drafts (`ArConfig.num_lookahead_tokens`, `num_drafting_slots`).
DRAFTERS = ("ngram", "eagle", "draft_model")


def lora_slot_choices(space: ArConfigSpace) -> tuple[int, ...]:
    """The `max_loras` values drawn for `space`: none half the time, else one or two slots,
    within what it serves (only 0 where it serves no adapter)."""
    most = 2 if space.max_loras is None else min(space.max_loras, 2)
    return (0, 0, *range(1, most + 1)) if most else (0,)


def request_loras() -> st.SearchStrategy[int | None]:
    """A request's LoRA adapter where the configuration serves them: the base model or one
    of three adapters (more than the slots drawn, so that some wait for room)."""
    return st.none() | st.integers(1, 3)


@st.composite
def prompts(draw: st.DrawFn, prompt_len: int, family: int = 7) -> tuple[int, ...] | None:
    """Token ids for a prompt: None (shares nothing), or a common run of `family` tokens then
    tokens of its own, so prefix caching has prefixes to share."""
    if draw(st.booleans()):
        return None
    shared = draw(st.integers(0, prompt_len))
    tail = draw(
        st.lists(st.integers(100, 103), min_size=prompt_len - shared, max_size=prompt_len - shared)
    )
    return (family,) * shared + tuple(tail)


def cache_read_limits(prompt_len: int, honoured: CacheReadLimits) -> st.SearchStrategy[int | None]:
    """A request's `cache_read_limit` among those `honoured`: mostly none; 0 (it skips reading
    the cache); with `BOUNDED`, a first scored prompt row s, 1 <= s < prompt_len - 1 (vLLM
    0.34 refuses a `prompt_logprob_start` from prompt_len - 1 on), which cuts a hit that
    would reach past it."""
    if honoured is CacheReadLimits.NONE:
        return st.none()
    limits: st.SearchStrategy[int | None] = st.sampled_from([None, None, 0])
    if honoured is CacheReadLimits.BOUNDED and prompt_len >= 3:
        limits = limits | st.integers(1, prompt_len - 2)
    return limits


@st.composite
def request_sizes(draw: st.DrawFn, config: ArConfig) -> tuple[int, int]:
    """(prompt_len, max_tokens): valid most of the time, sometimes longer than max_model_len."""
    limit = config.max_model_len
    # Long prompts a third of the time: two of them overflow a tight pool (preemption
    # pressure); short ones a third: several decode side by side until the pool runs out.
    prompt = draw(
        st.integers(1, limit - 1)
        | st.integers(max(1, limit // 2), limit - 1)
        | st.integers(1, max(1, limit // 4))
    )
    room = limit - prompt
    max_tokens = draw(st.one_of(st.integers(1, room), st.integers(1, limit)))
    return prompt, max_tokens
