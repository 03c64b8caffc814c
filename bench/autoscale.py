"""Three ways to size the reward pool under GRPO-shaped load, side by side on real Ray Serve.

SIMULATED engine (scripted: a cold start, a fixed time per group, one generation at a time per
replica), real Ray Serve, real HTTP through the client every trainer uses (RewardClient). The load
is a GRPO run's: each step a generation phase in which rollouts finish at random times (each a
member of its prompt's group), then a quiet training phase. Three pools, one after the other:

1. ``fixed``: a pool sized for the peak (max_replicas, always on);
2. ``serve_default``: Serve's policy on ongoing requests, as grrm.yaml configured it before (target
   64 ongoing requests a replica; delays scaled to this run's time), and ``serve_default_<N>`` at
   target N: 16 (AutoscalingSettings' default), 4 and 1, which scale sooner, so expose less and cost
   more: where Serve's policy reaches the project's exposure, and at what cost;
3. ``engine_work``: the project's policy (cluster/autoscaling.py); the client announces its first
   step while the trainer starts, each step as its generation phase starts, and the next one ahead
   of it (a trainer knows when its next generation phase begins), each with the profile of when in
   the phase its groups complete (learned from the step before); ``engine_work_<N>`` the same with
   at most N replicas (2: about the exposure of Serve's policy at target 64, to compare costs at it);
   ``engine_work_min0[_<N>]`` with ``min_replicas`` 0: the pool empties while the trainer trains and
   starts again a cold start ahead of the next announced phase (the application-level policy hears
   the announcement through the ingress while no scorer replica runs).

Every pool is deployed as ``serve run deployments/grrm.yaml`` deploys it (``deployments/declared.py``).

Reported per pool: replica-seconds (replicas that hold their resources, starting, running or stopping,
integrated over the run; serving ones apart), exposed reward per
step (last reward minus last member sent, ``docs/exposure.md``), the peak replica count, and
members lost (must be 0); ratios against the fixed pool; a plot of replicas over time.

    .venv/bin/python -m bench.autoscale            # bench/results/autoscale.json, docs/plots/autoscale.png
    .venv/bin/python -m bench.autoscale --quick    # 1 short step (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass

from bench.common import local_serve, machine, print_table, plot_path, results_dir, write_json
from cluster.demand_forecast import PhaseForecaster, group_completion_profile
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import MemberRequest

POLICIES = ("fixed", "serve_default", "serve_default_16", "serve_default_4", "serve_default_1", "engine_work",
            "engine_work_2", "engine_work_min0", "engine_work_min0_2")
SERVE_DEFAULT_TARGET = 64  # ongoing requests a replica, as grrm.yaml had it


def engine_work_bounds(policy: str, load: Workload) -> tuple[int, int]:
    """The fewest and most replicas of ``engine_work[_min0][_<N>]``: ``min0`` lets the pool empty
    between steps (``min_replicas`` 0; else 1), ``N`` caps its peak (else the workload's max): a lower
    peak exposes more, for a comparison with Serve's policy at its exposure."""
    parts = policy.removeprefix("engine_work").split("_")[1:]
    empties = parts[:1] == ["min0"]
    peak = parts[1:] if empties else parts
    if len(peak) > 1 or (peak and not peak[0].isdigit()):
        raise ValueError(f"policy: {policy!r} is not engine_work[_min0][_<most replicas>]")
    return (0 if empties else 1), (int(peak[0]) if peak else load.max_replicas)


def serve_target(policy: str) -> int:
    """The target ongoing requests of ``serve_default`` (64) or ``serve_default_<N>`` (N)."""
    suffix = policy.removeprefix("serve_default").removeprefix("_")
    return int(suffix) if suffix else SERVE_DEFAULT_TARGET


@dataclass(frozen=True)
class Workload:
    steps: int = 4
    groups: int = 48  # prompts per step, one group each
    group_size: int = 4
    generation_s: float = 8.0  # rollouts finish within this
    training_s: float = 24.0  # then nothing comes for this long
    per_group_s: float = 0.4  # engine time per group, one at a time per replica
    start_s: float = 2.0  # a replica's engine start (its cold start, besides Serve's own)
    max_replicas: int = 4
    # The trainer starts (loads its policy, builds its workers) before its first step: the pools are
    # counted from then on, and a trainer that announces does so here.
    trainer_start_s: float = 8.0


def replica_states(serve, app: str) -> dict[str, int]:
    """Replicas of ``app``'s scorer deployment by state (STARTING, RUNNING, STOPPING, ...)."""
    status = serve.status().applications.get(app)
    if status is None or "GRRMReplica" not in status.deployments:
        return {}
    return {str(state).rsplit(".", 1)[-1]: count
            for state, count in status.deployments["GRRMReplica"].replica_states.items()}


def held_and_serving(states: dict[str, int]) -> tuple[int, int]:
    """(replicas that hold their resources: starting, running or stopping; replicas serving: running).
    A replica holds its GPU while its engine loads and while it drains, so both count as cost."""
    return sum(count for state, count in states.items() if state != "STOPPED"), states.get("RUNNING", 0)


def replica_counts(serve, app: str) -> tuple[int, int]:
    """:func:`held_and_serving` of ``app``'s scorer replicas now."""
    return held_and_serving(replica_states(serve, app))


def running_replicas(serve, app: str) -> int:
    """Replicas of ``app``'s scorer deployment that serve (running)."""
    return replica_counts(serve, app)[1]


def app_config(policy: str, load: Workload):
    from deployments.config import AppConfig, AutoscalingSettings, ReplicaSettings, TenantDefaults, TenantsSettings

    replicas: dict = {"num_cpus": 0.1, "gpus_per_rank": 0}
    common = dict(min_replicas=1, max_replicas=load.max_replicas, metrics_interval_s=0.5, look_back_period_s=2.0)
    if policy == "fixed":
        replicas["num_replicas"] = load.max_replicas
    elif policy.startswith("serve_default"):
        replicas["autoscaling"] = AutoscalingSettings(
            policy="serve_default", target_ongoing_requests=serve_target(policy), upscale_delay_s=2.0,
            downscale_delay_s=4.0, **common)
    else:
        lowest, most = engine_work_bounds(policy, load)
        replicas["autoscaling"] = AutoscalingSettings(
            policy="engine_work", upscale_delay_s=0.0, downscale_delay_s=4.0, idle_downscale_delay_s=1.0,
            target_backlog_s=2.0,
            cold_start_s=load.start_s + 4.0, default_seconds_per_group=load.per_group_s, demand_grace_s=2.0,
            **{**common, "min_replicas": lowest, "max_replicas": most})
    return AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(
            per_prompt_s=load.per_group_s, max_concurrent_prompts=1, start_s=load.start_s)),
        replicas=ReplicaSettings(**replicas),
        # One trainer announces: its announcements may claim the whole pool, as before the per-tenant cap.
        tenants=TenantsSettings(default=TenantDefaults(max_announced_replicas=load.max_replicas)),
        assembly_timeout_s=120,
    )


