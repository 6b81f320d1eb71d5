"""`check-trace`'s header, `--config` and line rules, pinned by what the user sees.

- A header (or a `--config` for a log without one) gives every configuration field: a field
  left out is named, never filled in with a default that could change the verdict (a missing
  `eos_token_id` read as "no EOS" failed a correct log at its first EOS). A header that lacks
  fields may be completed by `--config`; where both give a field they must agree, and a
  disagreement names each field with both values.
- `"family": "dllm"` is a dLLM header (an AR log given to the dLLM `check_trace` is named
  one, pointing to `check_ar_trace`); a declared reservation is an integer within the pool.
- A line without `kind`, or with a key given twice, is an input error naming its line.
- `--twin` on a dLLM log cut inside a round compares the rounds the log completed.
- A `--twin` that is no AR twin is refused naming `--twin` and what is valid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.decisions import twin_difference
from properties.trace_check import check_trace
from reference.ar.vllm_v1 import VLLM_V1
from reference.dllm import REFERENCE_DLLM, REFERENCE_TWIN
from schedspec_cli.main import main
from spec.ar.config import ArConfig
from spec.ar.trace import ar_config_to_dict, missing_ar_config_fields
from spec.config import DllmConfig, Mode
from spec.events import ControlReturned, Event, Forward, StepResult
from spec.profile import DllmProfile
from spec.trace import (
    TraceFormatError,
    config_to_dict,
    duplicate_key,
    event_to_dict,
    iter_trace,
    missing_config_fields,
)
from tests.test_check_trace_profile import DLLM, _ar_events, _write_ar, record_dllm_run

EVENTS = record_dllm_run(REFERENCE_DLLM)
HEADER = config_to_dict(DLLM)
BODY = [json.dumps(event_to_dict(e)) for e in EVENTS]
VALID_KINDS = (
    "['aborted', 'admitted', 'block_committed', 'cache_evicted', 'cache_hit', 'cache_released', "
    "'control_returned', 'finished', 'forward', 'kv_allocated', 'kv_cached', 'kv_freed', "
    "'row_acquired', 'row_released', 'step_result', 'submitted']"
)


def _log(tmp_path: Path, header: dict[str, object] | None, body: list[str] = BODY) -> str:
    path = tmp_path / "log.jsonl"
    head = [json.dumps(header)] if header is not None else []
    path.write_text("\n".join([*head, *body]) + "\n", encoding="utf-8")
    return str(path)


def _config(tmp_path: Path, data: dict[str, object]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-trace", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _without(*names: str) -> dict[str, object]:
    return {k: v for k, v in HEADER.items() if k not in names}


# ------------------------------------------------------------------ every field, or named


def test_the_projects_own_writers_give_every_field() -> None:
    for config in (DLLM, DLLM.replace(prefix_cache=True), DllmConfig(mode=Mode.FDFO)):
        assert missing_config_fields(config_to_dict(config)) == []
    assert missing_ar_config_fields(ar_config_to_dict(ArConfig())) == []


@pytest.mark.parametrize(
    ("header", "missing"),
    [
        ({"kind": "config"}, [k for k in HEADER if k != "kind"]),
        (_without("block_size"), ["block_size"]),
        (_without("mode"), ["mode"]),
        (_without("eos_token_id"), ["eos_token_id"]),
    ],
)
def test_a_header_that_leaves_fields_out_is_refused_naming_them(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    header: dict[str, object],
    missing: list[str],
) -> None:
    log = _log(tmp_path, header)
    code, out, err = _cli(capsys, log)
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: {log}:1: the header lacks fields {missing} (every DllmConfig field "
        "but prefix_cache is required, none is filled in with a default): add them to the "
        "header, or pass --config with them\n"
    )
    with pytest.raises(TraceFormatError) as caught:  # the Python API likewise
        check_trace(Path(log).read_text().splitlines())
    assert caught.value.line_no == 1
    assert caught.value.detail == (
        f"the header lacks fields {missing}: give every configuration field (only "
        "['prefix_cache'] may be left out)"
    )


def test_a_log_with_an_eos_is_never_failed_by_a_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log of a run with an EOS id, its header without `eos_token_id`: it used to read as
    "no EOS" and fail `finish_condition` at the first EOS finish; now the header is refused,
    and `--config` may give the field."""
    config = DLLM.replace(eos_token_id=15)
    body = [json.dumps(event_to_dict(e)) for e in record_dllm_run(REFERENCE_DLLM, config)]
    assert any('"reason": "eos"' in line for line in body)
    header = {k: v for k, v in config_to_dict(config).items() if k != "eos_token_id"}
    log = _log(tmp_path, header, body)
    code, out, err = _cli(capsys, log)
    assert code == 2 and out == "" and "lacks fields ['eos_token_id']" in err, out + err
    code, out, err = _cli(capsys, log, "--config", _config(tmp_path, {"eos_token_id": 15}))
    assert code == 0 and out.startswith(f"OK {log}: ") and err == "", out + err


