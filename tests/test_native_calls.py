"""An adapter's own transcript (`native_calls() -> str`, optional): a failing example prints
it after the spec's calls, under `NATIVE_NOTE`; an adapter whose transcript fails still has its
violation reported; an adapter without one prints the spec's calls alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from properties.conformance_base import CALLS_NOTE, NATIVE_NOTE
from reference.ar.seeded_bugs import DoubleFree
from schedspec_cli.main import main
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig


class Transcribed(DoubleFree):
    """The AR seeded double free, keeping a transcript of its own calls."""

    def __init__(self, config: ArConfig, sink: ArEventSink) -> None:
        super().__init__(config, sink)
        self.lines = [f"engine = Engine(blocks={config.num_blocks})"]

    def step(self) -> None:
        self.lines.append("engine.step()")
        super().step()

    def native_calls(self) -> str:
        return "\n".join(self.lines)


class BrokenTranscript(DoubleFree):
    def native_calls(self) -> str:
        raise RuntimeError("no transcript today")


def transcribed(config: ArConfig, sink: ArEventSink) -> Transcribed:
    return Transcribed(config, sink)


def broken(config: ArConfig, sink: ArEventSink) -> BrokenTranscript:
    return BrokenTranscript(config, sink)


def _verify(target: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["verify", "--impl", target, "--examples", "100"])
    return code, capsys.readouterr().out


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))


def test_the_transcript_follows_the_spec_calls(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(f"{__name__}:transcribed", capsys)
    assert code == 1 and "[free_owned_only]" in out, out[-2000:]
    assert out.index(CALLS_NOTE) < out.index(NATIVE_NOTE), out[-2000:]
    native = out.split(NATIVE_NOTE, 1)[1].strip().splitlines()
    assert native[0].startswith("engine = Engine(blocks=") and "engine.step()" in native


def test_a_failing_transcript_leaves_the_violation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(f"{__name__}:broken", capsys)
    assert code == 1 and "[free_owned_only]" in out and CALLS_NOTE in out, out[-2000:]
    assert NATIVE_NOTE not in out


def test_without_a_transcript_the_spec_calls_alone(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify("reference.ar.seeded_bugs:double_free", capsys)
    assert code == 1 and CALLS_NOTE in out and NATIVE_NOTE not in out
