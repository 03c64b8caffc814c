"""``grrm plan``: size a reward pool from recorded or synthetic runs before renting GPUs.

Replays the runs (several share one pool) on fixed pools and on autoscaled pools through the pool
model (``cluster/planning/``: the project's own autoscaling decision), prints what each would expose
and cost, answers "the cheapest pool within X% of unlimited replicas" and "the lowest exposure within
N GPUs", and prints the ``replicas.autoscaling`` block to paste into the app config. SIMULATED: a
prediction; its engine figures (seconds per group, cold start) come from a measured profile
(``--profile``) or are given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from cluster.planning.plan import Plan, PoolPrediction, autoscaling_block, plan_pool, serve_default_block
from cluster.planning.recorder import one_per_run
from cluster.planning.profile import EngineProfile, costed, seconds_per_group
from cluster.planning.trace import RunTrace, synthetic_trace

M = TypeVar("M", bound=BaseModel)

SYNTHETIC_KEYS = {"batch": int, "n": int, "gen_s": float, "train_s": float, "spread_s": float, "steps": int,
                  "offset_s": float, "seed": int}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm plan``."""
    parser = subparsers.add_parser(
        "plan", help="size a reward pool from recorded or synthetic runs (simulated)",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--trace", action="append", default=[], metavar="FILE",
                        help="a run's trace (JSON, cluster/planning/trace.py's format 1); repeat for runs sharing the pool "
                             "(files of one run's name are its processes' parts, merged by group id)")
    parser.add_argument("--synthetic", action="append", default=[], metavar="KEY=VALUE,...",
                        help="a run not yet made: batch (groups per step), n (group size), gen_s, train_s, "
                             "steps, optional spread_s (rollouts finish within the phase's last spread_s), offset_s, seed")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="the engine's measured profile (JSON, cluster/planning/profile.py's format 1): its "
                             "seconds per group at the runs' group size and its cold start")
    parser.add_argument("--seconds-per-group", type=float, metavar="S",
                        help="without --profile: engine seconds one replica takes per group (measure it on your engine)")
    parser.add_argument("--cold-start-s", type=float, metavar="S",
                        help="without --profile: seconds from asking for a replica to its serving")
    parser.add_argument("--max-replicas", type=int, default=16, metavar="N",
                        help="the largest pool tried; a fixed pool of N stands for unlimited replicas (default: %(default)s)")
    parser.add_argument("--gpus-per-replica", type=int, default=1, metavar="G", help="(default: %(default)s)")
    parser.add_argument("--within-pct", type=float, default=5.0, metavar="X",
                        help="the cheapest pool whose mean exposure is within X%% of unlimited (default: %(default)s)")
    parser.add_argument("--gpus", type=int, metavar="N", help="also: the lowest exposure whose peak fits in N GPUs")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every candidate and the answers as JSON")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="plot the recommended pool's replicas over time against the groups waiting "
                             "(needs matplotlib)")
    parser.set_defaults(handler=main)
    return parser


