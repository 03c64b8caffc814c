"""The whole loop on a laptop: the reward service and 2 GRPO steps of verl's real trainer.

``python -m cpu_harness [--mode MODE] [--transport handle|http] [--steps N] [--workdir DIR] [--trace PATH]`` starts
a Ray head of its own, deploys the reward service (2 vLLM-CPU replicas of the tiny GRRM model), runs
verl's trainer in ``MODE`` (default ``sync``: ``python -m verl.trainer.main_ppo``; see
``cpu_harness.trainer.MODES``) with docs/trainers/verl.md's ``reward.*`` overrides on a tiny random policy,
prints where every reward came from (verl's own step metrics and rollout dumps, the replicas'
counters), and stops everything it started. Both models are random: the scores are meaningless.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from cpu_harness.loop import HARNESS_DEFAULT_REWARD, Harness, TrainingReport
from cpu_harness.trainer import MODES


def describe(report: TrainingReport, transport: str) -> list[str]:
    """Human-readable lines: per step where the rewards came from, per replica what it scored."""
    lines = []
    for entry in report.steps:
        step, metrics = entry["step"], entry["data"]
        defaults = {k.split("/", 2)[2]: int(v) for k, v in metrics.items() if k.startswith("grrm/default/")}
        lines.append(
            f"step {step}: {int(metrics.get('grrm/rewards', 0))} rewards, "
            f"{int(metrics.get('grrm/valid', 0))} scored by the GRRM cluster ({transport}), "
            f"defaults {defaults or 'none'}, retries {int(metrics.get('grrm/retries', 0))}; "
            f"verl timing_s/gen {metrics.get('timing_s/gen', float('nan')):.1f} s, "
            f"timing_s/step {metrics.get('timing_s/step', float('nan')):.1f} s"
        )
        for uid, rewards in list(report.groups(step).items())[:1]:
            lines.append(f"  e.g. group {uid[:8]}: rewards of its {len(rewards)} rollouts {rewards}")
    for phase in report.training_phases:
        lines.append(f"actor update {phase['start']:.1f} .. {phase['end']:.1f} ({phase['end'] - phase['start']:.1f} s)")
    for replica, counters in sorted(report.replicas.items()):
        lines.append(
            f"replica {replica}: {counters['groups_scored_by_engine']} groups scored from "
            f"{counters['members_received']} members (assembly timeouts {counters['assembly_timeouts']})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpu_harness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=tuple(MODES), default="sync", help="verl's trainer mode")
    parser.add_argument("--transport", choices=("handle", "http"), default="handle")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="models, data and logs (default: a temp dir)")
    parser.add_argument("--trace", default=None, metavar="PATH",
                        help="record the run's trace for grrm plan (the bridge's trace_path; {pid} becomes each "
                             "reward worker's process id)")
    parser.add_argument("--min-training-phase-s", type=float, default=0.0,
                        help="make each actor update last at least this long (the tiny policy's take ~0.5 s)")
    args = parser.parse_args(argv)
    # A SIGTERM must still stop the Ray head (the context manager below) rather than orphan it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="grrm-verl-loop-"))
    print(f"[harness] workdir {workdir}; starting a Ray head and the reward service ...", flush=True)
    with Harness(workdir) as harness:
        print(
            f"[harness] reward service up at {harness.service_url} (2 vLLM-CPU replicas, tiny GRRM model); "
            f"running verl's trainer ({args.mode}: {MODES[args.mode].entry}): GRPO, {harness.prompts_per_batch} "
            f"prompts x {harness.rollout_n} rollouts, {args.steps} steps, {args.transport} transport ...",
            flush=True,
        )
        # Quoted: Hydra's override grammar reads a bare "{" (as in {pid}) as a dictionary.
        options = {"trace_path": f'"{args.trace}"'} if args.trace else None
        report = harness.train(transport=args.transport, steps=args.steps, mode=args.mode, bridge_options=options,
                               min_training_phase_s=args.min_training_phase_s)
    print(f"[harness] the trainer exited {report.returncode} after {report.wall_s:.0f} s; log: {report.log_path}")
    for line in describe(report, args.transport):
        print("  " + line)
    print(
        f"[harness] a default reward would show as {HARNESS_DEFAULT_REWARD} (never a GRRM score). "
        "Both models have random weights: the scores are meaningless; the path is real."
    )
    return 0 if report.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
