"""scripts/sglang_findings.py's command line without SGLang: a usage error is one line on stderr
(`sglang_findings.py: error: ...`, as its own errors) and exit 2, and `--help` still prints the
usage. What the findings do on SGLang: tests/test_sglang_findings.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.script_module import SCRIPTS, load_script

findings = load_script("sglang_findings")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--finding"], "argument --finding: expected one argument"),
        (["--list", "extra"], "unrecognized arguments: extra"),
        (["--finding", "nope"], "--finding: unknown ['nope']; one of ["),
    ],
)
def test_a_usage_error_is_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with one line, no usage block before it (found by a review: `--bogus` printed
    two lines, while `--finding nope` printed one)."""
    assert findings.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"sglang_findings.py: error: {said}"), err


def test_help_still_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as leaving:
        findings.main(["--help"])
    assert leaving.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: sglang_findings.py") and "--finding KEY" in out and err == ""


def test_the_command_line_says_a_usage_error_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "sglang_findings.py"), "--bogus"],
        capture_output=True,
        text=True,
        cwd=SCRIPTS.parent,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == "sglang_findings.py: error: unrecognized arguments: --bogus\n", done
