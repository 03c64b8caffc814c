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
# either shard fails. A failed shard's failures are printed again at the very end, since the shard
# that finished first has its summary far up the log (a CI page often shows only the log's tail).
logs=$(mktemp -d)
run_shard() {
  local name=$1 marks=$2
  set +e
  COLUMNS=200 "${pytest[@]}" -v --durations=25 -m "$marks" 2>&1 | sed -u "s/^/[$name] /" | tee "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  set -e
  echo "[$name] pytest exit status $status"
  return "$status"
}
recap_failures() {
  local name=$1
  echo "==== [$name] failed; its failures again (assertion lines, then pytest's summary) ===="
  grep -E "^\[$name\] E  " "$logs/$name.log" | head -25 | cut -c1-300 || true
  sed -n "/^\[$name\] =* short test summary info/,\$p" "$logs/$name.log" |
    grep -vE "^\[$name\] SKIPPED" | head -15 | cut -c1-300 || true
}
run_shard session "slow and not own_cluster" & session=$!
run_shard own "not slow or own_cluster" & own=$!
session_status=0 own_status=0
wait "$session" || session_status=1
wait "$own" || own_status=1
if [ "$own_status" != 0 ]; then recap_failures own; fi
if [ "$session_status" != 0 ]; then recap_failures session; fi
rm -rf "$logs"
if [ "$session_status$own_status" != 00 ]; then
  echo "FAILED: a shard failed (its '[session]' or '[own]' lines above say which tests)" >&2
  exit 1
fi
echo "both shards passed"