async def grpo_run(url: str, serve, app: str, policy: str, load: Workload, seed: int) -> dict:
    """One GRPO-shaped run against the pool; its replica-seconds, exposure per step and timeline."""
    from grrm_client import ClientConfig, RewardClient

    client = RewardClient(ClientConfig(transport="http", http_url=f"{url}/{app}", deadline_s=600, tenant="run-a"))
    rng = random.Random(seed)
    timeline: list[dict] = []
    started = time.monotonic()

    async def sample() -> None:
        while True:
            held, serving = await asyncio.to_thread(replica_counts, serve, app)
            timeline.append({"t_s": time.monotonic() - started, "replicas": held, "serving": serving})
            await asyncio.sleep(0.5)

    async def member(step: int, group: int, index: int, delay_s: float, sent: list[float]):
        await asyncio.sleep(delay_s)
        sent.append(time.monotonic())
        return await client.score_member(MemberRequest(
            group_id=f"s{step}g{group}", group_size=load.group_size, index=index, source=f"Step {step} prompt {group}.",
            candidate=f"rollout {index} [q={index + 2}]", src_lang="en", trg_lang="de"))

    announces = policy.startswith("engine_work")
    sampler = asyncio.create_task(sample())
    steps, lost = [], 0
    # When in a phase its groups come: as if rollouts finished evenly until a step was seen, then as in
    # the last step (grrm_client/demand.py's forecast does the same from the requests it sees).
    profile = PhaseForecaster(load.groups, group_size=load.group_size).profile()
    try:
        if announces:
            await client.announce_demand(groups=load.groups, lasts_s=load.generation_s,
                                         starts_in_s=load.trainer_start_s, profile=profile)
        await asyncio.sleep(load.trainer_start_s)
        for step in range(load.steps):
            if announces:
                await client.announce_demand(groups=load.groups, lasts_s=load.generation_s, profile=profile)
            opened = time.monotonic()
            sent: list[float] = []
            calls = [member(step, group, index, rng.uniform(0, load.generation_s), sent)
                     for group in range(load.groups) for index in range(load.group_size)]
            answered: list[float] = []

            async def timed(call):
                outcome = await call
                answered.append(time.monotonic())
                return outcome

            outcomes = await asyncio.gather(*(timed(call) for call in calls))
            lost += sum(1 for outcome in outcomes if outcome.result is None or not outcome.result.valid)
            steps.append({"step": step, "exposed_s": max(answered) - max(sent)})
            profile = group_completion_profile([at - opened for at in sent], load.generation_s, load.group_size)
            if announces and step + 1 < load.steps:
                # The trainer knows when its next generation phase starts: announced ahead of it.
                await client.announce_demand(groups=load.groups, lasts_s=load.generation_s,
                                             starts_in_s=load.training_s, profile=profile)
            await asyncio.sleep(load.training_s)
    finally:
        sampler.cancel()
        await client.aclose()
    # Replica-seconds: every replica that holds its resources (a starting replica loads its engine on its
    # GPU, a stopping one drains), as a GPU bill counts them; serving ones apart.
    replica_seconds = sum(0.5 * point["replicas"] for point in timeline)
    return {
        "policy": policy,
        "replica_seconds": replica_seconds,
        "serving_replica_seconds": sum(0.5 * point["serving"] for point in timeline),
        # What a pool of max_replicas would have cost over the same run.
        "peak_pool_replica_seconds": 0.5 * len(timeline) * load.max_replicas,
        "exposed_s_mean": statistics.mean(step["exposed_s"] for step in steps),
        "exposed_s_max": max(step["exposed_s"] for step in steps),
        "peak_replicas": max(point["replicas"] for point in timeline),
        "members_lost": lost,
        "steps": steps,
        "timeline": timeline,
    }


