"""The paged serving path (`forward_blocks` over a scattered KV pool) agrees with the dense
block-causal path, and writes every block's K/V exactly into the slots the table names."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.corpus import make_samples
from gpu.errors import ForwardInputError
from gpu.gemm_rows import padding_rows, uneven_row_counts
from gpu.kv_cache import PagedKvCache
from gpu.model import (
    BlockDiffusionLM,
    _slots_by_gather,
    _slots_by_slicing,
    block_causal_mask,
)
from gpu.model_config import ModelConfig
from gpu.near_tie import ABS_TOLERANCE, REL_TOLERANCE
from gpu.weights import load_model

torch.set_num_threads(1)
# the bound the golden oracle's tie search assumes (gpu.near_tie): absolute, for K/V and for
# logits of magnitude <= 1; relative for logits, whose float32 re-association error grows
TOL = ABS_TOLERANCE
REL_TOL = REL_TOLERANCE


def small_model(seed: int = 0) -> BlockDiffusionLM:
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=49, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_context=64)
    return BlockDiffusionLM(config).eval()


def dense_kv(
    model: BlockDiffusionLM, tokens: torch.Tensor, block_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K after RoPE, V) [L, heads, head_dim] of one sequence on the dense path,
    recomputed with the model's own layer functions."""
    length = tokens.shape[0]
    positions = torch.arange(length)
    cos, sin = model.rope_cos[positions][None], model.rope_sin[positions][None]
    allowed = block_causal_mask(length, block_size)[None]
    x = model.embed(tokens[None])
    out = []
    with torch.no_grad():
        for block in model.transformer_blocks():
            q, k, v = block.attn.project(block.attn_norm(x), cos, sin)
            out.append((k[0], v[0]))
            x = x + block.attn.attend(q, k, v, allowed)
            x = x + block.mlp(block.mlp_norm(x))
    return out


class PagedRun:
    """Decode several sequences through forward_blocks with staggered starts, scattered request
    rows and shuffled KV slots: in one batch, rows sit at different block indices."""

    def __init__(
        self, model: BlockDiffusionLM, seqs: list[torch.Tensor], block_size: int, seed: int
    ) -> None:
        cfg = model.config
        rng = random.Random(seed)
        self.total = sum(len(s) for s in seqs) + 13  # spare slots that must stay untouched
        perm = list(range(self.total))
        rng.shuffle(perm)
        self.kv = PagedKvCache(
            cfg.n_layers, cfg.n_heads, cfg.head_dim, self.total, torch.float32, "cpu"
        )
        n_rows = len(seqs) + 3
        self.table = torch.full((n_rows, cfg.max_context), -1, dtype=torch.int32)
        self.rows = rng.sample(range(n_rows), len(seqs))
        self.slots: list[list[int]] = []
        for i, seq in enumerate(seqs):
            mine = perm[: len(seq)]
            perm = perm[len(seq) :]
            self.slots.append(mine)
            self.table[self.rows[i], : len(seq)] = torch.tensor(mine, dtype=torch.int32)
        self.logits: list[list[torch.Tensor]] = [[] for _ in seqs]
        offsets = [rng.randrange(3) for _ in seqs]
        n_blocks = [len(s) // block_size for s in seqs]
        for rnd in range(max(o + n for o, n in zip(offsets, n_blocks, strict=True))):
            active = [i for i in range(len(seqs)) if 0 <= rnd - offsets[i] < n_blocks[i]]
            if not active:
                continue
            idx = [rnd - offsets[i] for i in active]
            tokens = torch.stack(
                [
                    seqs[i][k * block_size : (k + 1) * block_size]
                    for i, k in zip(active, idx, strict=True)
                ]
            )
            starts = torch.tensor([k * block_size for k in idx])
            rows = torch.tensor([self.rows[i] for i in active])
            out = model.forward_blocks(tokens, starts, rows, self.kv, self.table)
            for j, i in enumerate(active):
                self.logits[i].append(out[j])


def check_against_dense(
    model: BlockDiffusionLM, seqs: list[torch.Tensor], block_size: int, seed: int
) -> None:
    run = PagedRun(model, seqs, block_size, seed)
    used: set[int] = set()
    for i, seq in enumerate(seqs):
        with torch.no_grad():
            dense = model.forward_dense(seq[None], block_size)[0]
        paged = torch.cat(run.logits[i])
        assert paged.shape == dense.shape
        diff = (paged - dense).abs().max().item()
        bound = max(TOL, REL_TOL * dense.abs().max().item())
        assert diff <= bound, f"row {i}: paged vs dense logits differ by {diff} > {bound}"
        slots = torch.tensor(run.slots[i])
        used.update(run.slots[i])
        for layer, (k, v) in enumerate(dense_kv(model, seq, block_size)):
            assert (run.kv.k[layer][slots] - k).abs().max().item() <= TOL, (
                f"row {i} layer {layer} K"
            )
            assert (run.kv.v[layer][slots] - v).abs().max().item() <= TOL, (
                f"row {i} layer {layer} V"
            )
    untouched = torch.tensor(sorted(set(range(run.total)) - used))
    for layer in range(model.config.n_layers):
        assert not run.kv.k[layer][untouched].any() and not run.kv.v[layer][untouched].any()


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_random_model_paged_matches_dense(block_size: int) -> None:
    model = small_model()
    gen = torch.Generator().manual_seed(block_size)
    lengths = [block_size * n for n in (1, 3, 4, 2)]
    seqs = [torch.randint(0, 49, (n,), generator=gen) for n in lengths]
    check_against_dense(model, seqs, block_size, seed=block_size)


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_shipped_model_paged_matches_dense(block_size: int) -> None:
    model, config = load_model()
    samples = make_samples(7, 4, "heldout")
    seqs = []
    for s in samples:
        ids = s.token_ids()
        ids = ids + [2] * (-len(ids) % block_size)
        seqs.append(torch.tensor(ids[: config.max_context]))
    check_against_dense(model, seqs, block_size, seed=100 + block_size)


def test_forward_blocks_is_deterministic() -> None:
    model = small_model(1)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 49, (24,), generator=gen) for _ in range(3)]
    a = PagedRun(model, seqs, 8, seed=5)
    b = PagedRun(model, seqs, 8, seed=5)
    for la, lb in zip(a.logits, b.logits, strict=True):
        assert torch.equal(torch.cat(la), torch.cat(lb))


