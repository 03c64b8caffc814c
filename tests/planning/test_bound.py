"""The offline bound: hand-computed windows and levels, and no replayed pool below it."""

import pytest

from cluster.planning.bound import offline_bound
from cluster.planning.pool_model import Run
from cluster.planning.replay import replay, runs_of
from cluster.planning.trace import GroupTrace, RunTrace, StepTrace, synthetic_trace


def two_group_run(steps: list[list[float]]) -> Run:
    trace = RunTrace(run="r", group_size=1, steps=[
        StepTrace(start_s=40.0 * index, generation_s=30.0, training_s=10.0,
                  groups=[GroupTrace(members_at=[at], work_s=2.0) for at in arrivals])
        for index, arrivals in enumerate(steps)])
    return runs_of([trace])[0]


def test_each_window_needs_its_replicas_and_each_level_pays_a_start_or_the_gap():
    # Groups complete at 10 and 20 (2 engine seconds each), exposure 1 s: the last group alone needs
    # ceil(2 / 1) = 2 replicas within [20, 21]; the two together only ceil(4 / 11) = 1.
    one = offline_bound([two_group_run([[10.0, 20.0]])], seconds_per_group=9.0, cold_start_s=5.0, exposure_s=1.0)
    assert one.peak_replicas == 2
    assert one.work_per_step == pytest.approx(4.0)  # the trace's work_s, not the pool's 9 s
    assert one.starts_per_step == pytest.approx(5.0)  # the second replica's start; the first serves from 0
    assert one.replica_seconds_per_step == pytest.approx(5.0)
    # A second step 40 s later: its window [60, 61] is 39 s after the first's end; both replicas are
    # cheaper started again (5 s each) than held through: 5 (the second's first start) + 2 x 5, per step.
    two = offline_bound([two_group_run([[10.0, 20.0], [10.0, 20.0]])], seconds_per_group=9.0, cold_start_s=5.0,
                        exposure_s=1.0)
    assert two.starts_per_step == pytest.approx(15.0 / 2) and two.replica_seconds_per_step == pytest.approx(7.5)
    # With a 60 s cold start, holding both through the 39 s gap is cheaper: (60 + 2 x 39) / 2 per step.
    held = offline_bound([two_group_run([[10.0, 20.0], [10.0, 20.0]])], seconds_per_group=9.0, cold_start_s=60.0,
                         exposure_s=1.0)
    assert held.starts_per_step == pytest.approx((60.0 + 2 * 39.0) / 2)


def test_no_replayed_pool_costs_less_than_the_bound_at_its_own_exposure():
    traces = [synthetic_trace(f"run-{index}", groups=24, group_size=4, generation_s=30.0, training_s=60.0, steps=3,
                              offset_s=23.0 * index, seed=index) for index in range(3)]
    runs = runs_of(traces)
    for size in (2, 4, 8):
        pool = replay(runs, seconds_per_group=1.5, cold_start_s=20.0, replicas=size)
        bound = offline_bound(runs, seconds_per_group=1.5, cold_start_s=20.0, exposure_s=pool.exposed_s_max)
        assert bound.replica_seconds_per_step <= pool.replica_seconds_per_step, size


def test_the_exposure_must_be_positive():
    with pytest.raises(ValueError, match="exposure_s"):
        offline_bound([two_group_run([[10.0]])], seconds_per_group=1.0, cold_start_s=1.0, exposure_s=0.0)