def plot(runs: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 3.6))
    for run in runs:
        axis.step([p["t_s"] for p in run["timeline"]], [p["replicas"] for p in run["timeline"]], where="post",
                  label=f"{run['policy']} ({run['replica_seconds']:.0f} replica-s)")
    axis.set_xlabel("seconds")
    axis.set_ylabel("replicas (starting, running, stopping)", fontsize=8)
    axis.set_title("Reward pool under GRPO steps: generation bursts, then training (simulated engine, real Serve)",
                   fontsize=9)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=Workload.steps)
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated, of " + ", ".join(POLICIES) + " (any serve_default_<target>, "
                             "engine_work_<most replicas>, engine_work_min0[_<most>]: min_replicas 0)")
    parser.add_argument("--quick", action="store_true",
                        help="1 short step, engine_work only (CI: that it runs, not what it measures)")
    parser.add_argument("--name", default="autoscale",
                        help="results file name (bench/results/<name>.json, docs/plots/<name>.png): a run of other policies beside "
                             "the default set's")
    args = parser.parse_args(argv)
    load = Workload(steps=args.steps)
    policies = args.policies.split(",")
    if args.quick:
        # Replica starts are most of a quick run: 2 at most, each engine's in 0.5 s.
        load = Workload(steps=1, groups=12, generation_s=2.0, training_s=3.0, trainer_start_s=2.0, max_replicas=2,
                        start_s=0.5)
        policies = ["engine_work"]

    from ray import serve

    from deployments.declared import deploy_declared

    runs = []
    with local_serve() as url:
        for policy in policies:
            app = f"autoscale-{policy.replace('_', '-')}"
            # As `serve run deployments/grrm.yaml` deploys: the project's policy at application level,
            # which hears announcements through the ingress while the scorer pool is empty.
            deploy_declared(app_config(policy, load), app, f"/{app}")
            runs.append(asyncio.run(grpo_run(url, serve, app, policy, load, seed=7)))
            serve.delete(app)
    fixed = next((run for run in runs if run["policy"] == "fixed"), None)
    rows = []
    for run in runs:
        row = {key: run[key] for key in ("policy", "replica_seconds", "serving_replica_seconds", "exposed_s_mean",
                                         "exposed_s_max", "peak_replicas", "members_lost")}
        if fixed is not None:
            row["replica_seconds_vs_fixed"] = fixed["replica_seconds"] / run["replica_seconds"]
            row["exposed_vs_fixed"] = run["exposed_s_mean"] / fixed["exposed_s_mean"]
        rows.append(row)
    print_table(rows, list(rows[0]))
    write_json(args.name, {"simulated": True, "workload": load.__dict__, "rows": rows, "runs": runs},
               {"machine": machine()})
    plot(runs, plot_path(args.name))
    print(f"wrote {results_dir() / args.name}.json and {plot_path(args.name)}")
    return 0 if all(run["members_lost"] == 0 for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
