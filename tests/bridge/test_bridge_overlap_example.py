"""examples/grpo_overlap.py as a test: a small GRPO step with the tiny policy on the CPU vLLM
engine, scored sequentially and streamed by the reward cluster on the package's Ray cluster."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest


pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_overlap.py"


def load_example():
    name = "grpo_overlap_example"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_plan_gives_varied_lengths_and_fixed_seeds():
    example = load_example()
    specs = example.plan_rollouts(prompts=4, n=4, min_tokens=16, max_tokens=256, seed=0)
    assert len(specs) == 16 and len({s.seed for s in specs}) == 16
    assert len({s.max_tokens for s in specs}) > 8
    assert specs == example.plan_rollouts(prompts=4, n=4, min_tokens=16, max_tokens=256, seed=0)


async def test_overlap_example_runs_and_both_modes_agree(ray_serve, tiny_model_dir, tmp_path):
    example = load_example()
    out = tmp_path / "grpo_overlap.json"
    # Group length budgets 220, 117, 148 and 31 tokens (seed 0): groups finish well apart, and
    # one reward replica scores one group at a time (~0.15 s each).
    args = example.parse_args([
        "--prompts", "4", "--n", "4", "--min-tokens", "8", "--max-tokens", "256", "--repeats", "1", "--seed", "0",
        "--reward-concurrency", "1", "--reward-per-token-s", "0.0005", "--reward-prefill-token-s", "0.00005",
        "--model", str(tiny_model_dir), "--out", str(out),
    ])
    report = await example.run(args)
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    checks = report["checks"]
    assert checks["identical_rollouts"] and checks["identical_rewards"] and checks["identical_advantages"]
    runs = {run["mode"]: run for run in report["runs"]}
    assert set(runs) == {"sequential", "streamed"}
    assert runs["streamed"]["valid"] > 0 and runs["sequential"]["valid"] == runs["streamed"]["valid"]
    assert len(runs["streamed"]["group_done_s"]) == 4
    summary = report["summary"]
    for mode in ("sequential", "streamed"):
        assert summary[mode]["step_s"] >= summary[mode]["gen_s"] > 0
    # Scoring early groups while later ones generate leaves less reward time after generation.
    assert summary["hidden_reward_share"] > 0, summary
    assert len(report["rewards"]) == len(report["advantages"]) == 16
