"""`schedspec prove [--bound K] [--family NAME ...] [--json PATH]`: the Z3 proofs
(`properties.proofs`)."""

from __future__ import annotations

import argparse

from schedspec_cli.args import int_in
from schedspec_cli.loader import MissingDependency, module_available
from schedspec_cli.output import check_output_path, table, write_json
from schedspec_cli.progress import Progress

MAX_BOUND = 64
DEFAULT_BOUND = 6  # `properties.proofs.DEFAULT_BOUND`, known here without importing Z3
#: `properties.proofs.FAMILIES`' names, known here without importing Z3 (a test keeps them
#: equal).
FAMILY_NAMES = ("inductive", "bmc", "mutants", "theorems", "boundary")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add `prove`'s flags (`--json`, `--bound`) to `p`."""
    p.add_argument("--json", metavar="PATH", help="write every proof result as JSON here")
    p.add_argument(
        "--bound",
        type=int_in(1, MAX_BOUND),
        default=None,
        help=f"BMC depth in events and the policy theorems' bound (1..{MAX_BOUND}; default "
        f"{DEFAULT_BOUND}); the inductive proofs, the mutants' searches and the boundary "
        "workloads have sizes of their own",
    )
    p.add_argument(
        "--family",
        action="append",
        choices=FAMILY_NAMES,
        default=None,
        help="run only this family of proofs (repeatable; default all): inductive (the "
        "invariants and lemmas), bmc, mutants (each relaxed guard matters: Z3 finds a trace "
        "it allows and the spec refuses), theorems, boundary",
    )


def require_z3(command: str) -> None:
    """`MissingDependency` when the Z3 solver cannot be imported: it is a dependency of
    schedspec, so only an install that skipped dependencies (`pip install --no-deps`) lacks
    it."""
    if not module_available("z3"):
        raise MissingDependency(command, "the Z3 solver", "pip install z3-solver")


DETAIL_WIDTH = 70  # the table's detail column; the JSON has every detail whole


def _cut(detail: str) -> str:
    """`detail` for the table: whole when it fits, else cut with an ellipsis that says so."""
    return detail if len(detail) <= DETAIL_WIDTH else detail[: DETAIL_WIDTH - 1] + "…"


def run(args: argparse.Namespace) -> int:
    """`schedspec prove`: run every Z3 proof (or those of each `--family`) at `--bound`, print
    a table and write every result to `--json` when given. Returns 0 when all are proved, else
    1 (naming the others); an unwritable `--json` or a missing Z3 raises `ConfigError` (exit 2)
    first."""
    check_output_path("--json", args.json)
    require_z3("prove")
    from properties.proofs import run_all_proofs

    bar = Progress("prove")
    results = run_all_proofs(
        progress=bar.message() if bar.active else None, bound=args.bound, families=args.family
    )
    bar.done()
    rows = [(r.name, r.status, f"{r.seconds:.2f}", _cut(r.detail)) for r in results]
    print(table(("proof", "status", "seconds", "detail"), rows))
    if args.json is not None:
        from schedspec_cli import meta

        write_json(
            args.json,
            {
                "bound": DEFAULT_BOUND if args.bound is None else args.bound,
                "families": list(args.family or FAMILY_NAMES),
                "proofs": [r.to_json() for r in results],
                "run": meta.run_metadata(with_device=False),
            },
        )
    bad = [r.name for r in results if r.status != "proved"]
    if bad:
        print(f"not proved: {', '.join(bad)}")
    return 1 if bad else 0
