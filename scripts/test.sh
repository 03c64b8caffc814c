#!/usr/bin/env bash
# Sets up .venv (cached; first run a few minutes) and runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_gqm.py -q`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest -ra "$@"
