"""`schedspec_cli.args.given_dests`: which options a command line gives, as opposed to the
defaults argparse fills in. Commands use it to refuse a flag their run would ignore."""

from __future__ import annotations

import argparse

import pytest

from schedspec_cli.args import Parser, given_dests, refuse_ignored
from spec.errors import ConfigError


def _parser() -> Parser:
    p = Parser(prog="t")
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--names", nargs="+", default=["a"])
    p.add_argument("--mode", action="append")
    p.add_argument("--flag", action="store_true")
    p.add_argument("--label", default="x")
    return p


@pytest.mark.parametrize(
    ("argv", "given"),
    [
        ([], set()),
        (["--count", "5"], {"count"}),  # a default value given explicitly is given
        (["--count", "7", "--flag"], {"count", "flag"}),
        (["--names", "a", "b", "--mode", "s", "--mode", "f"], {"names", "mode"}),
        (["--lab", "y"], {"label"}),  # an abbreviation, as argparse accepts it
    ],
)
def test_given_dests_are_exactly_the_options_on_the_line(argv: list[str], given: set[str]) -> None:
    assert given_dests(_parser(), argv) == given


def test_given_dests_leaves_the_parsed_values_to_the_caller() -> None:
    p = _parser()
    given_dests(p, ["--flag"])
    ns = p.parse_args([])
    assert (ns.count, ns.names, ns.mode, ns.flag, ns.label) == (5, ["a"], None, False, "x")


def test_refuse_ignored_names_the_first_flag_and_every_flag_to_drop() -> None:
    ns = argparse.Namespace(max_running=[1, 4], device="cuda")
    refuse_ignored(ns, [], "never raised")  # nothing given, nothing refused
    with pytest.raises(ConfigError) as err:
        refuse_ignored(ns, ["max_running", "device"], "left out here")
    assert str(err.value) == (
        "invalid --max-running='1,4': left out here; drop --max-running, --device"
    )
