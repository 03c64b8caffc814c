"""Helpers shared by the benchmarks: latency statistics, tables, JSON output, local Serve."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpu_harness.ray_head import free_port  # one implementation, importable wherever the project is installed

# GRRM_BENCH_RESULTS redirects output (CI runs every benchmark with --quick into a temp dir).
RESULTS = Path(os.environ.get("GRRM_BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(latencies_s: Sequence[float], wall_s: float) -> dict[str, float]:
    """Throughput and latency distribution of one run."""
    return {
        "groups_per_s": len(latencies_s) / wall_s if wall_s > 0 else float("nan"),
        "p50_ms": percentile(latencies_s, 50) * 1000,
        "p99_ms": percentile(latencies_s, 99) * 1000,
        "mean_ms": statistics.fmean(latencies_s) * 1000 if latencies_s else float("nan"),
    }


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A plain text table of the chosen columns."""
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(cell(row.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def write_json(name: str, rows: Any, meta: dict[str, Any] | None = None) -> Path:
    """Write rows to bench/results/<name>.json (a list of rows, as outside checks expect)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(rows, indent=2))
    if meta is not None:
        (RESULTS / f"{name}.meta.json").write_text(json.dumps(meta, indent=2))
    return path


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import os

    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
