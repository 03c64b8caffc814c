"""Predicted against measured: ``grrm plan``'s pool model replays runs' traces, real Ray Serve runs them.

SIMULATED engine (scripted: a cold start, a fixed time per group, one group at a time per replica),
real Ray Serve, real HTTP through the client every trainer uses (RewardClient, with the demand
announcer the verl bridge and the TRL adapter use). For each pool, the same traces twice:

- **predicted**: :func:`cluster.planning.replay.replay` (what ``grrm plan`` computes for a candidate),
  fed the profile's seconds per group and cold start, with the very settings the deployed pool runs
  (``AutoscalingSettings.scaling_settings``; Serve's default policy by its model ``ServeDefault``);
- **measured**: the pool deployed as ``serve run deployments/grrm.yaml`` deploys it, each trace's
  members sent at its recorded times (each run a tenant), replicas sampled every 0.5 s.

A third column, **re-predicted**: the same replay fed this run's own measured seconds per group and
cold start: where the prediction missed and the re-prediction holds, the profile's inputs were wrong,
not the model.

Pools: ``fixed`` (max_replicas, always on), ``engine_work`` (the project's policy, min 1) and
``serve_default`` (Serve's policy at target 4 ongoing requests a replica). Reported per pool:
exposed reward per step (mean; ``docs/exposure.md``) and replica-seconds per run-step, predicted
and measured, their errors against the targets (replica-seconds within 15%; exposure within 20% or
0.5 s, whichever is larger), and what the model got wrong where it missed: the measured cold start,
engine seconds per group, peak replicas and per-replica share of groups beside the model's.

The profile: the scripted engine's seconds per group as configured, and the cold start measured
here first (``max_replicas - 1`` replicas deployed at once: from each actor's start to its serving), unless ``--profile`` gives a measured one
(``grrm profile``; ``--quick`` times the fixed pool's own start instead, ``max_replicas`` at once). The traces: synthetic (``--runs`` runs a given offset apart), or recorded ones
(``--trace FILE``, repeatable: runs that shared one pool; e.g. one the verl bridge wrote).

    .venv/bin/python -m bench.plan_check                # bench/results/plan_check.json, docs/plots/plan_check.png
    .venv/bin/python -m bench.plan_check --runs 2       # two runs sharing the pool (plan_check_2runs)
    .venv/bin/python -m bench.plan_check --quick        # 1 short step, fixed and engine_work (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.autoscale import Workload, app_config, held_and_serving, replica_counts, replica_states
from bench.common import local_serve, machine, print_table, plot_path, results_dir, write_json
from cluster.planning.pool_model import ServeDefault
from cluster.planning.recorder import one_per_run
from cluster.planning.replay import Replay, replay, runs_of
from cluster.planning.trace import RunTrace, synthetic_trace

POOLS = ("fixed", "engine_work", "serve_default_4")
SAMPLE_S = 0.5
# The targets: replica-seconds within 15%; mean exposure within 20% or 0.5 s, whichever is larger.
REPLICA_SECONDS_TOLERANCE = 0.15
EXPOSURE_TOLERANCE, EXPOSURE_FLOOR_S = 0.20, 0.5


@dataclass(frozen=True)
class Measured:
    """One pool's run on real Serve."""

    exposed_s_mean: float
    exposed_s_max: float
    replica_seconds_per_step: float
    peak_replicas: int
    members_lost: int
    seconds_per_group: float  # mean engine seconds of a group, from the replicas' own timings
    cold_start_s: float | None  # mean time from a replica asked for to its serving (None: none started)
    groups_per_replica: list[int]  # groups each replica scored (routing by group id spreads them)
    stopping_replica_seconds_per_step: float  # held by replicas Serve was stopping (draining)
    timeline: list[tuple[float, int, int]]  # (seconds after the first step's start, held, serving)


def traces_for(args: argparse.Namespace, load: Workload) -> list[RunTrace]:
    """The recorded traces given, else ``args.runs`` synthetic runs ``args.run_offset_s`` apart."""
    if args.trace:
        return one_per_run([RunTrace.model_validate_json(Path(path).read_text()) for path in args.trace])
    return [synthetic_trace(f"run-{index}", groups=load.groups, group_size=load.group_size,
                            generation_s=load.generation_s, training_s=load.training_s, steps=load.steps,
                            offset_s=index * args.run_offset_s, seed=index) for index in range(args.runs)]