def parse_synthetic(text: str, index: int) -> RunTrace:
    """A synthetic run from ``--synthetic``'s KEY=VALUE list; a ValueError names the bad key."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in SYNTHETIC_KEYS:
            raise ValueError(f"--synthetic: unknown key {key!r} (known: {', '.join(SYNTHETIC_KEYS)})")
        try:
            values[key] = SYNTHETIC_KEYS[key](value)
        except ValueError:
            kind = "an integer" if SYNTHETIC_KEYS[key] is int else "a number"
            raise ValueError(f"--synthetic: {key}={value!r} is not {kind}") from None
    missing = [key for key in ("batch", "n", "gen_s", "train_s", "steps") if key not in values]
    if missing:
        raise ValueError(f"--synthetic: missing {', '.join(missing)}")
    return synthetic_trace(f"synthetic-{index}", groups=values["batch"], group_size=values["n"],
                           generation_s=values["gen_s"], training_s=values["train_s"], steps=values["steps"],
                           spread_s=values.get("spread_s"), offset_s=values.get("offset_s", 0.0),
                           seed=values.get("seed", index))


def load_file(model: type[M], flag: str, path: Path) -> M:
    """A trace or profile file as ``model``; a ValueError names the flag, the file and the field."""
    try:
        return model.model_validate_json(path.read_text())
    except OSError as error:
        raise ValueError(f"{flag} {path}: {error.strerror}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(the file)"
        raise ValueError(f"{flag} {path}: {where}: {first['msg']}") from None


def load_trace(path: Path) -> RunTrace:
    """A trace file (``--trace``)."""
    return load_file(RunTrace, "--trace", path)


def load_profile(path: Path) -> EngineProfile:
    """A profile file (``--profile``)."""
    return load_file(EngineProfile, "--profile", path)


def engine_figures(args: argparse.Namespace, traces: list[RunTrace]) -> tuple[float, float]:
    """Seconds per group and cold start: from ``--profile`` (its seconds at the runs' group sizes,
    weighted by their groups: the pool model has one figure for the pool; groups whose trace recorded
    tokens are costed from them, in ``traces``), else as given."""
    if args.profile is None:
        missing = [flag for flag, value in (("--seconds-per-group", args.seconds_per_group),
                                            ("--cold-start-s", args.cold_start_s)) if value is None]
        if missing:
            raise ValueError(f"give --profile, or {' and '.join(missing)}")
        if args.seconds_per_group <= 0 or args.cold_start_s < 0:
            raise ValueError("--seconds-per-group must be positive and --cold-start-s not negative")
        return args.seconds_per_group, args.cold_start_s
    if args.seconds_per_group is not None or args.cold_start_s is not None:
        raise ValueError("--profile gives the engine's figures: drop --seconds-per-group and --cold-start-s")
    profile = load_profile(args.profile)
    traces[:] = [costed(trace, profile) for trace in traces]  # groups that recorded tokens: their own seconds
    weights = [sum(len(step.groups) for step in trace.steps) for trace in traces]
    per_group = sum(weight * seconds_per_group(profile, trace.group_size)
                    for weight, trace in zip(weights, traces)) / sum(weights)
    return per_group, profile.cold_start_s


def main(args: argparse.Namespace) -> int:
    """Run ``grrm plan``."""
    try:
        # Files of one run (its processes' parts, e.g. verl's reward workers) become that run.
        traces = one_per_run([load_trace(Path(path)) for path in args.trace])
        traces += [parse_synthetic(text, index) for index, text in enumerate(args.synthetic)]
        if not traces:
            raise ValueError("give at least one --trace or --synthetic run")
        args.seconds_per_group, args.cold_start_s = engine_figures(args, traces)
        plan = plan_pool(traces, seconds_per_group=args.seconds_per_group, cold_start_s=args.cold_start_s,
                         max_replicas=args.max_replicas, gpus_per_replica=args.gpus_per_replica,
                         within_pct=args.within_pct, gpus=args.gpus)
    except ValueError as error:
        print(f"grrm plan: {error}")
        return 2
    print(f"SIMULATED plan for {len(traces)} run(s) sharing one pool ({args.seconds_per_group:g} s per group, "
          f"cold start {args.cold_start_s:g} s)")
    print_table([candidate.row() for candidate in plan.candidates])
    print(answers(plan))
    if args.json is not None:
        engine = {"seconds_per_group": args.seconds_per_group, "cold_start_s": args.cold_start_s,
                  "profile": str(args.profile) if args.profile is not None else None}
        args.json.write_text(json.dumps({"engine": engine, **as_json(plan)}, indent=2))
        print(f"wrote {args.json}")
    if args.plot is not None:
        try:
            plot_timeline(plan.cheapest_within.timeline, args.plot,
                          f"SIMULATED: {len(traces)} run(s), {describe(plan.cheapest_within).split(':')[0]}",
                          "replicas (recommended pool)")
        except ImportError:
            print("grrm plan: --plot needs matplotlib (pip install matplotlib); the plan above stands")
            return 2
        print(f"wrote {args.plot}")
    return 0


def answers(plan: Plan) -> str:
    """The answers, and the config block to paste."""
    lines = [f"unlimited ({plan.unlimited.replicas} fixed): mean exposed reward {plan.unlimited.exposed_s_mean:.2f} s/step",
             f"cheapest within {plan.within_pct:g}%: {describe(plan.cheapest_within)}",
             f"offline bound (no pool holds fewer, each step within {plan.within_pct:g}% of unlimited's mean "
             f"exposure): {plan.offline.replica_seconds_per_step:.0f} replica-s per step "
             f"(the cheapest holds {plan.cheapest_within.replica_seconds_per_step / plan.offline.replica_seconds_per_step:.2f}x)"]
    if plan.separate is not None:
        separate, chosen = plan.separate, plan.cheapest_within
        lines.append(f"a fixed pool per run instead (sizes {', '.join(map(str, separate.sizes))}, each within "
                     f"{plan.within_pct:g}% of its own unlimited): {separate.exposed_s_mean:.2f} s exposed per step, "
                     f"{separate.replica_seconds_per_step:.0f} replica-s per run-step; the cheapest shared pool holds "
                     f"{separate.replica_seconds_per_step / chosen.replica_seconds_per_step:.2f}x fewer at "
                     f"{chosen.exposed_s_mean / separate.exposed_s_mean:.2f}x their exposure")
    if plan.gpus is not None:
        best = plan.best_within_gpus
        lines.append(f"lowest exposure within {plan.gpus} GPUs: " + (describe(best) if best else "no pool fits"))
    lines += ["", "# paste into the app config (deployments/grrm.yaml's `config`):",
              yaml.safe_dump(config_block(plan.cheapest_within), sort_keys=False).rstrip()]
    return "\n".join(lines)


def config_block(chosen: PoolPrediction) -> dict[str, Any]:
    """The app config's ``replicas`` settings for the chosen pool."""
    if chosen.settings is not None:
        return {"replicas": {"autoscaling": autoscaling_block(chosen.settings)}}
    if chosen.serve_default is not None:
        return {"replicas": {"autoscaling": serve_default_block(chosen.serve_default)}}
    return {"replicas": {"num_replicas": chosen.replicas}}


