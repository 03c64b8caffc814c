#!/usr/bin/env bash
# Sets up .venv (from the lock; cached) and runs the tests.
#   bash scripts/test.sh            # everything, as CI runs it
#   bash scripts/test.sh --quick    # what needs no Ray cluster and no engine (a minute or two)
#   bash scripts/test.sh tests/test_gqm.py -q    # any pytest arguments: just those tests
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
pytest=(.venv/bin/python -m pytest -ra)
if [ "${1:-}" = "--quick" ]; then
  shift
  exec "${pytest[@]}" -m "not slow" "$@"  # `slow`: starts a real engine or a Ray cluster (pyproject.toml)
fi
# The slowest 25 at the end, so a CI log shows where its time (limit 90 min) goes.
exec "${pytest[@]}" --durations=25 "$@"
