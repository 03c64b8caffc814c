# Sourced by scripts/setup_env.sh and scripts/lock.sh: puts a pinned uv in $UV (bootstrapped with
# pip into .cache/ where none is on PATH) and the flags that find the local CPU build of torch.
UV_VERSION=0.13.9
if command -v uv >/dev/null && [ "$(uv --version 2>/dev/null | cut -d' ' -f2)" = "$UV_VERSION" ]; then
  UV=uv
else
  UV=.cache/uv-$UV_VERSION/bin/uv
  if [ ! -x "$UV" ]; then
    echo "[setup] bootstrapping uv $UV_VERSION with pip" >&2
    "${PY:-python3}" -m pip install -qq --disable-pip-version-check --no-warn-script-location --root-user-action=ignore \
      --target ".cache/uv-$UV_VERSION" "uv==$UV_VERSION" >&2
  fi
fi
# torch's CPU build: the wheel this machine kind keeps on disk (uv does not read pip's config), or
# PyTorch's CPU index elsewhere. The lock pins its version and hash either way.
if [ -d /opt/wheels ] && ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  TORCH_SOURCE=(--find-links /opt/wheels)
else
  TORCH_SOURCE=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