def describe(prediction: PoolPrediction) -> str:
    """One candidate in a line."""
    if prediction.serve_default is not None:
        kind = (f"Serve's default policy at {prediction.serve_default.target} ongoing requests a replica, up to "
                f"{prediction.replicas} (peak {prediction.peak_replicas})")
    elif prediction.settings is not None:
        kind = f"autoscaled up to {prediction.replicas} (peak {prediction.peak_replicas})"
    else:
        kind = f"a fixed pool of {prediction.replicas}"
    return (f"{kind}: {prediction.exposed_s_mean:.2f} s exposed per step, "
            f"{prediction.replica_seconds_per_step:.0f} replica-s per step, "
            f"{prediction.gpu_hours_per_1000_steps:.1f} GPU-h per 1,000 steps")


def as_json(plan: Plan) -> dict[str, Any]:
    """The plan as the JSON ``--json`` writes."""
    return {"simulated": True, "within_pct": plan.within_pct, "gpus": plan.gpus,
            "candidates": [candidate.row() for candidate in plan.candidates],
            "unlimited": plan.unlimited.row(), "cheapest_within": plan.cheapest_within.row(),
            "best_within_gpus": plan.best_within_gpus.row() if plan.best_within_gpus else None,
            "offline_bound": dataclasses.asdict(plan.offline),
            "separate_pools": dataclasses.asdict(plan.separate) if plan.separate else None,
            "config": config_block(plan.cheapest_within)}


def print_table(rows: list[dict[str, Any]]) -> None:
    """Rows as aligned columns."""
    columns = list(rows[0])

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
        return "-" if value is None else str(value)

    cells = [[cell(row[column]) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[index]) for line in cells)) for index, column in enumerate(columns)]
    print("  ".join(column.ljust(width) for column, width in zip(columns, widths)))
    for line in cells:
        print("  ".join(value.ljust(width) for value, width in zip(line, widths)))


def plot_timeline(timeline: list[tuple[float, int, int]], path: Path, title: str, label: str) -> None:
    """Replicas over time (a step line) against the groups waiting (a second axis), as a PNG."""
    import matplotlib  # imported here: a dev dependency, needed only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 3.6))
    axis.step([t / 60 for t, _, _ in timeline], [replicas for _, replicas, _ in timeline], where="post",
              color="tab:red", label=label)
    axis.set_xlabel("minutes")
    axis.set_ylabel("replicas")
    twin = axis.twinx()
    twin.plot([t / 60 for t, _, _ in timeline], [waiting for _, _, waiting in timeline], color="tab:blue",
              alpha=0.5, label="groups waiting")
    twin.set_ylabel("groups waiting")
    lines = axis.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    labels = axis.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
    axis.legend(lines, labels, fontsize=7, loc="upper right")
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
