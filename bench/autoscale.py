"""Autoscaling under a step load: 1 -> 4 replicas and back.

SIMULATED engine (scripted, realistic latency per request), real Ray Serve autoscaling with
fractional CPUs per replica. An open-loop load of --rate requests/s for --load-s seconds goes
through the handle API; afterwards the deployment should scale back down. Reported: time to the
first new replica serving, in-flight requests (queue depth at the caller) and replica count over
time (plot), requests dropped (must be 0), and time to scale back down.

    .venv/bin/python -m bench.autoscale        # bench/results/autoscale.json and .png
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.common import local_serve, machine, print_table, results_dir, write_json
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.schema import GroupRequest


def running_replicas(serve, app: str) -> int:
    status = serve.status().applications.get(app)
    if status is None:
        return 0
    deployment = status.deployments.get("GRRMReplica")
    return sum(count for state, count in deployment.replica_states.items() if str(state).endswith("RUNNING"))


async def step_load(client, serve, app: str, rate: float, load_s: float, settle_s: float):
    timeline: list[dict] = []
    in_flight = 0
    sent = answered = dropped = 0
    replicas_seen: dict[str, float] = {}
    started = time.monotonic()

    async def one(i: int):
        nonlocal in_flight, answered, dropped
        in_flight += 1
        try:
            group = GroupRequest(group_id=f"a{i}", source=f"Load sentence {i}.", candidates=[f"x{i} [q=3]", f"y{i} [q=7]"],
                                 src_lang="en", trg_lang="de")
            result = await client.score_group(group)
            answered += 1
            replicas_seen.setdefault(result.replica, time.monotonic() - started)
        except Exception:  # noqa: BLE001 - counted: a dropped request fails the benchmark
            dropped += 1
        finally:
            in_flight -= 1

    async def sampler():
        while True:
            timeline.append({"t_s": time.monotonic() - started, "in_flight": in_flight,
                             "replicas": running_replicas(serve, app)})
            await asyncio.sleep(0.5)

    sampling = asyncio.create_task(sampler())
    tasks = []
    while time.monotonic() - started < load_s:
        tasks.append(asyncio.create_task(one(sent)))
        sent += 1
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*tasks)
    load_end = time.monotonic() - started
    scaled_down_at = None
    while time.monotonic() - started < load_end + settle_s:
        await asyncio.sleep(1)
        if running_replicas(serve, app) == 1 and scaled_down_at is None:
            scaled_down_at = time.monotonic() - started
            break
    sampling.cancel()
    first = min(replicas_seen.values())
    new_replicas = sorted(t for t in replicas_seen.values() if t > first)
    return {
        "sent": sent, "answered": answered, "dropped": dropped,
        "max_replicas_seen_serving": len(replicas_seen),
        "first_new_replica_serving_s": new_replicas[0] if new_replicas else None,
        "load_end_s": load_end,
        "scaled_back_to_1_after_load_s": (scaled_down_at - load_end) if scaled_down_at else None,
        "peak_in_flight": max(p["in_flight"] for p in timeline),
    }, timeline


def plot(timeline: list[dict], summary: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.4))
    times = [p["t_s"] for p in timeline]
    axis.plot(times, [p["in_flight"] for p in timeline], label="in-flight requests (caller queue)")
    axis.set_xlabel("seconds since the load started")
    axis.set_ylabel("in-flight requests")
    axis.axvline(summary["load_end_s"], color="grey", linestyle=":", label="load ends")
    twin = axis.twinx()
    twin.step(times, [p["replicas"] for p in timeline], color="tab:red", where="post", label="running replicas")
    twin.set_ylabel("replicas")
    twin.set_ylim(0, 5)
    lines = axis.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    labels = axis.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
    axis.legend(lines, labels, fontsize=7, loc="upper right")
    axis.set_title("Step load, autoscaling 1 -> 4 (simulated engine, real Serve)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=30.0, help="requests per second during the step")
    parser.add_argument("--load-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=60.0, help="how long to wait for the scale-down")
    parser.add_argument("--per-request-s", type=float, default=0.25, help="scripted engine time per request")
    parser.add_argument("--quick", action="store_true", help="a 12 s step (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.load_s, args.settle_s = 12.0, 40.0

    from ray import serve

    from deployments.app import build_app
    from deployments.client import ScorerClient
    from deployments.config import AppConfig, AutoscalingSettings, ReplicaSettings

    with local_serve():
        config = AppConfig(
            engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=args.per_request_s, jitter=0.2)),
            replicas=ReplicaSettings(
                num_cpus=0.25, gpus_per_rank=0, max_ongoing_requests=4, max_queued_requests=-1,
                autoscaling=AutoscalingSettings(min_replicas=1, max_replicas=4, target_ongoing_requests=2,
                                                upscale_delay_s=2, downscale_delay_s=10, metrics_interval_s=0.5,
                                                look_back_period_s=2),
            ),
        )
        serve.run(build_app(config), name="autoscale", route_prefix="/autoscale")
        client = ScorerClient(serve.get_deployment_handle("GRRMReplica", app_name="autoscale"))
        summary, timeline = asyncio.run(step_load(client, serve, "autoscale", args.rate, args.load_s, args.settle_s))
    summary.update({"simulated": True, "rate": args.rate, "load_s": args.load_s, "per_request_s": args.per_request_s,
                    "capacity_per_replica_rps": 4 / args.per_request_s})
    print_table([summary], list(summary))
    write_json("autoscale", {**summary, "requests_dropped": summary["dropped"], "timeline": timeline},
               {"machine": machine()})
    plot(timeline, summary, results_dir() / "autoscale.png")
    print(f"wrote {results_dir() / 'autoscale.json'} and {results_dir() / 'autoscale.png'}")
    return 0 if summary["dropped"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
