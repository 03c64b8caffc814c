"""SIMULATED: one elastic reward pool for several GRPO runs against a fixed pool per run, at scale.

A discrete-time simulation (no Ray, no engine) of GRRM replicas scoring the groups of 1 to 4
concurrent GRPO runs on up to 64 GPUs, with the project's autoscaling decision itself
(:func:`cluster.autoscaling.decide_replicas`, the function Serve's controller calls) deciding the
elastic pool's size every second. Each run repeats: a generation phase in which its groups
complete (a group is complete at its last rollout: the latest of n uniform finish times), then a
training phase with no rewards. Each run announces as its trainer's client does
(``grrm_client/demand.py``'s forecast, fed the run's rollout times): its first step while the trainer
starts, then each phase as it opens and the next one ahead, with the profile of when in the phase
its groups complete, learned from the phases before. A replica scores one group at a time.

Inputs and where they come from (all assumptions, stated so they can be changed):
- ``--seconds-per-group`` 1.5: engine seconds of one GRRM-7B group of 8 candidates on one GPU
  replica with its batch shared (about 1.5k answer tokens at ~1k tokens/s of the replica's share);
- ``--cold-start-s`` 90: a 7B vLLM replica's start (weights from local disk, CUDA graphs);
- ``--generation-s`` 120 / ``--training-s`` 240: a step of an MT policy that thinks for up to 8k
  tokens, trained on 64 prompts x 8 rollouts;
- the fixed pool of a run is sized for its own peak: the smallest whose exposure is within 5% of
  what the whole cluster's share (64 / runs replicas) would give that run.

Reported: replica-seconds of the elastic pool against the sum of the fixed pools, exposed reward
per step (last reward minus the step's last rollout) of both, and a plot of replicas over time
against the groups waiting.

``--idle sleep`` instead compares what becomes of a replica the elastic pool no longer needs
(``replicas.autoscaling.idle``): removed (``stop``, as above) or asleep (``sleep``: vLLM's sleep mode,
weights offloaded and KV cache freed; kept while the next announced need comes within the
break-even horizon, ``cluster/autoscaling.py``). Each replica's engine sleeps and wakes by
``cluster/engine_sleep.py``'s decision. Its further inputs (assumptions):
- ``--wake-s`` 10: a 7B model's weights back from pinned CPU memory (~15 GB at several GB/s over
  PCIe) plus a KV cache allocated again; vLLM's sleep-mode docs and blog report wake-ups from under
  a second (small models) to seconds. Not measured here (the sleep mode needs CUDA);
- ``--sleeping-cost`` 0.1: what a sleeping replica costs against an awake one (its GPU is held, its
  memory free for other work): a cost model, not a measurement;
- as in the service, a run's announcements reach one replica (its owner; here the replica at the run's
  index modulo the pool's size), which wakes ahead of the run's groups; the others wake for the groups
  queued for them, which wait for the wake-up.
It reports the replica-seconds each pool holds, the awake ones among them, the cost (awake +
sleeping_cost x asleep) and the exposure, and writes its own results file.

    .venv/bin/python -m bench.autoscaling_sim      # bench/results/autoscaling_sim.json and .png
    .venv/bin/python -m bench.autoscaling_sim --idle sleep   # bench/results/autoscaling_sim_sleep.json
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import heapq
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from bench.common import machine, print_table, results_dir, write_json
from cluster.autoscaling import Demand, ReplicaLoad, ScalingSettings, break_even_s, decide_replicas
from cluster.demand_forecast import PhaseForecaster
from cluster.engine_sleep import sleep_action

TICK_S = 1.0


@dataclass(frozen=True)
class ServeDefault:
    """A model of Ray Serve's default autoscaling policy (``replica_queue_length_autoscaling_policy``):
    as many replicas as the ongoing requests averaged over ``look_back_s``, divided by ``target``,
    applied once the wish has held for the up or down delay. Ongoing requests are every member
    sent and not yet answered, those waiting for group-mates included (what Serve counts)."""

    target: int = 64  # grrm.yaml before the project's policy
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 300.0
    look_back_s: float = 30.0
    max_replicas: int = 64

    def decide(self, now: float, current: int, ongoing: float, state: dict) -> int:
        history = state.setdefault("ongoing", deque())
        history.append((now, ongoing))
        while history[0][0] <= now - self.look_back_s:
            history.popleft()
        wished = max(1, min(self.max_replicas, math.ceil(statistics.mean(value for _, value in history) / self.target)))
        direction = (wished > current) - (wished < current)
        if direction != state.get("direction"):  # a new wish, or one the other way: its delay starts now
            state["direction"], state["since"] = direction, now
        delay = self.upscale_delay_s if direction > 0 else self.downscale_delay_s
        if direction == 0 or now - state["since"] < delay:
            return current
        state["direction"] = None  # applied: the next wish waits its whole delay
        return wished


@dataclass
class Run:
    """One GRPO run's schedule: when each step's groups complete."""

    name: str
    offset_s: float
    steps: int
    groups: int
    group_size: int
    generation_s: float
    training_s: float
    completions: list[list[float]] = field(default_factory=list)  # per step, group completion times
    rollouts: list[float] = field(default_factory=list)  # every rollout's finish time, in order
    # (announced at, what): the run's demand announcements, as its trainer's client makes them.
    announcements: list[tuple[float, Demand]] = field(default_factory=list)

    def build(self, rng: random.Random) -> Run:
        for step in range(self.steps):
            start = self.phase_start(step)
            finishes = [[start + self.generation_s * rng.random() for _ in range(self.group_size)]
                        for _ in range(self.groups)]
            self.completions.append(sorted(max(group) for group in finishes))
            self.rollouts.extend(finish for group in finishes for finish in group)
        self.rollouts.sort()
        self.announcements = self.announce()
        return self

    def announce(self) -> list[tuple[float, Demand]]:
        """What the client announces: the first step while the trainer starts (it knows its batch and
        phase length, not yet when in the phase the groups come: the prior), then, from the rollouts
        it sees, each phase as it opens and the next one ahead (grrm_client/demand.py's forecast)."""
        forecaster = PhaseForecaster(self.groups, gap_s=10.0, first_phase_s=self.generation_s, group_size=self.group_size)
        start = self.phase_start(0)
        announced = [(start - self.training_s,
                      Demand(self.name, self.groups, start, start + self.generation_s, start - self.training_s,
                             forecaster.profile()))]
        for finish in self.rollouts:
            forecast = forecaster.arrive(finish)
            if forecast is None:
                continue
            announced.append((finish, Demand(self.name, self.groups, finish, finish + forecast.lasts_s, finish,
                                             forecast.profile)))
            ahead = forecast.next_announcement()
            if ahead is not None:
                at, starts_in_s = finish + ahead[0], ahead[1]
                announced.append((at, Demand(self.name, self.groups, at + starts_in_s,
                                             at + starts_in_s + forecast.lasts_s, at, forecast.profile)))
        return sorted(announced, key=lambda pair: pair[0])

    def phase_start(self, step: int) -> float:
        return self.offset_s + step * (self.generation_s + self.training_s)

    def end_s(self) -> float:
        return self.phase_start(self.steps)


def simulate(runs: list[Run], replicas_of, seconds_per_group: float, cold_start_s: float,
             settings: ScalingSettings | None, serve_default: ServeDefault | None = None) -> dict:
    """Score every run's groups on pools: ``replicas_of`` maps a run to its pool's name; a pool with
    ``settings`` is elastic by the project's decision (every tick), one with ``serve_default`` by the
    model of Serve's default policy (from ``replicas_of``'s size up to its ``max_replicas``), else fixed
    at its starting size."""
    arrivals = sorted((time, run.name, step) for run in runs for step, times in enumerate(run.completions)
                      for time in times)
    pools: dict[str, dict] = {}
    for run in runs:
        name, size = replicas_of(run)
        pool = pools.setdefault(name, {"size": size, "starting": [], "free_at": [], "asleep": [], "busy_until": [],
                                       "queue": [], "answered": [], "answered_groups": 0,
                                       "state": {}, "replica_seconds": 0.0, "asleep_seconds": 0.0, "timeline": [],
                                       "runs": []})
        pool["runs"].append(run)
    for pool in pools.values():
        pool["free_at"] = [0.0] * pool["size"]  # the first replicas are up from the start
        pool["asleep"] = [False] * pool["size"]
        pool["busy_until"] = [0.0] * pool["size"]  # when each replica last finished work (idle since)
    last_scored: dict[tuple[str, int], float] = {}
    horizon = max(run.end_s() for run in runs) + 600
    index, now = 0, 0.0
    pool_of = {run.name: replicas_of(run)[0] for run in runs}
    while now < horizon:
        while index < len(arrivals) and arrivals[index][0] <= now:
            _, run_name, step = arrivals[index]
            heapq.heappush(pools[pool_of[run_name]]["queue"], (arrivals[index][0], run_name, step))
            index += 1
        for pool in pools.values():
            started = [ready for ready in pool["starting"] if ready <= now]
            pool["free_at"].extend(started)
            pool["asleep"].extend([False] * len(started))
            pool["busy_until"].extend(started)
            pool["starting"] = [ready for ready in pool["starting"] if ready > now]
            sleeps = settings is not None and settings.idle == "sleep"
            if sleeps:
                wake(pool, now, settings, pool["runs"])
            # Serve each free (awake) replica's next group within this tick.
            for slot, free in enumerate(pool["free_at"]):
                if pool["asleep"][slot]:
                    continue
                free = max(free, now)
                while pool["queue"] and free < now + TICK_S:
                    _, run_name, step = heapq.heappop(pool["queue"])
                    free += seconds_per_group
                    heapq.heappush(pool["answered"], free)
                    last_scored[(run_name, step)] = max(last_scored.get((run_name, step), 0.0), free)
                    pool["busy_until"][slot] = free
                pool["free_at"][slot] = free
            if sleeps:
                fall_asleep(pool, now, settings, pool["runs"])
            running = len(pool["free_at"]) + len(pool["starting"])
            pool["replica_seconds"] += running * TICK_S
            pool["asleep_seconds"] += sum(pool["asleep"]) * TICK_S
            pool["timeline"].append((now, running, len(pool["queue"])))
            if settings is not None:
                busy = sum(1 for free in pool["free_at"] if free > now)
                load = ReplicaLoad(groups_waiting=len(pool["queue"]), groups_running=busy,
                                   queued_work_s=(len(pool["queue"]) + busy) * seconds_per_group,
                                   members_waiting=members_waiting(pool["runs"], now),
                                   seconds_per_group=seconds_per_group)
                decision = decide_replicas(now=now, current=running, loads=[load], demands=demands(pool["runs"], now),
                                           settings=settings, state=pool["state"], serving=len(pool["free_at"]))
                pool["state"] = decision.state
                resize(pool, decision.replicas, now, cold_start_s)
            elif serve_default is not None:
                while pool["answered"] and pool["answered"][0] <= now:
                    heapq.heappop(pool["answered"])
                    pool["answered_groups"] += 1
                ongoing = rollouts_arrived(pool["runs"], now) - pool["answered_groups"] * pool["runs"][0].group_size
                resize(pool, serve_default.decide(now, running, ongoing, pool["state"]), now,
                       cold_start_s)
        now += TICK_S
        if index >= len(arrivals) and all(not pool["queue"] for pool in pools.values()) and now > max(
                run.end_s() for run in runs):
            break
    exposure = [last_scored[(run.name, step)] - max(run.completions[step]) for run in runs for step in range(run.steps)]
    asleep_seconds = sum(pool["asleep_seconds"] for pool in pools.values())
    return {"replica_seconds": sum(pool["replica_seconds"] for pool in pools.values()),
            "asleep_replica_seconds": asleep_seconds,
            "exposed_s_mean": statistics.mean(exposure), "exposed_s_max": max(exposure),
            "timelines": {name: pool["timeline"] for name, pool in pools.items()}}


def rollouts_arrived(runs: list[Run], now: float) -> int:
    """The runs' rollouts finished by ``now`` (each a member sent to the pool)."""
    return sum(bisect.bisect_right(run.rollouts, now) for run in runs)


def members_waiting(runs: list[Run], now: float) -> int:
    """Members sent by ``now`` whose group is not complete yet (waiting for group-mates)."""
    complete = sum(run.group_size * bisect.bisect_right(times, now) for run in runs for times in run.completions)
    return rollouts_arrived(runs, now) - complete


def known_to(slot: int, replicas: int, runs: list[Run], now: float) -> list[Demand]:
    """The announcements replica ``slot`` holds: those of the runs it owns (one replica per run)."""
    return demands([run for index, run in enumerate(runs) if index % replicas == slot], now)


def wake(pool: dict, now: float, settings: ScalingSettings, runs: list[Run]) -> None:
    """Wake sleeping replicas (``cluster/engine_sleep.py``'s decision): the owner of a run ahead of its
    announced groups, and one for each queued group no awake replica takes at once (the service's
    ring spreads groups over every replica, sleeping ones included; the group waits for the wake-up)."""
    unserved = len(pool["queue"]) - sum(1 for slot, free in enumerate(pool["free_at"])
                                        if not pool["asleep"][slot] and free <= now)
    for slot, asleep in enumerate(pool["asleep"]):
        if not asleep:
            continue
        action = sleep_action(now=now, sleeping=True, busy=unserved > 0, idle_since=None,
                              demands=known_to(slot, len(pool["asleep"]), runs, now), settings=settings,
                              margin_s=TICK_S)
        if action == "wake":
            pool["asleep"][slot] = False
            pool["free_at"][slot] = pool["busy_until"][slot] = now + settings.wake_s  # it serves once awake
            unserved -= 1


def fall_asleep(pool: dict, now: float, settings: ScalingSettings, runs: list[Run]) -> None:
    """Put awake replicas with nothing to do since ``sleep_after_s`` to sleep (a replica is idle
    since it finished its last group, woke or started)."""
    for slot, until in enumerate(pool["busy_until"]):
        if pool["asleep"][slot]:
            continue
        busy = until > now or bool(pool["queue"])
        action = sleep_action(now=now, sleeping=False, busy=busy, idle_since=None if busy else until,
                              demands=known_to(slot, len(pool["asleep"]), runs, now), settings=settings,
                              margin_s=TICK_S)
        if action == "sleep":
            pool["asleep"][slot] = True


def demands(runs: list[Run], now: float) -> list[Demand]:
    """Each run's latest announcement by ``now`` (the service keeps a tenant's latest)."""
    latest = []
    for run in runs:
        made = [demand for at, demand in run.announcements if at <= now]
        if made:
            latest.append(made[-1])
    return latest


def peak_sized(runs: list[Run], args: argparse.Namespace) -> dict:
    """Fixed pools, one per run, each the smallest whose exposure is within 5% of a whole-cluster
    pool's for that run alone: sized for the run's own peak (its end-of-phase burst)."""
    def fixed(size: int) -> dict:
        return simulate(runs, lambda run: (run.name, size), args.seconds_per_group, args.cold_start_s, None)

    best = fixed(args.gpus // len(runs))["exposed_s_mean"]
    for size in range(1, args.gpus // len(runs) + 1):
        result = fixed(size)
        if result["exposed_s_mean"] <= 1.05 * best:
            return {**result, "size": size}
    return {**fixed(args.gpus // len(runs)), "size": args.gpus // len(runs)}


def resize(pool: dict, target: int, now: float, cold_start_s: float) -> None:
    """Start replicas (up after a cold start) or stop idle ones, sleeping ones first, newest first."""
    running = len(pool["free_at"]) + len(pool["starting"])
    if target > running:
        pool["starting"].extend([now + cold_start_s] * (target - running))
    while target < len(pool["free_at"]) + len(pool["starting"]):
        if pool["starting"]:
            pool["starting"].pop()
        else:
            idle = [slot for slot, free in enumerate(pool["free_at"]) if free <= now]
            if not idle:
                break
            gone = ([slot for slot in idle if pool["asleep"][slot]] or idle)[-1]
            pool["free_at"].pop(gone)
            pool["asleep"].pop(gone)
            pool["busy_until"].pop(gone)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--generation-s", type=float, default=120.0)
    parser.add_argument("--training-s", type=float, default=240.0)
    parser.add_argument("--seconds-per-group", type=float, default=1.5)
    parser.add_argument("--cold-start-s", type=float, default=90.0)
    parser.add_argument("--demand-headroom", type=float, default=1.5,
                        help="capacity over the announced rate of a phase's busiest slice (the plotted run's)")
    parser.add_argument("--demand-grace-s", type=float, default=5.0)
    parser.add_argument("--downscale-delay-s", type=float, default=10.0)
    parser.add_argument("--idle-downscale-delay-s", type=float, default=5.0,
                        help="how long the pool must be idle between announced phases before it drops what the "
                             "announced demand does not need")
    parser.add_argument("--min-replicas", type=int, default=1,
                        help="the elastic pool's fewest replicas (0: it empties between the runs' announced phases)")
    parser.add_argument("--idle", choices=("stop", "sleep"), default="stop",
                        help="sleep: compare idle replicas removed (stop) with idle replicas asleep (sleep) instead "
                             "of the default table")
    parser.add_argument("--wake-s", type=float, default=10.0, help="idle sleep: seconds a sleeping replica takes to "
                                                                   "serve again (an assumption, see the docstring)")
    parser.add_argument("--sleeping-cost", type=float, default=0.1,
                        help="idle sleep: a sleeping replica's cost relative to an awake one")
    parser.add_argument("--sleep-after-s", type=float, default=30.0,
                        help="idle sleep: seconds without work before a replica's engine sleeps")
    args = parser.parse_args(argv)
    settings = ScalingSettings(min_replicas=args.min_replicas, max_replicas=args.gpus, target_backlog_s=10.0, upscale_delay_s=0.0,
                               downscale_delay_s=args.downscale_delay_s, cold_start_s=args.cold_start_s,
                               idle_downscale_delay_s=args.idle_downscale_delay_s,
                               default_seconds_per_group=args.seconds_per_group, demand_grace_s=args.demand_grace_s,
                               demand_headroom=args.demand_headroom, wake_s=args.wake_s,
                               sleeping_cost=args.sleeping_cost, sleep_after_s=args.sleep_after_s)
    if args.idle == "sleep":
        return compare_idle(args, settings)
    rows, plotted, elastic_at = [], None, {}
    for headroom in sorted({1.25, args.demand_headroom, 2.0}):
        for count in range(1, 5):
            runs = make_runs(count, args)
            fixed = peak_sized(runs, args)
            elastic = simulate(runs, lambda run: ("shared", 1), args.seconds_per_group, args.cold_start_s,
                               dataclasses.replace(settings, demand_headroom=headroom))
            rows.append({"demand_headroom": headroom, "runs": count, "fixed_pool_per_run": fixed["size"],
                         "fixed_replica_seconds": fixed["replica_seconds"],
                         "elastic_replica_seconds": elastic["replica_seconds"],
                         "replica_seconds_fixed_vs_elastic": fixed["replica_seconds"] / elastic["replica_seconds"],
                         "fixed_exposed_s_mean": fixed["exposed_s_mean"],
                         "elastic_exposed_s_mean": elastic["exposed_s_mean"],
                         "exposed_elastic_vs_fixed": elastic["exposed_s_mean"] / fixed["exposed_s_mean"]})
            if headroom == args.demand_headroom:
                elastic_at[count] = (runs, elastic, fixed)
                if count == 4:
                    plotted = elastic["timelines"]["shared"]
    print_table(rows, list(rows[0]))
    serve_rows = serve_default_rows(args, elastic_at)
    print_table(serve_rows, list(serve_rows[0]))
    inputs = {key: value for key, value in vars(args).items()}
    # A pool allowed to empty is written apart: the default file is BENCHMARKS section 4b's.
    name = "autoscaling_sim" if args.min_replicas == 1 else f"autoscaling_sim_min{args.min_replicas}"
    write_json(name, {"simulated": True, "inputs": inputs, "rows": rows, "serve_default_rows": serve_rows},
               {"machine": machine()})
    if plotted:
        plot(plotted, results_dir() / f"{name}.png")
    print(f"wrote {results_dir() / name}.json")
    return 0


SERVE_TARGETS = (64, 16, 4)  # grrm.yaml's target before the project's policy; AutoscalingSettings' default; lower


def serve_default_rows(args: argparse.Namespace, elastic_at: dict[int, tuple[list[Run], dict, dict]]) -> list[dict]:
    """The same runs on one pool scaled by (a model of) Serve's default policy, at the targets of
    :data:`SERVE_TARGETS` with grrm.yaml's former delays (up 30 s, down 300 s), against the project's
    pool (at ``--demand-headroom``) and the fixed pools."""
    rows = []
    for count, (runs, elastic, fixed) in sorted(elastic_at.items()):
        for target in SERVE_TARGETS:
            serve = simulate(runs, lambda run: ("shared", 1), args.seconds_per_group, args.cold_start_s, None,
                             ServeDefault(target=target, max_replicas=args.gpus))
            rows.append({"runs": count, "serve_target": target, "serve_replica_seconds": serve["replica_seconds"],
                         "replica_seconds_serve_vs_elastic": serve["replica_seconds"] / elastic["replica_seconds"],
                         "replica_seconds_fixed_vs_serve": fixed["replica_seconds"] / serve["replica_seconds"],
                         "serve_exposed_s_mean": serve["exposed_s_mean"],
                         "exposed_serve_vs_elastic": serve["exposed_s_mean"] / elastic["exposed_s_mean"]})
    return rows


def make_runs(count: int, args: argparse.Namespace) -> list[Run]:
    """``count`` runs, each starting at a random point of a step's period (seeded by ``count``)."""
    rng = random.Random(count)
    period = args.generation_s + args.training_s
    return [Run(f"run-{k}", offset_s=rng.uniform(0, period), steps=args.steps, groups=args.groups,
                group_size=args.group_size, generation_s=args.generation_s, training_s=args.training_s).build(rng)
            for k in range(count)]


SLEEP_HEADROOMS = (1.3,)  # besides --demand-headroom: less headroom, where waking replaces starting


def compare_idle(args: argparse.Namespace, settings: ScalingSettings) -> int:
    """The second table (``--idle sleep``): for 1-4 runs, the fixed pools sized for each run's peak,
    the elastic pool removing idle replicas (stop), and the elastic pool keeping them asleep (sleep)
    with engines that sleep after 30 and 60 s (and ``--sleep-after-s``) without work: sooner saves
    more and makes more groups wait for a wake-up; each at ``--demand-headroom`` and at
    :data:`SLEEP_HEADROOMS`. Cost: awake replica-seconds (starting ones included) + sleeping_cost x
    asleep ones."""
    variants: list[tuple[str, float, ScalingSettings | None]] = [("fixed", 0.0, None)]
    for headroom in sorted({args.demand_headroom, *SLEEP_HEADROOMS}, reverse=True):
        at = dataclasses.replace(settings, demand_headroom=headroom)
        variants.append(("stop", headroom, at))
        variants += [(f"sleep after {after:g} s", headroom, dataclasses.replace(at, idle="sleep", sleep_after_s=after))
                     for after in sorted({30.0, 60.0, args.sleep_after_s})]
    rows = []
    for count in range(1, 5):
        runs = make_runs(count, args)
        fixed = peak_sized(runs, args)
        base: dict[tuple[str, float], float] = {}
        for name, headroom, variant in variants:
            result = fixed if variant is None else simulate(
                runs, lambda run: ("shared", 1), args.seconds_per_group, args.cold_start_s, variant)
            asleep = result.get("asleep_replica_seconds", 0.0)
            cost = result["replica_seconds"] - asleep + args.sleeping_cost * asleep
            base.setdefault((name.split(" ")[0], headroom), cost)
            stop = base.get(("stop", headroom))
            rows.append({"runs": count, "pool": name, "demand_headroom": headroom if variant is not None else None,
                         "replica_seconds": result["replica_seconds"],
                         "awake_replica_seconds": result["replica_seconds"] - asleep, "cost": cost,
                         "cost_fixed_vs_this": base[("fixed", 0.0)] / cost,
                         "cost_stop_vs_this": stop / cost if stop is not None else None,
                         "exposed_s_mean": result["exposed_s_mean"], "exposed_s_max": result["exposed_s_max"],
                         "exposed_vs_fixed": result["exposed_s_mean"] / fixed["exposed_s_mean"]})
    print_table(rows, list(rows[0]))
    print(f"SIMULATED; break-even horizon {break_even_s(settings):.0f} s: an idle replica is kept asleep when the "
          "next announced need comes within it")
    write_json("autoscaling_sim_sleep", {"simulated": True, "inputs": dict(vars(args)), "rows": rows},
               {"machine": machine()})
    print(f"wrote {results_dir() / 'autoscaling_sim_sleep.json'}")
    return 0


def plot(timeline: list[tuple[float, int, int]], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 3.6))
    axis.step([t / 60 for t, _, _ in timeline], [replicas for _, replicas, _ in timeline], where="post",
              color="tab:red", label="replicas (elastic, shared)")
    axis.set_xlabel("minutes")
    axis.set_ylabel("replicas")
    twin = axis.twinx()
    twin.plot([t / 60 for t, _, _ in timeline], [waiting for _, _, waiting in timeline], color="tab:blue",
              alpha=0.5, label="groups waiting")
    twin.set_ylabel("groups waiting")
    lines = axis.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    labels = axis.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
    axis.legend(lines, labels, fontsize=7, loc="upper right")
    axis.set_title("SIMULATED: 4 GRPO runs on one elastic pool (project's policy)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