def predict(pool: str, load: Workload, traces: list[RunTrace], seconds_per_group: float,
            cold_start_s: float) -> Replay:
    """What ``grrm plan`` predicts for the pool ``pool`` deploys (the same settings object the service runs)."""
    config = app_config(pool, load)
    autoscaling = config.replicas.autoscaling
    runs = runs_of(traces)
    if autoscaling is None:
        return replay(runs, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s,
                      replicas=config.replicas.num_replicas)
    if autoscaling.policy == "serve_default":
        model = ServeDefault(target=int(autoscaling.target_ongoing_requests), upscale_delay_s=autoscaling.upscale_delay_s,
                             downscale_delay_s=autoscaling.downscale_delay_s, look_back_s=autoscaling.look_back_period_s,
                             max_replicas=autoscaling.max_replicas)
        return replay(runs, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s,
                      replicas=max(autoscaling.min_replicas, 1), serve_default=model)
    settings = autoscaling.scaling_settings(config.tenants.default)
    return replay(runs, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s, settings=settings)


async def drive(url: str, serve, app: str, traces: list[RunTrace], lead_s: float = 1.0) -> Measured:
    """Send every trace's members at their recorded times (each run its own client and tenant, announcing
    its phases as the trainer adapters do) and sample the pool; the measured figures."""
    from cluster.protocol.schema import MemberRequest
    from grrm_client import ClientConfig, RewardClient
    from grrm_client.demand import DemandAnnouncer

    origin = min(trace.steps[0].start_s for trace in traces)
    end = max(trace.steps[-1].start_s + trace.steps[-1].generation_s + trace.steps[-1].training_s
              for trace in traces) - origin
    timeline: list[tuple[float, int, int]] = []
    stopping: list[int] = []
    t0 = time.monotonic() + lead_s
    done = asyncio.Event()

    async def sample() -> None:
        while True:
            states = await asyncio.to_thread(replica_states, serve, app)
            now = time.monotonic() - t0
            if now >= 0:
                timeline.append((now, *held_and_serving(states)))
                stopping.append(states.get("STOPPING", 0))
            if done.is_set() and now >= end:
                return
            await asyncio.sleep(SAMPLE_S)

    async def run(trace: RunTrace) -> tuple[list[float], int, list]:
        client = RewardClient(ClientConfig(transport="http", http_url=f"{url}/{app}", deadline_s=600,
                                           tenant=trace.run))
        announcer = DemandAnnouncer(client.announce_demand, len(trace.steps[0].groups), gap_s=10.0,
                                    tenant=trace.run, first_phase_s=trace.steps[0].generation_s)

        async def member(step: int, group: int, index: int, at: float, sent: list[float], answered: list[float]):
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            sent.append(time.monotonic())
            announcer.requested(sent[-1], group_size=trace.group_size)
            outcome = await client.score_member(MemberRequest(
                group_id=f"{trace.run}-s{step}g{group}", group_size=trace.group_size, index=index,
                source=f"{trace.run} step {step} prompt {group}.", candidate=f"rollout {index} [q={index % 5 + 1}]",
                src_lang="en", trg_lang="de"))
            answered.append(time.monotonic())
            return outcome

        try:
            calls, per_step = [], []
            for number, step in enumerate(trace.steps):
                sent, answered = [], []
                per_step.append((sent, answered))
                calls += [member(number, group, index, step.start_s - origin + at, sent, answered)
                          for group, arrivals in enumerate(step.groups) for index, at in enumerate(arrivals.members_at)]
            outcomes = await asyncio.gather(*calls)
        finally:
            announcer.close()
            await client.aclose()
        exposures = [max(answered) - max(sent) for sent, answered in per_step]
        lost = sum(1 for outcome in outcomes if outcome.result is None or not outcome.result.valid)
        return exposures, lost, [outcome.result for outcome in outcomes if outcome.result is not None]

    sampler = asyncio.create_task(sample())
    try:
        results = await asyncio.gather(*(run(trace) for trace in traces))
    finally:
        done.set()
    await sampler
    exposures = [value for exposed, _, _ in results for value in exposed]
    answers = [answer for _, _, answered in results for answer in answered]
    # Each sample holds until the next one (a sample takes time of its own: counting SAMPLE_S per sample
    # would undercount the run by that much).
    spans = [later[0] - point[0] for point, later in zip(timeline, timeline[1:])] + [SAMPLE_S]
    held = sum(span * point[1] for span, point in zip(spans, timeline))
    run_steps = sum(len(trace.steps) for trace in traces)
    return Measured(
        exposed_s_mean=statistics.mean(exposures), exposed_s_max=max(exposures),
        replica_seconds_per_step=held / run_steps,
        stopping_replica_seconds_per_step=sum(span * count for span, count in zip(spans, stopping)) / run_steps,
        peak_replicas=max(point[1] for point in timeline), members_lost=sum(lost for _, lost, _ in results),
        seconds_per_group=engine_seconds(answers), cold_start_s=starts(timeline),
        groups_per_replica=sorted(Counter(replica_of(answer) for answer in unique_groups(answers)).values(),
                                  reverse=True),
        timeline=timeline)


