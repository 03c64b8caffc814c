"""bench.verl_trainer's own logic, in milliseconds: the rows and ratios it derives from verl's step
metrics, the simulated reward service it deploys, and its plot (the trainings themselves run in
tests/verl_trainer/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import verl_trainer
from cpu_harness.loop import TrainingReport


def report(step_s: list[float], mode: str = "sync", **metrics: float) -> TrainingReport:
    steps = [
        {"step": index + 1, "data": {"timing_s/step": value, "timing_s/gen": value / 2, "grrm/valid": 15.0,
                                      "grrm/rewards": 16.0, "grrm/default/invalid_text": 1.0, **metrics}}
        for index, value in enumerate(step_s)
    ]
    return TrainingReport(0, 1.0, steps, [], {}, Path("log"), mode=mode)


def test_a_row_is_the_median_of_the_steps_after_the_warm_up():
    row = verl_trainer.summarize("sync", 0.5, report([100.0, 4.0, 6.0, 5.0], **{"grrm/exposed_reward_s": 1.0}))
    assert row["steps"] == 3 and row["step_s"] == 5.0 and row["gen_s"] == 2.5  # step 1 (warm-up) is left out
    assert row["step_s_each"] == [4.0, 6.0, 5.0]
    assert row["valid_rewards"] == "45/48" and row["defaults"] == {"invalid_text": 3}
    assert row["exposed_reward_s"] == 1.0 and row["simulated_reward"] and row["reward_cost"] == 0.5


def test_after_batch_exposes_verls_whole_reward_phase():
    row = verl_trainer.summarize("after_batch", 1.0, report([9.0, 8.0], **{"timing_s/reward": 3.0}))
    assert row["exposed_reward_s"] == 3.0


def test_ratios_against_the_zero_cost_run_and_after_batch_at_the_same_cost():
    rows = [
        {"mode": "sync", "reward_cost": 0.0, "step_s": 10.0},
        {"mode": "sync", "reward_cost": 1.0, "step_s": 12.0},
        {"mode": "after_batch", "reward_cost": 1.0, "step_s": 15.0},
        {"mode": "legacy", "reward_cost": 1.0, "step_s": 14.0},  # no zero-cost legacy run
    ]
    verl_trainer.add_ratios(rows)
    sync_zero, sync_one, after_batch, legacy = rows
    assert "step_vs_zero_cost" not in sync_zero and sync_one["step_vs_zero_cost"] == pytest.approx(1.2)
    assert sync_one["step_vs_after_batch"] == pytest.approx(0.8) and "step_vs_after_batch" not in after_batch
    assert "step_vs_zero_cost" not in legacy and legacy["step_vs_after_batch"] == pytest.approx(14 / 15)


def test_each_phase_of_a_costlier_step_is_compared_with_the_zero_cost_run():
    zero = verl_trainer.summarize("sync", 0.0, report([9.0, 10.0], **{"timing_s/old_log_prob": 1.0}))
    costly = verl_trainer.summarize("sync", 1.0, report([9.0, 13.0], **{"timing_s/old_log_prob": 1.5,
                                                                         "grrm/limit_s": 2.0}))
    assert zero["phases_s"] == {"gen": 5.0, "old_log_prob": 1.0, "step": 10.0}
    (growth,) = verl_trainer.phase_growth([zero, costly])
    assert growth["step_growth_s"] == 3.0 and growth["limit_s"] == 2.0 and growth["zero_cost_step_s"] == 10.0
    assert growth["gen_growth_s"] == 1.5 and growth["old_log_prob_growth_s"] == 0.5
    assert "update_actor_growth_s" not in growth  # a phase verl did not time is not invented


def test_the_reward_cost_is_a_batch_scoring_time_spread_over_the_replicas():
    # 8 groups on 2 single-slot replicas: 4 rounds, so 1x of a 10 s generation is 2.5 s per group.
    assert verl_trainer.group_latency(1.0, 10.0, 8) == pytest.approx(2.5)
    assert verl_trainer.group_latency(0.5, 10.0, 8) == pytest.approx(1.25)


def test_the_simulated_service_is_a_valid_app_on_the_scripted_engine(tmp_path):
    from deployments.config import load_app_config

    config = load_app_config(verl_trainer.service_config(tmp_path / "service.yaml", 0.4))
    assert config.engine.kind == "scripted" and config.engine.scripted.per_prompt_s == 0.4
    assert config.engine.scripted.max_concurrent_prompts == verl_trainer.SLOTS
    assert config.replicas.num_replicas == verl_trainer.REPLICAS


def test_the_plot_is_written(tmp_path):
    rows = [
        {"mode": "sync", "reward_cost": 1.0, "step_vs_zero_cost": 1.1, "exposed_vs_limit": 1.3},
        {"mode": "legacy", "reward_cost": 0.5, "step_vs_zero_cost": None, "exposed_vs_limit": 1.0},
    ]
    verl_trainer.plot(rows, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_one_step_offs_generation_phase_is_compared_too():
    """one_step_off times its generation, overlapping training, as generate_async, not gen."""
    zero = verl_trainer.summarize("one_step_off", 0.0, report([9.0, 10.0], **{"timing_s/generate_async": 6.0}))
    costly = verl_trainer.summarize("one_step_off", 1.0, report([9.0, 10.0], **{"timing_s/generate_async": 6.5}))
    (growth,) = verl_trainer.phase_growth([zero, costly])
    assert growth["generate_async_growth_s"] == 0.5