def test_a_config_for_a_log_without_a_header_gives_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, None)
    partial = _config(tmp_path, _without("kind", "mode"))
    code, out, err = _cli(capsys, log, "--config", partial)
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: invalid config='{partial}': a JSON object giving every DllmConfig "
        "field but prefix_cache (it lacks ['mode']): add them\n"
    )
    code, out, _ = _cli(capsys, log, "--config", _config(tmp_path, _without("kind")))
    assert code == 0, out


def test_a_partial_header_completed_by_config_must_still_agree_where_both_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, _without("mode"))
    both = _config(tmp_path, {"mode": "fdfo", "kv_pages": 21})
    code, out, err = _cli(capsys, log, "--config", both)
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: invalid config='{both}': a configuration that agrees with the "
        "trace's header (line 1), or no --config: they disagree on kv_pages (kv_pages is 20 in "
        "the header, 21 in --config)\n"
    )
    neither = _config(tmp_path, {"kv_pages": 20})
    code, out, err = _cli(capsys, log, "--config", neither)
    assert (code, out) == (2, "")
    assert err.startswith(
        f"schedspec: error: {log}:1: the header lacks fields ['mode'], nor does --config give "
        "them (every DllmConfig field but"
    ), err


def test_a_disagreement_names_each_field_and_both_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, HEADER)
    other = _config(tmp_path, {**_without("kind"), "kv_pages": 21, "eos_token_id": 3})
    code, out, err = _cli(capsys, log, "--config", other)
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: invalid config='{other}': a configuration that agrees with the "
        "trace's header (line 1), or no --config: they disagree on eos_token_id, kv_pages "
        "(eos_token_id is null in the header, 3 in --config; kv_pages is 20 in the header, 21 "
        "in --config)\n"
    )
    # a --config that gives some fields only is compared on those (none filled in)
    code, out, _ = _cli(capsys, log, "--config", _config(tmp_path, {"kv_pages": 20}))
    assert code == 0, out


def test_an_ar_header_gives_every_field_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = Path(_write_ar(tmp_path / "ar.jsonl", _ar_events(VLLM_V1))).read_text().splitlines()
    header = {k: v for k, v in json.loads(full[0]).items() if k != "num_blocks"}
    log = tmp_path / "partial.jsonl"
    log.write_text("\n".join([json.dumps(header), *full[1:]]) + "\n", encoding="utf-8")
    code, out, err = _cli(capsys, str(log))
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: {log}:1: the header lacks fields ['num_blocks'] (every ArConfig "
        "field but max_loras, num_drafting_slots, num_lookahead_tokens, num_speculative_tokens "
        "is "
        "required, none is filled in with a default): add them to the header, or pass --config "
        "with them\n"
    )
    blocks = _config(tmp_path, {"num_blocks": json.loads(full[0])["num_blocks"]})
    code, out, _ = _cli(capsys, str(log), "--config", blocks)
    assert code == 0 and "steps conform to the spec" in out, out


