#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv on first use.
# torch is installed first, pinned to the CPU build this machine has locally, so no later
# dependency can pull a multi-GB CUDA wheel. Re-runs only when pyproject.toml changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.schedspec-installed"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "schedspec: setting up $venv (first use; a few minutes)..." >&2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet "torch==2.13.0" >&2
"$venv/bin/python" -m pip install --quiet -e "$root[engine,plots,dev]" >&2
echo "$want" > "$stamp"
