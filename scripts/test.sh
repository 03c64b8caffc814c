#!/usr/bin/env bash
# Sets up .venv (from the lock; cached) and runs the tests.
#   bash scripts/test.sh            # everything, as CI runs it
#   bash scripts/test.sh --quick    # what needs no Ray cluster and no engine (minutes)
# Other arguments go to pytest, e.g. `bash scripts/test.sh tests/test_gqm.py -q`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
tier=(--durations=25)  # the slowest tests, so a CI log shows where its time (limit 90 min) goes
if [ "${1:-}" = "--quick" ]; then
  shift
  tier=(-m "not slow")  # `slow`: starts a real engine or a Ray cluster (pyproject.toml)
fi
exec .venv/bin/python -m pytest -ra "${tier[@]}" "$@"