# ------------------------------------------------------------------ family, policy, lines


def test_a_header_may_name_the_dllm_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, {**HEADER, "family": "dllm"})
    code, out, err = _cli(capsys, log)
    assert code == 0 and err == "", err
    assert out == f"OK {log}: {len(EVENTS)} events, 24 rounds conform to the spec\n"
    code, out, err = _cli(capsys, _log(tmp_path, {**HEADER, "family": "xyz"}))
    assert code == 2 and err.endswith(":1: the header's family is 'xyz': dllm or ar\n"), err


def test_the_dllm_check_of_an_ar_log_points_to_check_ar_trace(tmp_path: Path) -> None:
    """`check_trace` on an AR log named its ArConfig's fields unknown ('unknown config fields
    ['enable_chunked_prefill', ...]'); it says the log is an AR log and what checks one."""
    log = _write_ar(tmp_path / "ar_log.jsonl", _ar_events(VLLM_V1))
    with pytest.raises(TraceFormatError) as err:
        check_trace(log)
    message = str(err.value)
    assert "this is an AR event log" in message, message
    assert "properties.ar.trace_check.check_ar_trace" in message, message
    assert "unknown config fields" not in message, message


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ({"reserved_kv_pages": 1e30}, "reserved_kv_pages=1e+30: must be an integer from 0 to "),
        ({"reserved_kv_pages": 10**30}, f"reserved_kv_pages={10**30}: must be an integer from "),
        ({"reserved_kv_pages": 21}, "reserved_kv_pages=21: must be an integer from 0 to "),
        ({"reserved_rows": 4}, "reserved_rows=4: must be an integer from 0 to req_pool_rows=3 "),
    ],
)
def test_a_declared_reservation_is_an_integer_within_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], declared: dict[str, object], says: str
) -> None:
    log = _log(tmp_path, {**HEADER, "declared_policy": declared})
    code, out, err = _cli(capsys, log)
    assert (code, out) == (2, ""), out
    assert err.startswith(f"schedspec: error: {log}:1: declared_policy.{says}"), err
    if "kv_pages" in says:
        assert err.endswith(
            "kv_pages=20 (the KV pages the engine keeps for itself, within its pool)\n"
        ), err


def test_a_reservation_within_the_pool_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, {**HEADER, "declared_policy": {"reserved_kv_pages": 20}})
    code, out, _ = _cli(capsys, log)
    assert code == 0 and "under the policy its header declares" in out, out


def test_a_line_without_a_kind_is_named_with_the_valid_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, HEADER, [BODY[0], '{"request_id": "r0"}', *BODY[1:]])
    code, out, err = _cli(capsys, log)
    assert (code, out) == (2, "")
    assert err == (
        f'schedspec: error: {log}:3: the line has no "kind" field; valid kinds: {VALID_KINDS}\n'
    )


def test_a_key_given_twice_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twice = BODY[0].replace('"request_id": "r0"', '"request_id": "rX", "request_id": "r0"')
    log = _log(tmp_path, HEADER, [twice, *BODY[1:]])
    code, out, err = _cli(capsys, log)
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: {log}:2: duplicate key 'request_id' in one JSON object: give each "
        "key once\n"
    )
    header = json.dumps(HEADER)[:-1] + ', "kv_pages": 4}'
    head = tmp_path / "head.jsonl"
    head.write_text("\n".join([header, *BODY]) + "\n", encoding="utf-8")
    code, out, err = _cli(capsys, str(head))
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: {head}:1: duplicate key 'kv_pages' in one JSON object: give each "
        "key once\n"
    )
    config = tmp_path / "twice.json"
    config.write_text('{"block_size": 2, "block_size": 4}', encoding="utf-8")
    code, out, err = _cli(capsys, _log(tmp_path, HEADER), "--config", str(config))
    assert (code, out) == (2, "")
    assert err == (
        f"schedspec: error: invalid config='{config}': JSON (duplicate key 'block_size' in one "
        "JSON object: give each key once)\n"
    )
    # in a forward's row too, from Python as well
    row = next(line for line in BODY if '"forward"' in line)
    doubled = row.replace('"masked": 0', '"masked": 0, "masked": 1', 1)
    with pytest.raises(TraceFormatError, match="line 2: duplicate key 'masked'"):
        list(iter_trace([json.dumps(HEADER), doubled]))


