"""The witnesses of SGLang's findings (`integrations.sglang.witness`) on the findings' own
programs: each sees its finding's mechanism where it acts and nothing where it does not, and
SGLang's adder is itself again afterwards, an exception inside included."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from integrations.sglang import REAL_SGLANG_DLLM_UNDER_PRESSURE
from integrations.sglang.witness import staged_block_cut, staged_without_a_row
from spec.errors import SpecViolation
from tests.test_real_sglang import FINDINGS, sglang_installed  # noqa: F401  (the fixture)

Witness = Callable[[], AbstractContextManager[list[str]]]


def _seen(witness: Witness, key: str) -> list[str]:
    """What `witness` notes while finding `key`'s program runs on SGLang as released."""
    finding = FINDINGS[key]
    with witness() as seen:
        violation, _ = finding.example().run(REAL_SGLANG_DLLM_UNDER_PRESSURE.factory)
    assert violation is not None and violation.rule == finding.rule, violation
    return seen


def test_a_refused_request_taken_without_a_row_is_seen() -> None:
    assert _seen(staged_without_a_row, "ragged-row") == [
        "PrefillAdder.add_dllm_staging_req took 'b' without a row (extending it by 5 tokens)"
    ]


def test_staging_requests_that_hold_their_rows_are_not_noted() -> None:
    """Every staged request of the truncation's program holds its row."""
    assert _seen(staged_without_a_row, "staging-truncation") == []


def test_a_cut_staged_block_is_seen() -> None:
    assert _seen(staged_block_cut, "staging-truncation") == [
        "PrefillAdder.add_dllm_staging_req cut the extend of 'r3' to 2 of 3 tokens (blocks of 3)"
    ]


def test_a_whole_or_uncut_extend_is_not_noted() -> None:
    """The ragged row's staged extend is longer than a block, but not cut: not this finding."""
    assert _seen(staged_block_cut, "ragged-row") == []


@pytest.mark.parametrize("witness", [staged_without_a_row, staged_block_cut])
def test_sglangs_adder_is_itself_again_after_an_error_inside(witness: Witness) -> None:
    from sglang.srt.managers.schedule_policy import PrefillAdder

    before = PrefillAdder.add_dllm_staging_req
    with pytest.raises(SpecViolation), witness():
        assert PrefillAdder.add_dllm_staging_req is not before
        raise SpecViolation("progress", "stop inside the witness")
    assert PrefillAdder.add_dllm_staging_req is before


def test_a_prompt_staged_a_whole_block_at_a_time_is_not_a_cut() -> None:
    """A prompt of three blocks enters one block a round through the staging path, each
    extend shorter than what it asks for (the rest of its fill ids) but whole blocks: not the
    truncation, and the run passes."""
    from properties.example import DllmExample
    from properties.operations import Drain, Submit
    from spec.config import DllmConfig, Mode, RequestSpec

    config = DllmConfig(
        block_size=2,
        page_size=2,
        kv_pages=16,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=12,
        mode=Mode.SYNC,
        in_place_reuse=False,
    )
    ops = (Submit(RequestSpec("a", (1, 2, 3, 4, 5, 6), 2)), Drain())
    example = DllmExample(config, REAL_SGLANG_DLLM_UNDER_PRESSURE.profile, ops)
    with staged_block_cut() as cut, staged_without_a_row() as rowless:
        violation, _ = example.run(REAL_SGLANG_DLLM_UNDER_PRESSURE.factory)
    assert violation is None
    assert cut == [] and rowless == []
