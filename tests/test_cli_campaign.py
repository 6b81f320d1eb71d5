"""Campaigns: `schedspec verify --keep-going` runs on after a failure and reports every distinct
rule violated, each once with its own shrunk counterexample, grouped by rule in the table, the
JSON and report.md; `--accept FILE` turns a rule into "accepted" (with its hit count). Either
way, the output says that a hit ends its example (what followed it went unchecked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.campaign import parse_accept_file
from schedspec_cli.main import main
from spec.errors import ConfigError

BROKEN = "tests.broken_adapters:make_three_bugs"


def test_a_campaign_reports_every_distinct_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "c.json", tmp_path / "report"
    argv = ["verify", "--impl", BROKEN, "--examples", "15", "--keep-going"]
    assert main([*argv, "--json", str(out), "--report", str(report)]) == 1
    table = capsys.readouterr().out
    data = json.loads(out.read_text())
    rules = data["rules"]
    assert len(rules) >= 2 and len(set(rules)) == len(rules), rules
    assert {"whole_block_rows", "free_owned_only"} <= set(rules), rules
    for f in data["failures"]:  # each its own counterexample, naming its own rule
        assert f["message"].startswith(f"[{f['rule']}]"), f["message"][:200]
        assert "state.configure(" in f["program"]
    assert ", ".join(rules) in table
    # what ignoring a found rule costs is said: its hits end their examples
    assert "each hit of a failure's rule once the campaign ignored it ended the example" in table
    assert "would have done next went unchecked" in table
    md = (report / "report.md").read_text()
    for rule in rules:
        assert f"## [{rule}]" in md
    assert json.loads((report / "report.json").read_text())["rules"] == rules


def test_accepted_deviations_are_reported_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accept = tmp_path / "accept.txt"
    accept.write_text("# known\nwhole_block_rows: our prefill feeds partial prompt blocks\n")
    out = tmp_path / "a.json"
    argv = ["verify", "--impl", BROKEN, "--examples", "15", "--accept", str(accept)]
    assert main([*argv, "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert "whole_block_rows" not in data["rules"] and data["rules"], data["rules"]
    (accepted,) = data["accepted"]
    assert accepted["rule"] == "whole_block_rows" and accepted["hits"] > 0
    assert accepted["source"] == str(accept)
    printed = capsys.readouterr().out
    assert "whole_block_rows (" in printed
    hits = accepted["hits"]
    assert f"{hits} hit{'' if hits == 1 else 's'} of an accepted rule ended the example" in printed


def test_a_plain_failing_run_ignores_nothing_and_says_nothing_of_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The control: without --keep-going or an accepted rule no example is cut short."""
    argv = ["verify", "--impl", "reference.seeded_bugs:no_free_on_finish", "--examples", "15"]
    assert main(argv) == 1
    assert "went unchecked" not in capsys.readouterr().out


def test_accept_files_json_and_text(tmp_path: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_text("\ufeffno_leak: the engine keeps a warm page\n\n# comment\n")
    (d,) = parse_accept_file(text, {"no_leak": ""})
    assert (d.rule, d.reason) == ("no_leak", "the engine keeps a warm page")
    js = tmp_path / "a.json"
    js.write_text(json.dumps({"deviations": [{"rule": "no_leak", "reason": "why"}]}))
    assert parse_accept_file(js, {"no_leak": ""})[0].reason == "why"
    bad = tmp_path / "bad.txt"
    bad.write_text("no_leak: fine\nnot a rule line\n")
    with pytest.raises(ConfigError, match=r"bad.txt:2"):
        parse_accept_file(bad)