def unique_groups(answers: list) -> list:
    """One answer per scored group (each member's answer carries its group's; group ids name their run)."""
    seen: dict[str, object] = {}
    for answer in answers:
        seen.setdefault(answer.group_id, answer)
    return list(seen.values())


def replica_of(answer) -> str:
    return answer.replica or "?"


def engine_seconds(answers: list) -> float:
    """Engine seconds per group, by the replicas' own clocks: each replica's busy time (the union of its
    groups' scoring spans; a span also holds the wait at a busy engine) over the groups it scored."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for answer in unique_groups(answers):
        timing = answer.timing
        if timing is not None and timing.scoring_started_at and timing.scoring_ended_at:
            spans.setdefault(replica_of(answer), []).append((timing.scoring_started_at, timing.scoring_ended_at))
    busy, groups = 0.0, 0
    for intervals in spans.values():
        intervals.sort()
        groups += len(intervals)
        start, end = intervals[0]
        for begin, finish in intervals[1:]:
            if begin > end:
                busy, start = busy + end - start, begin
            end = max(end, finish)
        busy += end - start
    return busy / groups if groups else float("nan")


def starts(timeline: list[tuple[float, int, int]]) -> float | None:
    """Mean seconds from a replica counted as held (asked for) to its counting as serving, pairing each
    rise in held replicas with the next rise in serving ones (first in, first out)."""
    asked: list[float] = []
    spans = []
    for (_, held_before, serving_before), (at, held, serving) in zip(timeline, timeline[1:]):
        asked += [at] * max(0, held - held_before)
        for _ in range(max(0, serving - serving_before)):
            if asked:
                spans.append(at - asked.pop(0))
    return statistics.mean(spans) if spans else None


def exposure_ok(predicted: float, measured: float) -> bool:
    """Whether a mean exposure was predicted within 20% or 0.5 s, whichever is larger."""
    return abs(predicted - measured) <= max(EXPOSURE_TOLERANCE * measured, EXPOSURE_FLOOR_S)


def misses(predicted: Replay, measured: Measured, seconds_per_group: float, cold_start_s: float) -> list[str]:
    """Which of the model's parts measured otherwise: its inputs (seconds per group, cold start), its
    scaling (peak replicas), and its stops (the model frees a replica at once)."""
    found = []
    if abs(measured.seconds_per_group - seconds_per_group) > 0.15 * seconds_per_group:
        found.append(f"seconds per group: measured {measured.seconds_per_group:.2f}, model {seconds_per_group:.2f}")
    if measured.cold_start_s is not None and abs(measured.cold_start_s - cold_start_s) > max(0.25 * cold_start_s, 1.0):
        found.append(f"cold start: measured {measured.cold_start_s:.1f} s, model {cold_start_s:.1f} s")
    if measured.peak_replicas != predicted.peak_replicas:
        found.append(f"peak replicas: measured {measured.peak_replicas}, model {predicted.peak_replicas}")
    if measured.stopping_replica_seconds_per_step > 0.1 * measured.replica_seconds_per_step:
        found.append(f"stopping: replicas being stopped held {measured.stopping_replica_seconds_per_step:.1f} "
                     f"replica-s per step (the model frees a replica at once; Serve drains it first)")
    return found


def row(pool: str, predicted: Replay, repredicted: Replay, measured: Measured, seconds_per_group: float,
        cold_start_s: float) -> dict:
    """One pool's table row: predicted from the profile, re-predicted from this run's measured inputs (its
    seconds per group and cold start: whether the model holds once its inputs are right), measured, the
    errors, whether within target, and what the model missed."""
    figures: dict[str, object] = {"pool": pool}
    for label, prediction in (("predicted", predicted), ("repredicted", repredicted)):
        cost_error = prediction.replica_seconds_per_step / measured.replica_seconds_per_step - 1
        figures |= {f"exposed_s_{label}": prediction.exposed_s_mean,
                    f"replica_s_per_step_{label}": prediction.replica_seconds_per_step,
                    f"replica_s_error_{label}": cost_error,
                    f"ok_{label}": exposure_ok(prediction.exposed_s_mean, measured.exposed_s_mean)
                    and abs(cost_error) <= REPLICA_SECONDS_TOLERANCE}
    return {
        **figures,
        "exposed_s_measured": measured.exposed_s_mean,
        "replica_s_per_step_measured": measured.replica_seconds_per_step,
        "peak_predicted": predicted.peak_replicas,
        "peak_measured": measured.peak_replicas,
        "members_lost": measured.members_lost,
        "model_missed": "; ".join(misses(predicted, measured, seconds_per_group, cold_start_s)) or "-",
    }


def measured_inputs(measured: Measured, seconds_per_group: float, cold_start_s: float) -> tuple[float, float]:
    """This run's own seconds per group and cold start, where it measured them (else the profile's)."""
    own = measured.seconds_per_group
    return (own if math.isfinite(own) and own > 0 else seconds_per_group,
            measured.cold_start_s if measured.cold_start_s is not None else cold_start_s)


def plot(pairs: list[tuple[str, Replay, Measured]], path: Path, title: str) -> None:
    """Replicas over time, predicted against measured, a panel per pool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(pairs), 1, figsize=(8, 2.2 * len(pairs)), sharex=True, squeeze=False)
    for axis, (pool, predicted, measured) in zip(axes[:, 0], pairs):
        axis.step([t for t, _, _ in predicted.timeline], [held for _, held, _ in predicted.timeline], where="post",
                  label=f"predicted ({predicted.replica_seconds_per_step:.0f} replica-s/step, "
                        f"{predicted.exposed_s_mean:.1f} s exposed)")
        axis.step([t for t, _, _ in measured.timeline], [held for _, held, _ in measured.timeline], where="post",
                  label=f"measured ({measured.replica_seconds_per_step:.0f} replica-s/step, "
                        f"{measured.exposed_s_mean:.1f} s exposed)")
        axis.set_ylabel(pool, fontsize=8)
        axis.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds after the first step's start")
    axes[0, 0].set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def measure_cold_start(serve, load: Workload, app: str = "plan-check-cold-start", replicas: int | None = None,
                       keep: bool = False) -> float:
    """The profile's cold start, measured apart from the pools it predicts: ``max_replicas - 1`` replicas
    deployed at once (the step a policy takes from one replica to its most); the mean seconds from a
    replica's first sight (starting: Serve placed its actor) to its serving, sampled as a pool is.
    ``replicas``: that many instead; ``keep``: the application stays up (as ``app``)."""
    import threading

    from deployments.declared import deploy_declared

    config = app_config("fixed", load)
    starting = replicas or max(1, load.max_replicas - 1)
    pool = config.model_copy(update={"replicas": config.replicas.model_copy(update={"num_replicas": starting})})
    # Not a larger num_replicas on a running pool: it is the builder's argument, so Serve would replace
    # the running replicas too.
    deploying = threading.Thread(target=deploy_declared, args=(pool, app, f"/{app}"), daemon=True)
    began = time.monotonic()
    deploying.start()
    timeline = [(0.0, 0, 0)]
    while timeline[-1][2] < starting:
        time.sleep(0.1)
        timeline.append((time.monotonic() - began, *replica_counts(serve, app)))
    deploying.join()
    if not keep:
        serve.delete(app)
    return starts(timeline) or 0.0


