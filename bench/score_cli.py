"""``grrm score`` throughput: the command over HTTP (``--url``) versus the bare HTTP API at the same
concurrency, through a Serve handle (``--app``), and with Ray Data (``--ray``), on a local Serve app.

The bare HTTP client posts one group per request from groups already in memory (the serving
benchmark's closed loop); ``grrm score`` does the same posts plus reading the parquet input,
validating rows, journalling each result, writing parts and merging the output. Both are timed
end to end in this process (interpreter start-up excluded). ``--ray`` adds Ray Data's start-up
and its actor pool. The engine is scripted (simulated): `realistic` from bench/serving.py, so the
numbers measure the command, not a model.

    .venv/bin/python -m bench.score_cli            # writes bench/results/score_cli.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import local_serve, machine, print_table, write_json
from bench.serving import ENGINES, closed_loop, make_group

APP = "bench-cli"
QUICK_GROUPS = 16  # --quick's groups per run: two batches of work on every path (CI: that each path runs)


def write_input(path: Path, groups: int) -> Path:
    """The benchmark's groups as a parquet dataset (the groups the bare client sends too)."""
    pq.write_table(pa.Table.from_pylist([make_group(i).model_dump() for i in range(groups)]), path)
    return path


def bare_http(url: str, concurrency: int, groups: int) -> float:
    """Seconds for the bare HTTP API to score ``groups`` groups, ``concurrency`` requests in flight."""

    async def run() -> float:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:

            async def send(group):
                response = await http.post(f"{url}/v1/score", json={"groups": [group.model_dump()]})
                assert response.status_code == 200 and response.json()["results"][0]["valid"]

            _, wall = await closed_loop(send, concurrency, groups)
            return wall

    return asyncio.run(run())


def grrm_score(source: Path, work: Path, concurrency: int, *target: str) -> tuple[float, dict]:
    """Seconds for ``grrm score`` (the console script's main, in this process), and its summary."""
    from grrm_cli.main import main

    output = work / ("scored" if "--ray" in target else "scored.parquet")
    summary = work / "summary.json"
    started = time.perf_counter()
    status = main(["score", str(source), "-o", str(output), "--overwrite", "--no-progress", "--concurrency",
                   str(concurrency), "--summary-json", str(summary), *target])
    wall = time.perf_counter() - started
    assert status == 0, f"grrm score exited with {status}"
    result = json.loads(summary.read_text())
    assert result["valid"] == result["groups"], result
    return wall, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1500, help="groups per run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each path (interleaved); the mean is reported")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_GROUPS} groups, concurrency 8, one run (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.concurrency, args.repeats = QUICK_GROUPS, [8], 1

    from ray import serve

    from cluster.engines import EngineConfig
    from deployments.app import build_app
    from deployments.config import AppConfig, ReplicaSettings

    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ENGINES["realistic"]),
        replicas=ReplicaSettings(num_replicas=2, num_cpus=0.5, gpus_per_rank=0, max_ongoing_requests=256),
    )
    rows = []
    with local_serve() as base_url:
        serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
        url = f"{base_url}/{APP}"
        with tempfile.TemporaryDirectory(prefix="grrm-bench-cli-") as scratch:
            work = Path(scratch)
            source = write_input(work / "groups.parquet", args.groups)
            for concurrency in args.concurrency:
                walls: dict[str, list[float]] = {}
                for _ in range(args.repeats):
                    walls.setdefault("bare_http", []).append(bare_http(url, concurrency, args.groups))
                    walls.setdefault("grrm_score_url", []).append(grrm_score(source, work, concurrency, "--url", url)[0])
                    walls.setdefault("grrm_score_app", []).append(grrm_score(source, work, concurrency, "--app", APP)[0])
                    # Two Ray Data workers, each with half the groups in flight: the same concurrency in all.
                    walls.setdefault("grrm_score_ray", []).append(
                        grrm_score(source, work, max(1, concurrency // 2), "--ray", "--app", APP, "--batch-rows",
                                   "64", "--ray-workers", "2")[0]
                    )
                bare = args.groups / statistics.fmean(walls["bare_http"])
                for path, seconds in walls.items():
                    rate = args.groups / statistics.fmean(seconds)
                    rows.append({
                        "path": path, "concurrency": concurrency, "groups": args.groups, "runs": len(seconds),
                        "wall_s": statistics.fmean(seconds), "groups_per_s": rate, "vs_bare_http": rate / bare,
                        "simulated": True,
                    })
    print_table(rows, ["path", "concurrency", "groups", "runs", "wall_s", "groups_per_s", "vs_bare_http"])
    path = write_json("score_cli", rows, {"machine": machine(), "engine": ENGINES["realistic"].model_dump(),
                                          "replicas": 2})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
