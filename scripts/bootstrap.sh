#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv on first use.
# torch is installed first, pinned to the CPU build this machine has locally, so no later
# dependency can pull a multi-GB CUDA wheel; every other package at the version constraints.txt
# pins, so a new release of a linter or a test tool cannot change what CI sees. Re-runs only
# when pyproject.toml or constraints.txt changes.
# Two commands started together (`./schedspec prove & ./run-tests`) set up once: the second
# waits on a lock and then finds the environment ready (two pip runs into one venv fail).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.schedspec-installed"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
ready() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
if ready; then
    exit 0
fi
mkdir -p "$venv"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$venv/.schedspec-setup.lock"
    flock 9
    if ready; then
        exit 0
    fi
fi
echo "schedspec: setting up $venv (first use; a few minutes)..." >&2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet -c "$root/constraints.txt" "torch==2.13.0" >&2
"$venv/bin/python" -m pip install --quiet -c "$root/constraints.txt" -e "$root[engine,plots,dev]" >&2
echo "$want" > "$stamp"
