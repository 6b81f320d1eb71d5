"""`integrations.sglang.observer.SglangObserver` without SGLang: a forward batch a server padded
(only the batch's own rows are read; torch tensors stand in for the batch's ids), and which
requests and finishes are a sampled stop."""

from __future__ import annotations

import types

import pytest
import torch

from integrations.sglang.observer import SglangObserver, has_sampled_stop, stop_token_ids
from spec.config import DllmConfig, Mode
from spec.events import Event, FinishReason, Forward, ForwardRow, StepResult


def _req(rid: str) -> types.SimpleNamespace:
    kv = types.SimpleNamespace(req_pool_idx=None, kv_allocated_len=0)
    return types.SimpleNamespace(rid=rid, kv=kv, dllm_incomplete_ids=())


def _params(**given: object) -> types.SimpleNamespace:
    """SGLang's `SamplingParams` fields the observer reads, after `normalize`."""
    fields: dict[str, object] = {
        "max_new_tokens": 4,
        "stop_strs": [],
        "stop_regex_strs": [],
        "stop_token_ids": None,
        "json_schema": None,
        "regex": None,
        "ebnf": None,
        "structural_tag": None,
        "ignore_eos": False,
    }
    return types.SimpleNamespace(**{**fields, **given})


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
                sampling_params=_params(max_new_tokens=3),
                tokenizer=None,
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


EOS = 7
MASK = 99


@pytest.mark.parametrize(
    ("params", "sampled"),
    [
        (_params(), False),
        (_params(stop_token_ids={EOS, 5}), False),  # token ids: the spec evaluates them
        (_params(stop_strs=["ab"]), True),
        (_params(stop_regex_strs=["a+b"]), True),
        (_params(regex="[ab]+"), True),  # a grammar ends the request where it ends
        (_params(json_schema="{}"), True),
        (_params(stop_strs=["ab"], ignore_eos=True), True),  # ignore_eos keeps text stops
    ],
)
def test_a_request_has_a_sampled_stop_when_sglang_can_end_it_unseen(
    params: types.SimpleNamespace, sampled: bool
) -> None:
    req = types.SimpleNamespace(sampling_params=params, tokenizer=None, eos_token_ids=None)
    assert has_sampled_stop(req) is sampled


@pytest.mark.parametrize(
    ("params", "eos_ids", "tokenizer", "ids"),
    [
        (_params(), None, None, ()),
        (_params(stop_token_ids={EOS}), None, None, ()),  # the model's EOS: its own reason
        (_params(stop_token_ids={9, EOS, 5}), None, None, (5, 9)),
        (_params(), {EOS, 4}, None, (4,)),  # the model's other EOS ids (Llama 3 has two)
        (_params(), None, types.SimpleNamespace(eos_token_id=EOS), ()),
        (_params(), None, types.SimpleNamespace(eos_token_id=2), (2,)),
        (
            _params(stop_token_ids={6}),
            None,
            types.SimpleNamespace(eos_token_id=None, additional_stop_token_ids={3}),
            (3, 6),
        ),
        (_params(stop_token_ids={MASK, 5}), {EOS, MASK}, None, (5,)),  # never committed
    ],
)
def test_a_requests_stop_token_ids_are_every_id_sglang_matches_but_the_eos(
    params: types.SimpleNamespace, eos_ids: object, tokenizer: object, ids: tuple[int, ...]
) -> None:
    """What `Req._check_token_based_finish` matches, less the model's one EOS and the mask
    id, sorted."""
    req = types.SimpleNamespace(sampling_params=params, tokenizer=tokenizer, eos_token_ids=eos_ids)
    assert stop_token_ids(req, DllmConfig(eos_token_id=EOS, mask_token_id=MASK)) == ids


def test_sglangs_finish_reasons_as_the_specs() -> None:
    """A matched token is EOS only when it is the model's EOS; strings and regexes are STOP;
    an abort has no name (`Aborted` in a live log)."""
    config = DllmConfig(eos_token_id=EOS)
    observer = SglangObserver(config, lambda e: None, None, lambda req: str(req.rid))

    def finish(name: str, matched: object = None) -> object:
        return type(name, (), {"matched": matched})()

    assert observer._reason(finish("FINISH_LENGTH")) is FinishReason.LENGTH
    assert observer._reason(finish("FINISH_MATCHED_TOKEN", EOS)) is FinishReason.EOS
    assert observer._reason(finish("FINISH_MATCHED_TOKEN", 5)) is FinishReason.STOP
    assert observer._reason(finish("FINISH_MATCHED_STR", "ab")) is FinishReason.STOP
    assert observer._reason(finish("FINISHED_MATCHED_REGEX", "a+")) is FinishReason.STOP
    assert observer._reason(finish("FINISH_ABORT")) is None
