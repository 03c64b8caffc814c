"""Serving overhead: what the cluster path (Serve handle, HTTP) costs over calling GroupScorer
in-process with the same engine, at concurrency 1, 16 and 128.

Engines are scripted (labelled simulated): `zero` answers instantly (pure overhead), `realistic`
takes per_prompt_s + per_token_s per answer like a small batching engine. One replica, so
in-process and cluster run the same amount of engine work.

    .venv/bin/python -m bench.serving            # writes bench/results/serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from bench.common import local_serve, machine, print_table, summarize, write_json
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions, make_engine
from cluster.protocol.schema import GroupRequest
from cluster.scorer import GroupScorer

ENGINES = {
    "zero": ScriptedEngineOptions(analysis_words=16),
    "realistic": ScriptedEngineOptions(analysis_words=64, per_prompt_s=0.02, per_token_s=0.0005, jitter=0.2, seed=1),
}


def make_group(i: int) -> GroupRequest:
    return GroupRequest(
        group_id=f"bench-{i}",
        source=f"Benchmark source sentence number {i}, long enough to look like a real one.",
        candidates=[f"Kandidat {i}-{k} [q={(i + k) % 11}]" for k in range(4)],
        src_lang="en",
        trg_lang="de",
    )


async def closed_loop(send, concurrency: int, total: int) -> tuple[list[float], float]:
    """`concurrency` workers each send requests back to back until `total` are done."""
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker():
        for i in counter:
            started = time.perf_counter()
            await send(make_group(i))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def requests_for(concurrency: int, scale: float) -> int:
    return max(int(60 * scale), int(4 * concurrency * scale))


async def run_in_process(options: ScriptedEngineOptions, concurrency: int, total: int):
    engine = make_engine(EngineConfig(kind="scripted", scripted=options))
    await engine.start()
    scorer = GroupScorer(engine, ScoringConfig())

    async def send(group):
        result = await scorer.score_group(group)
        assert result.valid

    return await closed_loop(send, concurrency, total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 16, few requests (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.scale = [1, 16], 0.25

    from ray import serve

    from deployments.app import build_app
    from deployments.client import ScorerClient
    from deployments.config import AppConfig, ReplicaSettings

    rows = []
    with local_serve() as base_url:
        for engine_name, options in ENGINES.items():
            config = AppConfig(
                engine=EngineConfig(kind="scripted", scripted=options),
                replicas=ReplicaSettings(num_replicas=1, num_cpus=1, gpus_per_rank=0, max_ongoing_requests=256),
            )
            serve.run(build_app(config), name="bench", route_prefix="/bench")
            client = ScorerClient(serve.get_deployment_handle("GRRMReplica", app_name="bench"))
            url = f"{base_url}/bench/v1/score"

            async def via_handle(group):
                assert (await client.group_result(group)).valid

            for concurrency in args.concurrency:
                total = requests_for(concurrency, args.scale)
                paths = {}
                paths["in_process"] = asyncio.run(run_in_process(options, concurrency, total))
                paths["handle"] = asyncio.run(closed_loop(via_handle, concurrency, total))

                async def via_http_run():
                    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
                    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
                        async def via_http(group):
                            response = await http.post(url, json={"groups": [group.model_dump()]})
                            assert response.status_code == 200 and response.json()["results"][0]["valid"]

                        return await closed_loop(via_http, concurrency, total)

                paths["http"] = asyncio.run(via_http_run())
                for path, (latencies, wall) in paths.items():
                    rows.append({
                        "path": path, "concurrency": concurrency, "engine": engine_name, "requests": total,
                        "simulated": True, **summarize(latencies, wall),
                    })
            serve.delete("bench")

    for row in rows:
        base = next(r for r in rows if r["engine"] == row["engine"] and r["concurrency"] == row["concurrency"]
                    and r["path"] == "in_process")
        row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"]
        row["throughput_vs_in_process"] = row["groups_per_s"] / base["groups_per_s"]
    print_table(rows, ["engine", "path", "concurrency", "requests", "groups_per_s", "p50_ms", "p99_ms",
                       "added_p50_ms", "throughput_vs_in_process"])
    path = write_json("serving", rows, {"machine": machine(), "engines": {k: v.model_dump() for k, v in ENGINES.items()}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