def test_forward_blocks_rejects_inconsistent_inputs() -> None:
    model = small_model()
    cfg = model.config
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, 128, torch.float32, "cpu")
    table = torch.arange(64, dtype=torch.int32)[None]
    block = torch.zeros(1, 8, dtype=torch.long)
    row = torch.tensor([0])
    with pytest.raises(ForwardInputError, match="multiple of 8"):
        model.forward_blocks(block, torch.tensor([4]), row, kv, table)
    with pytest.raises(ForwardInputError, match="context limit"):
        model.forward_blocks(block, torch.tensor([64]), row, kv, table)
    with pytest.raises(ForwardInputError, match="rows"):
        model.forward_blocks(block, torch.tensor([0]), torch.tensor([1]), kv, table)
    with pytest.raises(ForwardInputError, match="empty batch"):
        model.forward_blocks(block[:0], torch.tensor([], dtype=torch.long), row[:0], kv, table)
    wrong = PagedKvCache(cfg.n_layers + 1, cfg.n_heads, cfg.head_dim, 128, torch.float32, "cpu")
    with pytest.raises(ForwardInputError, match="layers"):
        model.forward_blocks(block, torch.tensor([0]), row, wrong, table)


def test_block_causal_mask_semantics() -> None:
    mask = block_causal_mask(8, 4)
    for i in range(8):
        for j in range(8):
            assert bool(mask[i, j]) == (j // 4 <= i // 4)


def _decode_last_blocks(
    model: BlockDiffusionLM, seqs: list[torch.Tensor], chosen: list[int], block_size: int
) -> torch.Tensor:
    """Prefill every chosen sequence's earlier blocks alone, then run their last blocks in ONE
    forward_blocks batch; logits [len(chosen), B, V]."""
    cfg = model.config
    width = max(len(s) for s in seqs)
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, len(seqs) * width)
    # rows in reverse slot order, so a row's slots are not its index's
    table = torch.arange(len(seqs) * width, dtype=torch.int32).flip(0).view(len(seqs), width)
    for i in chosen:
        for start in range(0, len(seqs[i]) - block_size, block_size):
            block = seqs[i][start : start + block_size][None]
            model.forward_blocks(block, [start], [i], kv, table)
    last = torch.stack([seqs[i][-block_size:] for i in chosen])
    starts = [len(seqs[i]) - block_size for i in chosen]
    return model.forward_blocks(last, starts, chosen, kv, table)


