"""`integrations.sglang.observer.SglangObserver` on a forward batch a server padded: only the
batch's own rows are read (no SGLang needed; torch tensors stand in for the batch's ids)."""

from __future__ import annotations

import types

import torch

from integrations.sglang.observer import SglangObserver
from spec.config import DllmConfig, Mode
from spec.events import Event, Forward, ForwardRow, StepResult


def _req(rid: str) -> types.SimpleNamespace:
    kv = types.SimpleNamespace(req_pool_idx=None, kv_allocated_len=0)
    return types.SimpleNamespace(rid=rid, kv=kv, dllm_incomplete_ids=())


def test_padding_rows_past_the_batch_are_no_requests_rows() -> None:
    config = DllmConfig(
        block_size=2, page_size=2, kv_pages=4, req_pool_rows=2, max_running_requests=2,
        max_context=8, mode=Mode.FDFO, in_place_reuse=True, mask_token_id=9,
    )  # fmt: skip
    scheduler = types.SimpleNamespace(
        token_to_kv_pool_allocator=types.SimpleNamespace(get_all_free_pages=lambda: None),
        req_to_token_pool=types.SimpleNamespace(req_to_token=torch.zeros(3, 8, dtype=torch.long)),
    )
    events: list[Event] = []
    observer = SglangObserver(config, events.append, scheduler, lambda req: str(req.rid))
    a, b = _req("a"), _req("b")
    for req in (a, b):
        observer.submitted(
            types.SimpleNamespace(
                rid=req.rid,
                origin_input_ids=[1],
                sampling_params=types.SimpleNamespace(max_new_tokens=3),
                kv=req.kv,
                dllm_incomplete_ids=(),
            )
        )
    batch = types.SimpleNamespace(reqs=[a, b], prefix_lens=[0, 2], extend_lens=[2, 2])
    observer.planned(batch)
    padded = torch.tensor([1, 9, 9, 9, 9, 9])  # rows a, b, then a padding row of masks
    observer.forward(types.SimpleNamespace(input_ids=padded))
    padded[1] = 4  # the step fills a's mask and one of b's
    padded[2] = 5
    observer.stepped(
        types.SimpleNamespace(input_ids=padded, dllm_prompt_mask=None), [False, False, False]
    )
    assert events[-3] == Forward((ForwardRow("a", 0, False, 2, 1), ForwardRow("b", 1, False, 2, 2)))
    assert events[-2:] == [StepResult("a", 0, 0, 0), StepResult("b", 1, 0, 1)]
