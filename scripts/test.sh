#!/usr/bin/env bash
# Sets up .venv (from the lock; cached) and runs the tests.
#   bash scripts/test.sh            # everything, as CI runs it (three pytest processes side by side: see below)
#   bash scripts/test.sh --quick    # what needs no Ray cluster and no engine (about 4-6 minutes)
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

# The whole suite as three shards at once. Most of its time is a chain of process start-ups (Ray
# workers, vLLM engines, verl's actors) that keeps one of the 2 cores busy (a full run with two shards
# measured 50-60% of the machine busy), so chains beside it fit; what limits them is memory: the verl
# harness holds ~10.5 GiB (31 processes: its head, the reward app's 2 vLLM-CPU replicas, each
# training's actors) and the topology rehearsal up to ~8 GiB, so no other test's Ray cluster runs
# beside the trainings and the session's.
#   session:  the tests on the session's Ray cluster and Serve (tests/conftest.py), memory-heavy first;
#   clusters: the other tests with Ray clusters of their own (topology rehearsal, node faults, engine
#             orphans, `grrm serve`; marker own_cluster), from the start, beside the session's
#             memory-heavy tests and the quick tier;
#   own:      the quick tier, then, once the clusters shard is done, verl's six trainings (marker
#             verl_trainer), the longest chain. With two shards it ran quick tier, those tests and the
#             trainings in turn (CI: ~250 + 610-910 + 1,430-1,700 s); now the quick tier runs beside
#             those tests.
# Each prints its lines with its name in front and its 25 slowest tests at its end; the run fails if
# any shard fails. A failed shard's failures are printed again at the very end, since a shard that
# finished first has its summary far up the log (a CI page often shows only the log's tail).
logs=$(mktemp -d)
run_pytest() {  # name, marks: one pytest process, its lines prefixed; its exit status
  local name=$1 marks=$2
  set +e
  COLUMNS=200 "${pytest[@]}" -v --durations=25 -m "$marks" 2>&1 | sed -u "s/^/[$name] /" | tee -a "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  set -e
  echo "[$name] pytest exit status $status"
  return "$status"
}
run_shard() {  # name, marks: a shard of one pytest process; writes $logs/<name>.done when it ends
  local status=0
  run_pytest "$1" "$2" || status=$?
  touch "$logs/$1.done"
  return "$status"
}
run_own_shard() {  # the quick tier, then verl's trainings once the clusters shard is done
  local status=0
  run_pytest own "not slow" || status=1
  until [ -e "$logs/clusters.done" ]; do sleep 5; done
  # 5: no tests collected (pytest's code) is a failure here too: the trainings must run.
  run_pytest own "slow and own_cluster and verl_trainer" || status=1
  return "$status"
}
recap_failures() {
  local name=$1
  echo "==== [$name] failed; its failures again (assertion lines, then pytest's summary) ===="
  grep -E "^\[$name\] E  " "$logs/$name.log" | head -25 | cut -c1-300 || true
  sed -n "/^\[$name\] =* short test summary info/,\$p" "$logs/$name.log" |
    grep -vE "^\[$name\] SKIPPED" | head -15 | cut -c1-300 || true
}
# The marker expressions partition the suite: not slow | slow and not own_cluster | slow and own_cluster
# (and not) verl_trainer.
run_shard session "slow and not own_cluster" & session=$!
run_shard clusters "slow and own_cluster and not verl_trainer" & clusters=$!
run_own_shard & own=$!
failed=""
wait "$session" || failed="$failed session"
wait "$clusters" || failed="$failed clusters"
wait "$own" || failed="$failed own"
for name in $failed; do recap_failures "$name"; done
rm -rf "$logs"
if [ -n "$failed" ]; then
  echo "FAILED: shard(s)$failed failed (their '[name]' lines above say which tests)" >&2
  exit 1
fi
echo "all three shards passed"
