#!/usr/bin/env bash
# Sets up .venv (from the lock; cached) and runs the tests.
#   bash scripts/test.sh            # everything, as CI runs it (two pytest-xdist workers, see below)
#   bash scripts/test.sh --quick    # what needs no Ray cluster and no engine (a minute or two)
#   bash scripts/test.sh tests/test_gqm.py -q    # any pytest arguments: those tests, in one process
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
pytest=(.venv/bin/python -m pytest -ra)
if [ "${1:-}" = "--quick" ]; then
  shift
  exec "${pytest[@]}" -m "not slow" "$@"  # `slow`: starts a real engine or a Ray cluster (pyproject.toml)
fi
if [ $# -eq 0 ]; then
  # The whole suite: the tests on Ray heads of their own (verl's trainer, the node faults) in one
  # worker, the rest in the other (tests/conftest.py groups them); the slowest 25 at the end, so a
  # CI log shows where its time (limit 90 min) goes.
  exec "${pytest[@]}" -n 2 --dist loadgroup --durations=25
fi
exec "${pytest[@]}" "$@"
