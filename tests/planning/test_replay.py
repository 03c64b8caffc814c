"""One pool's replay (cluster/planning/replay.py): the prediction for a fixed, an autoscaled and Serve's pool."""

from __future__ import annotations

import pytest

from cluster.autoscaling import ScalingSettings
from cluster.planning.pool_model import ServeDefault
from cluster.planning.replay import replay, runs_of
from cluster.planning.trace import synthetic_trace


@pytest.fixture(scope="module")
def runs():
    return runs_of([synthetic_trace("r", groups=16, group_size=4, generation_s=60.0, training_s=120.0, steps=3)])


def test_a_fixed_pool_holds_its_replicas_and_the_autoscaled_one_drops_them_in_training(runs):
    fixed = replay(runs, seconds_per_group=1.0, cold_start_s=30.0, replicas=4, gpus_per_replica=2)
    assert fixed.peak_replicas == 4 and {held for _, held, _ in fixed.timeline} == {4}
    # 4 replicas x every tick of the replay, per step; 2 GPUs each.
    assert fixed.replica_seconds_per_step == pytest.approx(4 * len(fixed.timeline) / 3)
    assert fixed.gpu_hours_per_1000_steps == pytest.approx(fixed.replica_seconds_per_step * 2 * 1000 / 3600)
    settings = ScalingSettings(min_replicas=0, max_replicas=4, cold_start_s=30.0, default_seconds_per_group=1.0,
                               downscale_delay_s=10.0, demand_grace_s=5.0)
    autoscaled = replay(runs, seconds_per_group=1.0, cold_start_s=30.0, settings=settings)
    assert autoscaled.peak_replicas <= 4
    assert min(held for _, held, _ in autoscaled.timeline) == 0  # it empties between the phases
    assert autoscaled.replica_seconds_per_step < fixed.replica_seconds_per_step
    serve = replay(runs, seconds_per_group=1.0, cold_start_s=30.0, serve_default=ServeDefault(target=4, max_replicas=4))
    assert 1 <= serve.peak_replicas <= 4


def test_a_replay_refuses_what_cannot_be_a_pool(runs):
    with pytest.raises(ValueError, match="seconds_per_group: 0"):
        replay(runs, seconds_per_group=0.0, cold_start_s=1.0)
    with pytest.raises(ValueError, match="replicas: 0"):
        replay(runs, seconds_per_group=1.0, cold_start_s=1.0, replicas=0)
    with pytest.raises(ValueError, match="traces"):
        runs_of([])