# the shipped model's products (d_in 128 and 384, the stacked ones included) and wider ones,
# whose small-product kernel reaches further on some CPUs (gpu.gemm_rows)
@pytest.mark.parametrize(
    ("k", "n"), [(128, 49), (128, 128), (128, 384), (128, 768), (384, 128), (1024, 64)]
)
def test_a_products_rows_do_not_depend_on_how_many_rows_it_has(k: int, n: int) -> None:
    """Every row of a product padded as the serving path pads it on this CPU equals the same
    row of a wider one, bit for bit, for any row count up to 16 seats of block 8: what batch
    parity on this CPU rests on."""
    padding = padding_rows(((n, k),), "cpu")
    assert uneven_row_counts(n, k, 128, "cpu", padding) == ()


def test_without_the_padding_a_small_product_rounds_otherwise() -> None:
    """The control: unpadded, a one-row product takes another kernel (GEMV) on every CPU
    measured, and the check above sees it."""
    assert 1 in uneven_row_counts(384, 128, 128, "cpu", 1)


@pytest.mark.parametrize(
    ("model_name", "block_size"),
    [("small", 1), ("small", 2), ("small", 3), ("small", 4), ("small", 8), ("shipped", 4),
     ("shipped", 8)],
)  # fmt: skip
def test_rows_are_batch_invariant_bit_for_bit(model_name: str, block_size: int) -> None:
    """Ragged attention: a row's logits in a batch of mixed context lengths are byte-identical
    to the same row run alone (no padding, no other row's keys, GEMMs padded: gpu.gemm_rows), on
    a small random model and on the shipped one."""
    model = small_model(2) if model_name == "small" else load_model()[0]
    assert batch_dependent_rows(model, block_size) == []


def batch_dependent_rows(model: BlockDiffusionLM, block_size: int) -> list[str]:
    """The rows of a seeded batch of 7 mixed context lengths whose last block's logits differ
    from the same row run alone, each with its context and the largest difference."""
    gen = torch.Generator().manual_seed(block_size)
    blocks = [1, 3, 3, 2, 5, 1, 4]
    seqs = [torch.randint(0, 49, (n * block_size,), generator=gen) for n in blocks]
    together = _decode_last_blocks(model, seqs, list(range(len(seqs))), block_size)
    differing: list[str] = []
    for i in range(len(seqs)):
        alone = _decode_last_blocks(model, seqs, [i], block_size)[0]
        if not torch.equal(together[i], alone):
            gap = (together[i] - alone).abs().max().item()
            differing.append(f"row {i} (context {len(seqs[i])}): logits differ by {gap:.3g}")
    return differing


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data(), block_size=st.sampled_from([1, 4, 8]))
def test_plan_slots_read_by_slicing_equal_the_gather(data: st.DataObject, block_size: int) -> None:
    """The CPU plan's numpy slicing reads exactly the slots the device-agnostic gather (the
    CUDA path) reads: every row's block slots in batch order, then every context in order."""
    rows_total, width = 5, 6 * block_size
    table = torch.tensor(
        data.draw(st.lists(st.integers(0, 10_000), min_size=rows_total * width,
                           max_size=rows_total * width)),
        dtype=torch.int32,
    ).view(rows_total, width)  # fmt: skip
    b = data.draw(st.integers(1, rows_total))
    rows = data.draw(st.permutations(range(rows_total)))[:b]
    starts = [block_size * data.draw(st.integers(0, 5)) for _ in range(b)]
    order = sorted(range(b), key=starts.__getitem__)
    sliced = _slots_by_slicing(table, starts, rows, order, block_size)
    gathered = _slots_by_gather(table, starts, rows, order, block_size)
    assert sliced.dtype == gathered.dtype == torch.int64
    assert torch.equal(sliced, gathered)
    want = [table[r, s : s + block_size] for s, r in zip(starts, rows, strict=True)]
    want += [table[rows[i], : starts[i] + block_size] for i in order]
    assert torch.equal(sliced, torch.cat(want).long())


def test_plan_never_reaches_beyond_a_rows_context() -> None:
    """The packed context of each row is exactly its own table entries 0..start + B - 1."""
    model = small_model()
    table = torch.arange(4 * 32, dtype=torch.int32).view(4, 32)
    plan = model.plan_blocks([16, 0, 8], [2, 0, 3], 8, table)
    assert plan.groups == ((8, 1), (16, 1), (24, 1))
    want = torch.cat([table[0, :8], table[3, :16], table[2, :24]]).long()
    assert torch.equal(plan.ctx_slots, want)
    assert plan.order is not None and plan.order.tolist() == [1, 2, 0]
    assert plan.unorder is not None and plan.unorder.tolist() == [2, 0, 1]
