"""The plan (cluster/planning/plan.py): replays through the pool model, and the answers it gives."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from cluster.planning.plan import AUTOSCALING_GRID, SERVE_TARGETS, plan_pool
from cluster.planning.pool_model import Run, simulate
from cluster.planning.replay import replay, runs_of
from cluster.routing import HashRing
from cluster.planning.trace import GroupTrace, RunTrace, StepTrace, synthetic_trace
from deployments.config import AppConfig


def test_one_replica_scores_a_hand_computed_step():
    # One step: groups complete at 1.0, 1.0 and 2.0 s; one replica, 2 s per group, first come first
    # served within each 1 s tick: scored at 3, 5 and 7 s. Exposure: 7 - 2 = 5 s after the last rollout.
    step = StepTrace(start_s=0.0, generation_s=2.0, training_s=10.0,
                     groups=[GroupTrace(members_at=[0.5, 1.0]), GroupTrace(members_at=[1.0]), GroupTrace(members_at=[2.0])])
    run = Run.from_trace(RunTrace(run="r", group_size=2, steps=[step]))
    result = simulate([run], lambda _: ("shared", 1), 2.0, 0.0, None)
    assert result["exposed_s_mean"] == pytest.approx(5.0)
    # The replica is held from 0 until the tick after its last group (7 s): 7 ticks of 1 s, then the loop
    # runs to the run's end (12 s) before it may stop: 13 replica-seconds.
    assert result["replica_seconds"] == pytest.approx(13.0)


def test_a_trace_s_own_group_costs_replace_the_pool_s_figure():
    # The same step as above, each group measured at 1 s of engine work (the pool's figure stays 2 s):
    # scored at 2 (the first, from 1), 3 and 4 s, each in the tick it becomes free. Exposure: 4 - 2 = 2 s.
    step = StepTrace(start_s=0.0, generation_s=2.0, training_s=10.0,
                     groups=[GroupTrace(members_at=[0.5, 1.0], work_s=1.0), GroupTrace(members_at=[1.0], work_s=1.0),
                             GroupTrace(members_at=[2.0], work_s=1.0)])
    run = Run.from_trace(RunTrace(run="r", group_size=2, steps=[step]))
    assert run.work_s == [[1.0, 1.0, 1.0]]
    result = simulate([run], lambda _: ("shared", 1), 2.0, 0.0, None)
    assert result["exposed_s_mean"] == pytest.approx(2.0)
    assert result["replica_seconds"] == pytest.approx(13.0)  # a fixed replica, held to the run's end as above


def test_ring_routing_queues_each_group_on_the_replica_its_id_hashes_to():
    # Eight groups complete at once on four fixed replicas, 2 s each: on the ring, each replica scores the
    # groups it owns one after another, so the step ends when the busiest replica is done; one shared
    # queue would end it after two groups each (4 s).
    step = StepTrace(start_s=0.0, generation_s=1.0, training_s=10.0,
                     groups=[GroupTrace(members_at=[1.0]) for _ in range(8)])
    run = Run.from_trace(RunTrace(run="r", group_size=1, steps=[step]))
    ring = HashRing([f"replica-{number}" for number in range(4)])
    busiest = max(Counter(ring.owner(f"r/0/{number}") for number in range(8)).values())
    ringed = simulate([run], lambda _: ("shared", 4), 2.0, 0.0, None, routing="ring")
    assert ringed["exposed_s_mean"] == pytest.approx(2.0 * busiest)
    assert simulate([run], lambda _: ("shared", 4), 2.0, 0.0, None)["exposed_s_mean"] == pytest.approx(4.0)
    assert busiest > 2  # this placement is uneven, which is the point


@pytest.fixture(scope="module")
def two_runs():
    return [synthetic_trace(f"r{k}", groups=16, group_size=4, generation_s=60.0, training_s=120.0, steps=2,
                            offset_s=90.0 * k, seed=k) for k in range(2)]


@pytest.fixture(scope="module")
def plan(two_runs):
    return plan_pool(two_runs, seconds_per_group=1.0, cold_start_s=30.0, max_replicas=6, within_pct=20.0, gpus=4)


def test_more_fixed_replicas_never_expose_more_and_cost_in_proportion(plan, two_runs):
    fixed = [candidate for candidate in plan.candidates if candidate.pool == "fixed"]
    assert [candidate.replicas for candidate in fixed] == [1, 2, 3, 4, 5, 6]
    exposures = [candidate.exposed_s_mean for candidate in fixed]
    # Groups go where the ring places them: a larger pool may still queue two late groups on one replica,
    # so exposure falls overall, not at every size; on one shared queue (an ideal pool) it never rises.
    assert exposures[0] > exposures[-1]  # one replica is a real queue here
    shared = [replay(runs_of(two_runs), seconds_per_group=1.0, cold_start_s=30.0, replicas=size,
                     routing="shared").exposed_s_mean for size in range(1, 7)]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(shared, shared[1:]))
    assert all(ring >= ideal - 1e-9 for ring, ideal in zip(exposures, shared))
    per_replica = {round(candidate.replica_seconds_per_step / candidate.replicas, 6) for candidate in fixed}
    assert len(per_replica) == 1  # a fixed pool holds its replicas for the whole replay
    assert fixed[1].gpu_hours_per_1000_steps == pytest.approx(fixed[1].replica_seconds_per_step * 1000 / 3600)


def test_the_answers_are_the_cheapest_within_the_bound_and_the_best_that_fits(plan, two_runs):
    autoscaled = [candidate for candidate in plan.candidates if candidate.pool == "autoscaled"]
    grid = math.prod(len(values) for values in AUTOSCALING_GRID.values())
    # The grid up to max_replicas (6), and again capped at what 4 GPUs hold (4 replicas of 1 GPU).
    assert sorted(candidate.replicas for candidate in autoscaled) == [4] * grid + [6] * grid
    assert all(candidate.peak_replicas <= 4 for candidate in autoscaled if candidate.replicas == 4)
    assert plan.unlimited.pool == "fixed" and plan.unlimited.replicas == 6
    bound = plan.unlimited.exposed_s_mean * 1.2
    chosen = plan.cheapest_within
    assert chosen.exposed_s_mean <= bound
    assert all(other.replica_seconds_per_step >= chosen.replica_seconds_per_step
               for other in plan.candidates if other.exposed_s_mean <= bound)
    best = plan.best_within_gpus
    assert best is not None and best.peak_replicas <= 4
    # The offline bound sits below every candidate that keeps each step within the bound.
    assert all(plan.offline.replica_seconds_per_step <= candidate.replica_seconds_per_step
               for candidate in plan.candidates if candidate.exposed_s_max <= bound)
    assert plan.offline.work_per_step > 0
    # Two runs: the baseline of a fixed pool each, each the smallest within 20% of its own unlimited.
    for trace, size in zip(two_runs, plan.separate.sizes):
        alone = replay(runs_of([trace]), seconds_per_group=1.0, cold_start_s=30.0, replicas=size)
        largest = replay(runs_of([trace]), seconds_per_group=1.0, cold_start_s=30.0, replicas=6)
        assert alone.exposed_s_mean <= 1.2 * largest.exposed_s_mean
    assert plan.separate.replica_seconds_per_step > 0
    assert all(other.exposed_s_mean >= best.exposed_s_mean for other in plan.candidates if other.peak_replicas <= 4)


def test_an_autoscaled_recommendation_is_a_valid_config_block(two_runs):
    from grrm_cli.plan import config_block

    # With a generous bound, an autoscaled pool is the cheapest here (it drops replicas in training).
    plan = plan_pool(two_runs, seconds_per_group=1.0, cold_start_s=30.0, max_replicas=6, within_pct=100.0)
    assert plan.cheapest_within.pool == "autoscaled"
    block = config_block(plan.cheapest_within)
    config = AppConfig.model_validate({"engine": {"kind": "scripted"}, **block})
    assert config.replicas.autoscaling is not None
    assert config.replicas.autoscaling.demand_headroom == plan.cheapest_within.settings.demand_headroom
    assert config.replicas.autoscaling.max_replicas == 6


def test_a_fixed_recommendation_is_a_valid_config_block(plan):
    from grrm_cli.plan import config_block

    fixed = next(candidate for candidate in plan.candidates if candidate.pool == "fixed" and candidate.replicas == 3)
    config = AppConfig.model_validate({"engine": {"kind": "scripted"}, **config_block(fixed)})
    assert config.replicas.num_replicas == 3 and config.replicas.autoscaling is None


def test_a_plan_needs_runs_and_a_pool():
    with pytest.raises(ValueError, match="traces"):
        plan_pool([], seconds_per_group=1.0, cold_start_s=1.0, max_replicas=2)
    one = [synthetic_trace("r", groups=2, group_size=2, generation_s=5.0, training_s=5.0, steps=1)]
    with pytest.raises(ValueError, match="max_replicas: 0"):
        plan_pool(one, seconds_per_group=1.0, cold_start_s=1.0, max_replicas=0)


def test_serve_s_default_policy_is_a_candidate_whose_block_deploys_what_was_replayed(plan, two_runs):
    from grrm_cli.plan import config_block

    serve = [candidate for candidate in plan.candidates if candidate.pool == "serve_default"]
    # Each target, up to max_replicas and again capped at the 4 GPUs.
    assert sorted((candidate.replicas, candidate.serve_default.target) for candidate in serve) == sorted(
        (cap, target) for cap in (4, 6) for target in SERVE_TARGETS)
    chosen = next(candidate for candidate in serve if candidate.replicas == 6 and candidate.serve_default.target == 4)
    alone = replay(runs_of(two_runs), seconds_per_group=1.0, cold_start_s=30.0, serve_default=chosen.serve_default)
    assert (chosen.exposed_s_mean, chosen.replica_seconds_per_step) == (alone.exposed_s_mean,
                                                                        alone.replica_seconds_per_step)
    autoscaling = AppConfig.model_validate({"engine": {"kind": "scripted"}, **config_block(chosen)}).replicas.autoscaling
    assert (autoscaling.policy, autoscaling.target_ongoing_requests, autoscaling.max_replicas) == ("serve_default", 4, 6)
    assert (autoscaling.upscale_delay_s, autoscaling.downscale_delay_s, autoscaling.look_back_period_s) == (
        chosen.serve_default.upscale_delay_s, chosen.serve_default.downscale_delay_s, chosen.serve_default.look_back_s)
