"""`schedspec list-impls`: every built-in implementation, readable in a terminal or as JSON.

Per built-in, one line with its name, family and engine status (whether the real engine it
drives is installed), then, indented, its description, its target (`module:attribute`, what
`--impl` resolves the name to) and its declared profile, wrapped to `WIDTH` columns: the
profiles of the real engines' built-ins run to a few hundred characters, which a one-line table
spread over as many columns. After them, the seeded bugs that ship with the package (the
reference schedulers with one bug planted each): their import strings, for `verify --impl`, and
the rule a run that catches each names. `--json PATH` writes the same fields, unwrapped, for a
machine.
"""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import asdict, dataclass

from reference.ar.seeded_bugs import AR_SEEDED_BUGS
from reference.seeded_bugs import SEEDED_BUGS, SeededBug
from schedspec_cli.output import check_output_path, table, write_json
from spec.errors import SchedSpecError

#: The columns the indented lines are wrapped to.
WIDTH = 100
INDENT = "    "


@dataclass(frozen=True, slots=True)
class BuiltinRow:
    """What `list-impls` says of one built-in."""

    name: str
    family: str
    engine: str  # "-" (no real engine), "installed", "not installed", ...
    description: str
    target: str
    profile: str  # the declared profile's summary, or "unavailable (why)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's flags."""
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write every built-in's name, family, engine status, description, target and "
        "profile as JSON here",
    )


def builtin_rows() -> list[BuiltinRow]:
    """Every built-in, in the registry's order. Loads no real engine and no torch: a torch
    engine's profile is the registry's copy, and an engine's profile that cannot be loaded reads
    `unavailable (why)`."""
    from schedspec_cli.impls import profile_summary, resolve
    from schedspec_cli.registry import BUILTINS, engine_status

    rows = []
    for b in BUILTINS.values():
        status = engine_status(b)
        if b.is_torch_engine:
            profile = b.torch_profile  # loading its implementation would import torch
        elif status == "adapter not in this build":
            profile = "-"
        else:
            try:
                profile = profile_summary(resolve(b.name).implementation)
            except SchedSpecError as err:
                profile = f"unavailable ({' '.join(str(err).split())})"
        rows.append(BuiltinRow(b.name, b.family.value, status, b.description, b.target, profile))
    return rows


def render(rows: list[BuiltinRow]) -> str:
    """The terminal listing: a header table of name, family and engine, each built-in's line
    followed by its indented description, target and profile (see the module docstring)."""
    head = table(("name", "family", "engine"), [(r.name, r.family, r.engine) for r in rows])
    header, rule, *lines = head.splitlines()
    out = [header, rule]
    for row, line in zip(rows, lines, strict=True):
        out.append(line)
        out.extend(_indented(row.description, ""))
        out.extend(_indented(row.target, "target: "))
        out.extend(_indented(row.profile, "profile: "))
    return "\n".join(out)


def render_seeded_bugs(bugs: tuple[SeededBug, ...]) -> str:
    """The seeded bugs' listing: a heading that says what they are for, then per bug its target
    and, indented, the rule `verify` names and what the bug is."""
    out = [
        "",
        "seeded bugs (each FAILS `verify --impl TARGET`, naming its rule; never serve with one):",
    ]
    for bug in bugs:
        out.append(INDENT + bug.target)
        out.extend(_indented(f"{bug.rule}: {bug.description}", INDENT))
    return "\n".join(out)


def _indented(text: str, label: str) -> list[str]:
    lead = INDENT + label
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=lead,
        subsequent_indent=INDENT + " " * len(label),
        break_on_hyphens=False,
    )


def run(args: argparse.Namespace) -> int:
    """Print the listing and the seeded bugs (and write `--json`, checked before anything is
    loaded). Returns 0."""
    check_output_path("--json", args.json)
    rows = builtin_rows()
    bugs = SEEDED_BUGS + AR_SEEDED_BUGS
    print(render(rows))
    print(render_seeded_bugs(bugs))
    write_json(
        args.json,
        {"builtins": [asdict(row) for row in rows], "seeded_bugs": [asdict(b) for b in bugs]},
    )
    return 0