def test_a_conforming_log_is_parsed_once_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The duplicate-key check costs a count of ':' per line: no line of a recorded log (rows,
    header and its declared policy aside) is parsed a second time."""
    import spec.trace

    def never(pairs: object) -> object:
        raise AssertionError("a line was parsed a second time")

    monkeypatch.setattr(spec.trace, "_unique_pairs", never)
    assert all(duplicate_key(line, json.loads(line)) is None for line in BODY)
    assert check_trace([json.dumps(HEADER), *BODY]).ok


# ------------------------------------------------------------------ --twin


def _cut_at(events: list[Event], round_index: int, offset: int) -> list[Event]:
    """`events` cut `offset` events after the start of round `round_index` (inside it)."""
    ends = [i for i, e in enumerate(events) if isinstance(e, ControlReturned)]
    return events[: ends[round_index - 1] + 1 + offset]


def test_a_log_cut_inside_a_round_is_compared_up_to_its_last_complete_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ends = [i for i, e in enumerate(EVENTS) if isinstance(e, ControlReturned)]
    cuts = [EVENTS[:n] for n in range(ends[0] + 2, ends[3])]  # inside rounds 1 to 3
    cuts.append(EVENTS[:-1])  # idle, its last round's control_returned not written
    assert any(isinstance(c[-1], Forward | StepResult) for c in cuts)
    for cut in cuts:
        log = _log(tmp_path, HEADER, [json.dumps(event_to_dict(e)) for e in cut])
        code, out, err = _cli(capsys, log, "--twin", "reference-dllm")
        assert code == 0 and err == "", (len(cut), out, err)
        rounds = sum(isinstance(e, ControlReturned) for e in cut)
        assert out.endswith(
            f"OK {log}: its twin reference-dllm decides alike in all {rounds} rounds\n"
        ), (len(cut), out)
        # from Python: a log that stops with work running is not drained, nor its cut round
        if cut is not cuts[-1]:
            profile = DllmProfile()
            assert twin_difference(cut, DLLM, REFERENCE_TWIN, profile, drain=False) is None


def test_a_round_the_twin_decides_otherwise_still_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cutting the unfinished round does not hide a complete one that differs."""
    cut = _cut_at(EVENTS, 2, 3)
    log = _log(tmp_path, HEADER, [json.dumps(event_to_dict(e)) for e in cut])
    code, out, _ = _cli(capsys, log, "--twin", "sglang-dllm-order")
    assert code == 1 and "[twin_decisions] against sglang-dllm-order: round " in out, out


def test_a_twin_that_is_no_ar_factory_is_refused_naming_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_ar(tmp_path / "ar.jsonl", _ar_events(VLLM_V1))
    code, out, err = _cli(capsys, log, "--twin", "spec:DllmConfig")
    assert (code, out) == (2, "")
    assert err == (
        "schedspec: error: invalid --twin='spec:DllmConfig': an AR implementation "
        "(ArImplementation) or a factory (config, sink) -> AR adapter: DllmConfig is a class "
        "whose instances lack submit, abort, step, drain, snapshot\n"
    )
    code, out, err = _cli(capsys, log, "--twin", "reference.dllm:make_scheduler")
    assert (code, out) == (2, "")
    assert err == (
        "schedspec: error: invalid --twin='reference.dllm:make_scheduler': an AR implementation "
        "(ArImplementation) or a factory (config, sink) -> AR adapter: this factory takes a "
        "DllmConfig\n"
    )
