#!/usr/bin/env bash
# Creates (or reuses) the project-local virtual environment .venv with everything the service and
# the tests need on a CPU machine, from the lock files (requirements/lock.txt, resolved with hashes;
# requirements/no-deps.lock.txt, installed without dependencies; `bash scripts/lock.sh` regenerates
# both). A second run is a no-op; a changed lock, pyproject.toml or set-up script rebuilds .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

# redis-server (a system package, in no wheel) backs GCS fault tolerance in the node-fault tests.
# apt runs in the background while the environment builds.
redis_job=
if ! command -v redis-server >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing redis-server from the system's packages" >&2
    ( apt-get install -y -q redis-server >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; } ) &
    redis_job=$!
  else
    echo "[setup] redis-server is missing and cannot be installed here: run 'apt-get install redis-server' as root" >&2
  fi
fi

digest=$(cat requirements/lock.txt requirements/no-deps.lock.txt pyproject.toml scripts/setup_env.sh scripts/uv.sh \
  | sha256sum | cut -c1-16)
stamp="$VENV/.installed-$digest"
if [ ! -f "$stamp" ]; then
  echo "[setup] building $VENV from the lock (uv; later runs reuse it)" >&2
  source scripts/uv.sh
  rm -rf "$VENV"  # a changed lock rebuilds from scratch: nothing left over from the last one
  "$UV" venv --quiet --python "$(command -v "$PY")" "$VENV"
  # Bytecode compiled now, as pip does: with PYTHONDONTWRITEBYTECODE set (as on this machine kind)
  # every process would otherwise compile torch, vLLM and verl again at each import.
  flags=(--quiet --compile-bytecode --python "$VENV/bin/python")
  # 1. Every locked package, hashes checked; torch is the CPU build (see scripts/uv.sh).
  "$UV" pip sync "${flags[@]}" --require-hashes "${TORCH_SOURCE[@]}" requirements/lock.txt
  # 2. vLLM's CPU build and verl, without their dependencies (why: requirements/no-deps.txt).
  "$UV" pip install "${flags[@]}" --require-hashes --no-deps -r requirements/no-deps.lock.txt
  # 3. The project itself, editable, so tests and `serve run` import the checkout.
  "$UV" pip install "${flags[@]}" --no-deps -e .
  # The wheel leaves out the test support (simulated/, cpu_harness/), tests/ and bench/: the checkout
  # on the path makes them importable in every process of this environment (Ray workers included,
  # whatever their working directory).
  pwd > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/grrm_checkout.pth"
  "$VENV/bin/python" -c "import torch, vllm, ray.serve, transformers, verl, hydra, transfer_queue" \
    || { echo "[setup] FAILED: the environment does not import" >&2; exit 1; }
  touch "$stamp"
  echo "[setup] $VENV ready" >&2
fi

if [ -n "$redis_job" ]; then
  wait "$redis_job" || { echo "[setup] FAILED: apt-get could not install redis-server" >&2; exit 1; }
fi
