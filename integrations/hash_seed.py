"""One string-hash order for the engine check scripts, so that a command prints the same
figures on every run.

vLLM walks some sets of request ids (a step's finished sends, for one) in the order of
Python's string hashing, which is drawn per process unless `PYTHONHASHSEED` is set; blocks
are then freed in another order, and with a KV connector a count may differ by a few between
two runs of one command (the verdicts do not). `pin_hash_seed` runs the script again with
`PYTHONHASHSEED=0` where the variable is not set; any value the user sets (`random` included)
is kept.
"""

from __future__ import annotations

import os
import sys

#: The variable, and the value a script pins it to when it is not set.
HASH_SEED_VARIABLE = "PYTHONHASHSEED"
PINNED_HASH_SEED = "0"


def pin_hash_seed() -> None:
    """Replace this process by the same command with `PYTHONHASHSEED=0`, unless the variable
    is set (then return). For a script's `__main__` block, before anything runs: the process
    is replaced, not forked, so its exit status is the command's."""
    if os.environ.get(HASH_SEED_VARIABLE) is not None:
        return
    env = {**os.environ, HASH_SEED_VARIABLE: PINNED_HASH_SEED}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def hash_seed() -> str | None:
    """This process's `PYTHONHASHSEED` (None: drawn at start), for a figures file."""
    return os.environ.get(HASH_SEED_VARIABLE)


__all__ = ["HASH_SEED_VARIABLE", "PINNED_HASH_SEED", "hash_seed", "pin_hash_seed"]
