"""Hypothesis strategies for configurations and workloads.

Pools range from exact fit (one request's worst case) to roomy; prompts from one token to the
whole context; some requests are invalid on purpose (too long, empty) to exercise rejection.
"""

from __future__ import annotations

from hypothesis import strategies as st

from spec.config import DllmConfig, Mode, RequestSpec
from spec.profile import DllmConfigSpace

VOCAB = 16  # token ids 0..15 for the reference's pseudo-logits
EOS = VOCAB - 1


_ANY_SPACE = DllmConfigSpace()


def _switch(draw: st.DrawFn, allowed: frozenset[bool]) -> bool:
    return draw(st.booleans()) if len(allowed) == 2 else next(iter(allowed))


@st.composite
def dllm_configs(
    draw: st.DrawFn,
    modes: tuple[Mode, ...] = (Mode.SYNC, Mode.FDFO),
    max_block: int = 4,
    max_running: int = 4,
    space: DllmConfigSpace = _ANY_SPACE,
) -> DllmConfig:
    """Configurations inside `space` (an implementation's declared space; default: all).

    Block sizes up to `max_block` and page multiples up to 3 unless the space names others;
    `prefix_cache` on only when the space has nothing else.
    """
    if space.block_sizes is None:
        block = draw(st.integers(1, max_block))
    else:
        block = draw(st.sampled_from(sorted(space.block_sizes)))
    if space.page_multiples is None:
        page = block * draw(st.integers(1, 3))
    else:
        page = block * draw(st.sampled_from(sorted(space.page_multiples)))
    max_context = block * draw(st.integers(2, max(2, 24 // block)))
    pages_for_one = -(-max_context // page)
    kv_pages = draw(st.integers(max(1, pages_for_one // 2), pages_for_one * 3))
    allowed_modes = tuple(m for m in modes if m in space.modes) or tuple(
        sorted(space.modes, key=lambda m: m.value)
    )
    mode = draw(st.sampled_from(allowed_modes))
    fdfo = mode is Mode.FDFO
    # Small caps half the time (a full running set with a queue behind it is where admission
    # bugs show), and rows at least the cap half the time (the cap, not the rows, then binds).
    running = draw(st.integers(1, max_running) | st.integers(1, min(2, max_running)))
    rows = draw(st.integers(1, max_running) | st.integers(running, max_running))
    if space.rows_equal_max_running:
        rows = running
    if space.kv_headroom_pages is not None:  # the space's smallest pool, or a little more
        probe = DllmConfig(
            block_size=block,
            page_size=page,
            kv_pages=1,
            max_running_requests=running,
            req_pool_rows=rows,
            max_context=max_context,
        )
        need = space.min_kv_pages(probe)
        kv_pages = draw(st.integers(need, need + pages_for_one))
    return DllmConfig(
        block_size=block,
        page_size=page,
        kv_pages=kv_pages,
        req_pool_rows=rows,
        max_running_requests=running,
        max_context=max_context,
        mode=mode,
        in_place_reuse=fdfo and _switch(draw, space.in_place_reuse),
        reloop=fdfo and _switch(draw, space.reloop),
        mask_token_id=-1,
        eos_token_id=draw(st.sampled_from([None, EOS])),
        prefix_cache=True in drawn_prefix_cache(space),
    )


def drawn_prefix_cache(space: DllmConfigSpace) -> frozenset[bool]:
    """The `prefix_cache` values `dllm_configs` draws in `space`: on only for a space that runs
    nothing else (a cache-only implementation); a space with both leaves it off unless a suite
    passes its own configurations."""
    return frozenset({space.prefix_cache == frozenset({True})})


def prompts(max_len: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Prompts of 1..max_len tokens; short ones (a quarter of max_len) half the time, so that
    several requests fit a small context and a full running set gets a queue behind it."""
    tokens = st.integers(0, VOCAB - 1)
    short = st.lists(tokens, min_size=1, max_size=max(1, max_len // 4))
    return (st.lists(tokens, min_size=1, max_size=max_len) | short).map(tuple)


def shared_stem_prompts(max_len: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Prompts that often share a prefix, for a prefix cache to hit: two times in three one of
    two fixed stems of 8 tokens (they share their first 4) cut to a random length and followed
    by a random tail, else a prompt of `prompts(max_len)`; at most `max_len` tokens."""
    stems = ((1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 10, 11, 12))
    tokens = st.integers(0, VOCAB - 1)
    stemmed = st.builds(
        lambda stem, cut, tail: (stem[:cut] + tuple(tail))[:max_len] or stem[:1],
        st.sampled_from(stems),
        st.integers(1, 8),
        st.lists(tokens, max_size=max(0, max_len - 1)),
    )
    return st.one_of(stemmed, stemmed, prompts(max_len))


def stop_token_id_sets() -> st.SearchStrategy[tuple[int, ...]]:
    """A request's `stop_token_ids`: none half the time, else one or two distinct ids other
    than the EOS (with 16 ids, a generated token is one of them one time in eight or sixteen,
    so some requests stop early and some run to their end)."""
    ids = st.lists(st.integers(0, VOCAB - 2), min_size=1, max_size=2, unique=True).map(tuple)
    return st.integers(0, 1).flatmap(lambda n: ids if n == 1 else st.just(()))


@st.composite
def request_sizes(draw: st.DrawFn, config: DllmConfig) -> tuple[tuple[int, ...], int]:
    """(prompt, max_new_tokens): valid most of the time, sometimes too long for the context."""
    limit = config.max_context
    prompt = draw(prompts(max(1, limit - 1)))
    room = max(1, limit - len(prompt))
    max_new = draw(st.one_of(st.integers(1, room), st.integers(1, limit + config.block_size)))
    return prompt, max_new


def request_specs(config: DllmConfig, request_id: str) -> st.SearchStrategy[RequestSpec]:
    """Requests with id `request_id` sized by `request_sizes` (sometimes too long for the
    context), with the default flags."""
    return request_sizes(config).map(lambda pm: RequestSpec(request_id, pm[0], pm[1]))
