#!/usr/bin/env bash
# Sets up .venv (from the lock; cached) and runs the tests.
#   bash scripts/test.sh            # everything, as CI runs it (two pytest processes side by side)
#   bash scripts/test.sh --quick    # what needs no Ray cluster and no engine (a minute or two)
#   bash scripts/test.sh tests/test_gqm.py -q    # any pytest arguments: just those tests, one process
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
pytest=(.venv/bin/python -m pytest -ra)
if [ "${1:-}" = "--quick" ]; then
  shift
  exec "${pytest[@]}" -m "not slow" "$@"  # `slow`: starts a real engine or a Ray cluster (pyproject.toml)
fi
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" --durations=25 "$@"
fi

# The whole suite as two shards at once. Most of its time is a chain of process start-ups (Ray
# workers, vLLM engines, verl's actors) that keeps one of the 2 cores busy (a full run measured 50-60%
# of the machine busy), so a second chain beside it fits:
#   session: the tests on the session's Ray cluster and Serve (tests/conftest.py);
#   own:     the quick tier, then the tests that start Ray clusters of their own (verl's trainings,
#            node faults, `grrm serve`; marker own_cluster).
# Each prints its lines with its name in front and its 25 slowest tests at its end; the run fails if
# either shard fails.
run_shard() {
  local name=$1 marks=$2
  set +e
  "${pytest[@]}" -v --durations=25 -m "$marks" 2>&1 | sed -u "s/^/[$name] /"
  local status=${PIPESTATUS[0]}
  set -e
  echo "[$name] pytest exit status $status"
  return "$status"
}
run_shard session "slow and not own_cluster" & session=$!
run_shard own "not slow or own_cluster" & own=$!
failed=0
wait "$session" || failed=1
wait "$own" || failed=1
if [ "$failed" != 0 ]; then
  echo "FAILED: a shard failed (its '[session]' or '[own]' lines above say which tests)" >&2
  exit 1
fi
echo "both shards passed"
