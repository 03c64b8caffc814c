#!/usr/bin/env bash
# Installs the GPU build of the reward service on an NVIDIA GPU node without Kubernetes: a virtual
# environment (default .venv-gpu) on Python 3.11 from the lock the service image installs
# (requirements/image-service.lock.txt: torch 2.13.0's CUDA 13 build, vLLM 0.32.0, Ray Serve 2.60.0;
# every package pinned and hash-checked, --no-deps, as docker/Dockerfile does), then the project
# (--no-deps), then `grrm check deployments/grrm.yaml` on this node. A CPU machine uses
# scripts/setup_env.sh instead (CPU torch, vLLM's CPU build, the test tools).
#
#   bash scripts/setup_gpu_env.sh                  # .venv-gpu
#   bash scripts/setup_gpu_env.sh --venv /opt/grrm # another place (or GRRM_GPU_VENV=...)
#   bash scripts/setup_gpu_env.sh --dry-run        # check the node, print the install commands, run none
#
# It refuses to start where `nvidia-smi` is missing or the NVIDIA driver is older than the branch the
# lock's CUDA needs (cluster/engines/versions.py: DRIVER_FLOORS, GPU_INSTALL_CUDA_MAJOR): under an older
# driver torch finds no GPU and vLLM fails minutes into its start. Python 3.11: python3.11, or PYTHON=...
# A second run reinstalls into the same environment (uv skips what is already there).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${GRRM_GPU_VENV:-.venv-gpu}
DRY_RUN=0
LOCK=requirements/image-service.lock.txt
while [ $# -gt 0 ]; do
  case $1 in
    --venv) VENV=${2:?--venv needs a directory}; shift ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "[setup-gpu] unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
refuse() { echo "[setup-gpu] REFUSED: $*" >&2; exit 1; }

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || refuse "no $PY here: the lock is resolved for Python 3.11 (the image's); install it, or set PYTHON to one"
version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$version" = 3.11 ] || refuse "$PY is Python $version: the lock is resolved for Python 3.11 (the image's); set PYTHON to a 3.11"

# The node: NVIDIA's driver answers, at the branch the lock's CUDA needs.
command -v nvidia-smi >/dev/null \
  || refuse "nvidia-smi is not on PATH: no NVIDIA driver here. This installs the CUDA build for a GPU node; on a CPU machine run scripts/setup_env.sh"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ') \
  || refuse "nvidia-smi fails here: repair the NVIDIA driver until nvidia-smi lists the GPUs"
[ -n "$driver" ] || refuse "nvidia-smi lists no GPU: nothing to install the CUDA build for"
# The floor, as grrm check judges it (read from the project's source: no environment exists yet).
floors=$("$PY" - <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("versions", "cluster/engines/versions.py")
versions = sys.modules["versions"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
spec.loader.exec_module(versions)
print(versions.GPU_INSTALL_CUDA_MAJOR, versions.DRIVER_FLOORS[versions.GPU_INSTALL_CUDA_MAJOR])
EOF
) || refuse "cannot read the driver floor from cluster/engines/versions.py (run from a checkout of the project)"
read -r cuda floor <<< "$floors"
branch=${driver%%.*}
[[ "$branch" =~ ^[0-9]+$ ]] || refuse "nvidia-smi reports driver '$driver', not a driver version"
if [ "$branch" -lt "$floor" ]; then
  refuse "NVIDIA driver $driver (R$branch) is older than R$floor, which $LOCK's CUDA $cuda build of torch needs: \
upgrade the node's driver to R$floor or later (no CUDA 12 variant of the lock is kept)"
fi
echo "[setup-gpu] NVIDIA driver $driver (R$branch; CUDA $cuda needs R$floor or later): installing into $VENV" >&2

source scripts/uv.sh  # $UV: a pinned uv (bootstrapped with pip into .cache/ where none is on PATH)
run() { echo "[setup-gpu] $*" >&2; [ "$DRY_RUN" = 1 ] || "$@"; }
flags=(--quiet --compile-bytecode --python "$VENV/bin/python")
run "$UV" venv --quiet --allow-existing --python "$(command -v "$PY")" "$VENV"
# Every package of the service image, hash-checked; --no-deps: the lock is the whole environment.
run "$UV" pip install "${flags[@]}" --require-hashes --no-deps -r "$LOCK"
# The project, editable (deployments/*.yaml and the docs' commands run from this checkout).
run "$UV" pip install "${flags[@]}" --no-deps -e .
if [ "$DRY_RUN" = 1 ]; then
  echo "[setup-gpu] dry run: the node was checked and the commands above were listed; none ran" >&2
  exit 0
fi
"$VENV/bin/python" -c "import torch, vllm, ray.serve, transformers, deployments.app" \
  || refuse "the environment does not import (see above)"
"$VENV/bin/python" -c "import torch; assert torch.cuda.is_available(), 'torch finds no CUDA device'" \
  || refuse "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') finds no CUDA device under driver $driver"
echo "[setup-gpu] $VENV ready: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')" >&2

# grrm check judges this node for the production config; its problems (the weights not downloaded yet,
# no API token) are for the next steps below, not a failed install.
echo "[setup-gpu] grrm check deployments/grrm.yaml:" >&2
checked=ok
"$VENV/bin/grrm" check deployments/grrm.yaml || checked=problems
cat >&2 <<EOF

[setup-gpu] next:
  source $VENV/bin/activate
  export HF_HOME=/shared/hf                   # the weights' cache (a shared or persistent path)
  hf download double7/Qwen2.5-7B-GRRM         # about 15 GB, once
  export VLLM_CACHE_ROOT=/shared/vllm-cache   # vLLM's compile cache: a warm one saves its compile at each start
  export GRRM_API_TOKEN=\$(openssl rand -hex 32)
  grrm check deployments/grrm.yaml && serve run deployments/grrm.yaml
  (docs/operations/gpu-nodes.md: Installing on a GPU node without Kubernetes)
EOF
[ "$checked" = ok ] || echo "[setup-gpu] grrm check named problems above: fix them before serve run" >&2
