"""Soak: mixed load for --minutes (default 10) on 2 replicas; RSS growth per replica and p99
latency drift, window by window. Not part of CI (it takes minutes).

Mixed load (closed loop): whole groups over HTTP, members over the handle API (shuffled, from
several tasks), and a trickle of bad requests that must be refused. The engine is scripted with a
realistic latency (SIMULATED); Serve, routing, assembly, HTTP and the ledger are real.

    .venv/bin/python -m bench.soak --minutes 10      # bench/results/soak.json, docs/plots/soak.png
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import httpx

from bench.common import local_serve, machine, percentile, print_table, plot_path, write_json
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import MemberRequest
from grrm_handles.send import to_replica


def make_group(i: int, size: int = 4) -> dict:
    return {"group_id": f"s{i}", "source": f"Soak sentence {i} " + "with some words " * (i % 7),
            "candidates": [f"Kandidat {i}-{k} [q={(i + k) % 11}]" for k in range(size)], "src_lang": "en", "trg_lang": "de"}


async def soak(url: str, handle, seconds: float, window_s: float):
    from deployments.client import ScorerClient

    client = ScorerClient(handle)
    windows: list[dict] = []
    latencies: list[float] = []
    counts = {"groups": 0, "members": 0, "bad_refused": 0, "errors": 0}
    started = time.monotonic()
    counter = iter(range(10**9))

    async def http_worker(http):
        while time.monotonic() - started < seconds:
            i = next(counter)
            t0 = time.monotonic()
            if i % 50 == 0:
                response = await http.post(f"{url}/v1/score", json={"groups": [{**make_group(i), "src_lang": "xx"}]})
                counts["bad_refused" if response.status_code == 422 else "errors"] += 1
                continue
            response = await http.post(f"{url}/v1/score", json={"groups": [make_group(i)]})
            if response.status_code == 200 and response.json()["results"][0]["valid"]:
                counts["groups"] += 1
                latencies.append(time.monotonic() - t0)
            else:
                counts["errors"] += 1

    async def member_worker():
        rng = random.Random(1)
        while time.monotonic() - started < seconds:
            i = next(counter)
            group = make_group(i)
            members = [MemberRequest(group_id=f"m{i}", group_size=4, index=k, source=group["source"], candidate=c,
                                     src_lang="en", trg_lang="de") for k, c in enumerate(group["candidates"])]
            rng.shuffle(members)
            t0 = time.monotonic()
            answers = await asyncio.gather(*(client.member_result(m) for m in members))
            if all(a.valid for a in answers):
                counts["members"] += len(answers)
                latencies.append(time.monotonic() - t0)
            else:
                counts["errors"] += 1

    async def sampler():
        names = None
        while time.monotonic() - started < seconds:
            await asyncio.sleep(window_s)
            window = list(latencies)
            latencies.clear()
            if names is None:
                import ray

                names = {a["name"].rsplit("#", 1)[-1] for a in ray.util.list_named_actors(all_namespaces=True)
                         if a.get("namespace") == "serve" and "soak#GRRMReplica" in a["name"]}
            infos = [await to_replica(handle, name).info.remote() for name in sorted(names)]
            windows.append({
                "t_s": round(time.monotonic() - started, 1),
                "completed": len(window),
                "p50_ms": percentile(window, 50) * 1000 if window else None,
                "p99_ms": percentile(window, 99) * 1000 if window else None,
                **{f"rss_mib_{info['replica']}": info["rss_bytes"] / 2**20 for info in infos},
            })
            print(windows[-1], flush=True)

    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(sampler(), *(http_worker(http) for _ in range(8)), *(member_worker() for _ in range(4)))
    return windows, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--window-s", type=float, default=30)
    parser.add_argument("--quick", action="store_true", help="3 s in 1 s windows (CI: that it runs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.window_s = 3 / 60, 1.0

    from ray import serve

    from deployments.app import build_app
    from deployments.config import AppConfig, ReplicaSettings

    with local_serve() as base_url:
        config = AppConfig(
            engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05, per_token_s=0.0005,
                                                                                jitter=0.3, analysis_words=64)),
            replicas=ReplicaSettings(num_replicas=2, num_cpus=0.5, gpus_per_rank=0),
        )
        serve.run(build_app(config), name="soak", route_prefix="/soak")
        handle = serve.get_deployment_handle("GRRMReplica", app_name="soak")
        windows, counts = asyncio.run(soak(f"{base_url}/soak", handle, args.minutes * 60, args.window_s))
    rss_keys = [k for k in windows[0] if k.startswith("rss_mib_")]
    first, last = windows[0], windows[-1]
    summary = {
        "minutes": args.minutes, "simulated_engine": True, **counts,
        "p99_first_window_ms": first["p99_ms"], "p99_last_window_ms": last["p99_ms"],
        "p99_drift_last_over_first": (last["p99_ms"] / first["p99_ms"]) if first["p99_ms"] else None,
        **{f"rss_growth_mib_{k[8:]}": last[k] - first[k] for k in rss_keys if k in last},
    }
    print_table([summary], list(summary))
    write_json("soak", {"summary": summary, "windows": windows}, {"machine": machine(), **vars(args)})

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.2))
    times = [w["t_s"] for w in windows]
    axis.plot(times, [w["p99_ms"] for w in windows], label="p99 ms")
    twin = axis.twinx()
    for key in rss_keys:
        twin.plot(times, [w.get(key) for w in windows], "--", label=key)
    axis.set_xlabel("seconds")
    axis.set_ylabel("p99 latency (ms)")
    twin.set_ylabel("replica RSS (MiB)")
    axis.legend(loc="upper left", fontsize=7)
    twin.legend(loc="lower right", fontsize=7)
    figure.tight_layout()
    figure.savefig(plot_path("soak"), dpi=110)
    return 0 if counts["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