def app_name(pool: str) -> str:
    return f"plan-check-{pool.replace('_', '-')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default=",".join(POOLS), help="comma-separated, of " + ", ".join(POOLS))
    parser.add_argument("--runs", type=int, default=1, help="synthetic runs sharing the pool")
    parser.add_argument("--run-offset-s", type=float, default=11.0, help="seconds between the synthetic runs' starts")
    parser.add_argument("--steps", type=int, default=Workload.steps)
    parser.add_argument("--trace", action="append", default=[], help="a recorded trace to replay (repeatable)")
    parser.add_argument("--profile", help="an engine profile (grrm profile's file): its seconds per group and "
                                          "cold start feed the model (default: the scripted engine's seconds per "
                                          "group, the cold start measured first with max_replicas - 1 "
                                          "replicas deployed at once)")
    parser.add_argument("--quick", action="store_true",
                        help="1 short step, fixed and engine_work (CI: that it runs, not how well it predicts)")
    parser.add_argument("--name", default=None, help="results file name (default plan_check[_<N>runs])")
    args = parser.parse_args(argv)
    load = Workload(steps=args.steps)
    pools = args.pools.split(",")
    if args.quick:
        # One short step: the replay and the measure run step by step alike (the full run measures how well);
        # replica starts are most of a quick run: 2 at most, each engine's in 0.5 s.
        load = Workload(steps=1, groups=8, generation_s=2.0, training_s=2.0, max_replicas=2, start_s=0.5)
        pools = ["fixed", "engine_work"]
    unknown = sorted(set(pools) - set(POOLS))
    if unknown:
        parser.error(f"--pools: {unknown[0]!r} is not one of {', '.join(POOLS)}")
    traces = traces_for(args, load)
    name = args.name or ("plan_check" if args.runs == 1 and not args.trace else
                         f"plan_check_{len(traces)}runs" if not args.trace else "plan_check_trace")
    seconds_per_group, cold_start_s = load.per_group_s, None
    source = "the scripted engine's per_prompt_s, and a cold start measured with max_replicas - 1 deployed at once"
    if args.profile:
        from cluster.planning.profile import EngineProfile, seconds_per_group as profile_seconds

        profile = EngineProfile.model_validate_json(Path(args.profile).read_text())
        seconds_per_group, cold_start_s, source = profile_seconds(profile), profile.cold_start_s, args.profile

    from ray import serve

    from deployments.declared import deploy_declared

    pairs, rows = [], []
    with local_serve() as url:
        started = None  # a pool already up: quick runs time the fixed pool's own start as the cold start
        if cold_start_s is None and args.quick and "fixed" in pools:
            started = "fixed"  # max_replicas at once, one more than the full run's measure; the pool stays up
            cold_start_s = measure_cold_start(serve, load, app_name(started), load.max_replicas, keep=True)
            source = "the scripted engine's per_prompt_s, and a cold start measured as the fixed pool started"
        elif cold_start_s is None:
            cold_start_s = measure_cold_start(serve, load)
        for pool in pools:
            app = app_name(pool)
            if pool != started:
                deploy_declared(app_config(pool, load), app, f"/{app}")
            measured = asyncio.run(drive(url, serve, app, traces))
            serve.delete(app)
            predicted = predict(pool, load, traces, seconds_per_group, cold_start_s)
            repredicted = predict(pool, load, traces, *measured_inputs(measured, seconds_per_group, cold_start_s))
            pairs.append((pool, predicted, measured))
            rows.append(row(pool, predicted, repredicted, measured, seconds_per_group, cold_start_s))
    print_table(rows, list(rows[0]))
    write_json(name, {"simulated_engine": True, "workload": load.__dict__, "runs": len(traces),
                      "traces": [trace.run for trace in traces], "recorded": bool(args.trace),
                      "profile": {"seconds_per_group": seconds_per_group, "cold_start_s": cold_start_s,
                                  "source": source},
                      "rows": rows,
                      "timelines": {pool: {"predicted": predicted.timeline, "measured": measured.timeline}
                                    for pool, predicted, measured in pairs}},
               {"machine": machine()})
    plot(pairs, plot_path(name),
         f"Replicas over time, grrm plan's prediction against real Serve ({len(traces)} run(s), scripted engine)")
    print(f"wrote {results_dir() / name}.json and {plot_path(name)}")
    return 0 if all(row["members_lost"] == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
