"""PhaseForecaster: generation phases found in rollout arrival times (pure)."""

from __future__ import annotations

from trainer_bridge.demand import PhaseForecaster


def test_a_rollout_after_a_quiet_gap_opens_a_phase_announced_as_long_as_the_median_of_the_last():
    phases = PhaseForecaster(groups_per_phase=64, gap_s=10.0, first_phase_s=60.0)
    assert phases.arrive(0.0) == 60.0  # the first phase: nothing measured yet
    assert [phases.arrive(t) for t in (5.0, 12.0, 20.0, 29.0, 38.0)] == [None] * 5  # gaps under 10 s: one phase
    assert phases.arrive(100.0) == 38.0  # the first phase lasted 0 -> 38 s
    for t in (108.0, 116.0, 125.0):
        assert phases.arrive(t) is None
    assert phases.arrive(200.0) == 31.5  # median of 38 and 25
    assert phases.arrive(200.5) is None
    assert phases.arrive(300.0) == 25.0  # median of 38, 25 and 1 (a phase of one rollout counts as 1 s)
