"""A benchmark that starts a Ray cluster of its own, run from a test in a process of its own (the test
session's Ray would be in the way), leaving Ray's pointer to the latest local head as it found it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")


def run_bench(args: list[str], results: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """``python -m bench.<args>`` with results under ``results`` (``GRRM_BENCH_RESULTS``); its output captured."""
    before = CURRENT_CLUSTER.read_text() if CURRENT_CLUSTER.exists() else None
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "GRRM_BENCH_RESULTS": str(results)}
    try:
        return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    finally:
        # The bench's head wrote itself here (a bench that dies leaves it so); a later `serve run` or
        # ray.init() must not wait minutes for that dead head.
        if before is None:
            CURRENT_CLUSTER.unlink(missing_ok=True)
        else:
            CURRENT_CLUSTER.write_text(before)
