"""`schedspec verify` and `bench conformance` draw the same programs for the same command,
whatever constants the modules they load hold (`schedspec_cli.main.main` calls
`properties.profiles.draw_no_mined_constants` before any command runs).

Hypothesis mines constants from every loaded module outside `site-packages/` and draws them now
and then. Without the call, an adapter's own constants changed the programs a derandomized
`verify` drew (an implementer who edited a constant and re-ran to see a finding go saw other
programs), and so did the install: from a checkout every project module was mined, from the
installed wheel none, so `verify --impl vidur-orca --examples 100` ran 115 examples from a
checkout and 120 from the wheel (the wheel's side: `tests/test_install_wheel.py`). Mining
nothing, `verify` no longer leaves Hypothesis's cache of mined constants, a `.hypothesis/`
directory, where it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mined_constants import run_fresh
from tests.tier import full_tier

# argv: "mining" to undo the command line's call and the conformance machines' own stop for
# derandomized examples (the control) or "as-shipped", the adapter's directory, then the
# command line.
COMMAND = """
import sys
import properties.conformance_base as machines
import schedspec_cli.main as command_line

sys.path.insert(0, sys.argv[2])
if sys.argv[1] == "mining":
    command_line.draw_no_mined_constants = lambda: None
    machines.hold_no_mined_constants = lambda: (lambda: None)
sys.exit(command_line.main(sys.argv[3:]))
"""
COMMANDS = {"verify": ("verify",), "bench-conformance": ("bench", "conformance")}

# The same built-in, once plain and once beside every integer under 1,000: those in the range
# a strategy draws from that the loaded project modules lack change its pool of constants. (A
# sparser set can miss them all: 300 numbers 5, 8, 11, ... changed the programs with the
# commands' own modules loaded, and not once `bench conformance`'s was loaded too. Hypothesis
# skips a module of 1,024 constants or more.)
PLAIN = "from reference.ar.vidur import VIDUR_ORCA as ORCA\n"
WITH_CONSTANTS = PLAIN + f"NUMBERS = {tuple(range(1000))}\n"


def drawn(tmp_path: Path, command: str, mode: str, source: str, name: str) -> tuple[int, int, bool]:
    """(examples, steps, whether it left a `.hypothesis/` directory where it ran) of `COMMAND
    --impl NAME:ORCA --examples 100` in a fresh process, the adapter module `name` holding
    `source`."""
    adapters = tmp_path / "adapters"
    adapters.mkdir(exist_ok=True)
    (adapters / f"{name}.py").write_text(source, encoding="utf-8")
    out = tmp_path / f"{mode}-{name}.json"
    work = tmp_path / f"work-{mode}-{name}"
    argv = ("--impl", f"{name}:ORCA", "--examples", "100", "--json", str(out))
    run_fresh(COMMAND, work, mode, str(adapters), *COMMANDS[command], *argv)
    payload = json.loads(out.read_text(encoding="utf-8"))
    result = payload["rows"][0] if command == "bench-conformance" else payload
    assert result["passed"], result
    return result["examples"], result["steps"], (work / ".hypothesis").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_adapters_constants_do_not_change_the_programs_drawn(
    tmp_path: Path, command: str
) -> None:
    plain = drawn(tmp_path, command, "as-shipped", PLAIN, "plain_orca")
    assert drawn(tmp_path, command, "as-shipped", WITH_CONSTANTS, "const_orca") == plain
    # nothing mined, so nothing cached: no `.hypothesis/` left in the user's directory
    assert plain[2] is False


# a control (the call under test makes the difference): full tier, as tests/tier.py says
@full_tier
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_control_without_the_call_the_adapters_constants_reach_the_draws(
    tmp_path: Path, command: str
) -> None:
    plain = drawn(tmp_path, command, "mining", PLAIN, "plain_orca")
    with_constants = drawn(tmp_path, command, "mining", WITH_CONSTANTS, "const_orca")
    assert with_constants[:2] != plain[:2]
    assert plain[2] is True  # Hypothesis's cache of what it mined
