#!/usr/bin/env bash
# Sets up .venv, then `grrm serve`: starts the reward service with its embedded default
# (deployments/local.yaml: CPU vLLM on a tiny local model, 2 replicas) on 127.0.0.1:8000, scores a
# demo group over HTTP, then keeps serving until Ctrl-C. Arguments go to `grrm serve`
# ([CONFIG] [--demo-only]; see `.venv/bin/grrm serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
exec .venv/bin/grrm serve "$@"
