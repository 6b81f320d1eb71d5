"""dLLM FDFO vs sync throughput by max_running_requests, next to SGLang's figures.

.venv/bin/python scripts/repro_dllm.py [--steps 'F:COUNT,...']
"""

from __future__ import annotations

import sys

from schedspec_cli.simulate import simulate_main

if __name__ == "__main__":
    sys.exit(simulate_main(["dllm", "--requests", "128", "--gen-blocks", "16", *sys.argv[1:]]))
