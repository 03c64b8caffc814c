"""Helpers shared by the benchmarks: latency statistics, tables, JSON output, local Serve."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cpu_harness.ray_head import free_port  # one implementation, importable wherever the project is installed

# The committed full runs; GRRM_BENCH_RESULTS redirects output (the tests run every benchmark with
# --quick into a temp dir), read when a result is written.
COMMITTED_RESULTS = Path(__file__).resolve().parent / "results"


# The committed runs' plots are the benchmarks page's images (docs/benchmarks.md shows them).
COMMITTED_PLOTS = Path(__file__).resolve().parent.parent / "docs" / "plots"


def results_dir() -> Path:
    """Where results go now: ``$GRRM_BENCH_RESULTS``, else ``bench/results``."""
    return Path(os.environ.get("GRRM_BENCH_RESULTS", COMMITTED_RESULTS))


def plot_path(name: str) -> Path:
    """Where the plot ``name``.png goes now: beside the benchmarks' page (``docs/plots/``) for the
    committed results, else beside the results (``$GRRM_BENCH_RESULTS``)."""
    directory = COMMITTED_PLOTS if results_dir() == COMMITTED_RESULTS else results_dir()
    return directory / f"{name}.png"


@contextmanager
def local_serve(num_cpus: int = 4) -> Iterator[str]:
    """Ray and Serve on 127.0.0.1 for a benchmark; yields Serve's base URL.

    Started here and stopped at the end, unless this process already runs them (a test session's
    cluster): then those are used, and only the applications deployed meanwhile are deleted.
    """
    import ray
    from ray import serve

    if ray.is_initialized():
        from ray.serve.context import _get_global_client

        port = _get_global_client().http_config.port  # raises when this process's Ray runs no Serve
        before = set(serve.status().applications)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            for name in set(serve.status().applications) - before:
                serve.delete(name)
        return
    port = free_port()
    # A cluster of its own, not whatever Ray runs on the machine (ray.init without an address joins it).
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


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

    widths = [max([len(c), *(len(cell(r.get(c, ""))) for r in rows)]) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(cell(row.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def write_json(name: str, rows: Any, meta: dict[str, Any] | None = None) -> Path:
    """Write rows to bench/results/<name>.json (a list of rows, as outside checks expect)."""
    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps(rows, indent=2))
    if meta is not None:
        (results / f"{name}.meta.json").write_text(json.dumps(meta, indent=2))
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
