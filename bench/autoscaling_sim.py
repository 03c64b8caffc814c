"""SIMULATED: one elastic reward pool for several GRPO runs against a fixed pool per run, at scale.

The pool model is ``cluster/planning/pool_model.py`` (``grrm plan`` replays runs through it too); this
bench makes synthetic runs, sizes the pools and writes the tables and the plot.

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

    .venv/bin/python -m bench.autoscaling_sim      # bench/results/autoscaling_sim.json, docs/plots/autoscaling_sim.png
    .venv/bin/python -m bench.autoscaling_sim --idle sleep   # bench/results/autoscaling_sim_sleep.json
"""

from __future__ import annotations

import argparse
import dataclasses
import random

from bench.common import machine, print_table, plot_path, results_dir, write_json
from cluster.autoscaling import ScalingSettings, break_even_s
from cluster.planning.pool_model import Run, ServeDefault, simulate
from grrm_cli.plan import plot_timeline

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
    # A pool allowed to empty is written apart: the default file is docs/benchmarks.md section 4b's.
    name = "autoscaling_sim" if args.min_replicas == 1 else f"autoscaling_sim_min{args.min_replicas}"
    write_json(name, {"simulated": True, "inputs": inputs, "rows": rows, "serve_default_rows": serve_rows},
               {"machine": machine()})
    if plotted:
        plot(plotted, plot_path(name))
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
    plot_timeline(timeline, path, "SIMULATED: 4 GRPO runs on one elastic pool (project's policy)",
                  "replicas (elastic, shared)")


if __name__ == "__main__":
    raise SystemExit(main())
