"""One run of every Z3 proof per test process, shared by the modules that read it.

The proofs take about a minute; `test_z3_proofs` and the main job's test read the same run.
Both modules are in the xdist group `Z3_PROOFS_GROUP`, so under `--dist loadgroup` they run in
one worker and the run is solved once, not once per worker that happens to get one of them."""

from __future__ import annotations

import functools

from properties.proofs import ProofRun, run_proofs

Z3_PROOFS_GROUP = "z3-proofs"


@functools.cache
def default_proof_run() -> ProofRun:
    """Every proof at the default bound and timeout, as `schedspec prove` runs them."""
    return run_proofs()
