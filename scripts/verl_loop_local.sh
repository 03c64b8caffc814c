#!/usr/bin/env bash
# Sets up .venv, then runs the whole loop on this CPU: a Ray head of its own, the reward service
# (2 vLLM-CPU replicas of the tiny GRRM model), and 2 GRPO steps of verl's real trainer
# (python -m verl.trainer.main_ppo) on a tiny random policy; prints where every reward came from.
# Extra arguments go to `python -m cpu_harness` (--transport http, --steps N, --workdir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
exec .venv/bin/python -m cpu_harness "$@"
