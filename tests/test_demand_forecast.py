"""PhaseForecaster: generation phases found in request times, and the next one ahead (pure)."""

from __future__ import annotations

from unittest.mock import ANY

import pytest

from cluster.demand_forecast import PhaseForecast, PhaseForecaster, group_completion_profile


def test_a_request_after_a_quiet_gap_opens_a_phase_announced_as_long_as_the_median_of_the_last():
    phases = PhaseForecaster(groups_per_phase=64, gap_s=10.0, first_phase_s=60.0)
    assert phases.arrive(0.0) == PhaseForecast(lasts_s=60.0, next_in_s=None)  # the first phase: nothing measured yet
    assert [phases.arrive(t) for t in (5.0, 12.0, 20.0, 29.0, 38.0)] == [None] * 5  # gaps under 10 s: one phase
    assert phases.arrive(100.0) == PhaseForecast(lasts_s=38.0, next_in_s=100.0, profile=ANY)  # 0 -> 38 s, next opened 100 s later
    for t in (108.0, 116.0, 125.0):
        assert phases.arrive(t) is None
    assert phases.arrive(200.0) == PhaseForecast(lasts_s=31.5, next_in_s=100.0, profile=ANY)  # medians of (38, 25), (100, 100)
    assert phases.arrive(200.5) is None
    # Medians of 38, 25 and 1 s (a phase of one request counts as 1 s) and of 100, 100 and 100.5 s.
    assert phases.arrive(300.5) == PhaseForecast(lasts_s=25.0, next_in_s=100.0, profile=ANY)


def test_the_next_phase_is_announced_when_this_one_should_end_starting_a_period_after_this_one_opened():
    assert PhaseForecast(lasts_s=30.0, next_in_s=100.0).next_announcement() == (30.0, 70.0)
    assert PhaseForecast(lasts_s=30.0, next_in_s=None).next_announcement() is None  # one phase seen: no period yet
    # Phases back to back (an async trainer generating all the time): nothing to announce ahead.
    assert PhaseForecast(lasts_s=30.0, next_in_s=30.0).next_announcement() is None


def test_groups_complete_at_their_last_rollout_so_even_rollouts_make_a_crowded_end():
    # Rollouts evenly over 100 s, groups of 4: a group is complete by x when all four are, x ** 4.
    rollouts = [k + 0.5 for k in range(100)]
    profile = group_completion_profile(rollouts, 100.0, group_size=4, slices=4)
    assert sum(profile) == pytest.approx(1.0)
    assert profile == pytest.approx((0.25 ** 4, 0.5 ** 4 - 0.25 ** 4, 0.75 ** 4 - 0.5 ** 4, 1 - 0.75 ** 4))
    # Whole groups (TRL's calls): the profile is when they came.
    assert group_completion_profile([10.0, 10.0, 90.0, 95.0], 100.0, group_size=1, slices=2) == (0.5, 0.5)
    assert group_completion_profile([], 100.0, group_size=4) == ()


def test_a_phase_is_announced_with_the_profile_of_the_phases_seen_before_it():
    phases = PhaseForecaster(groups_per_phase=8, gap_s=45.0, first_phase_s=40.0, group_size=2)
    opened = phases.arrive(0.0)
    assert opened is not None and opened.profile == phases.profile()  # before any: rollouts assumed even
    assert opened.profile[-1] > 0.15 > opened.profile[0]
    for t in (30.0, 31.0, 32.0, 33.0, 34.0, 35.0, 36.0, 37.0, 38.0, 39.0, 40.0):
        phases.arrive(t)  # most of this phase's rollouts in its last quarter ...
    phases.arrive(40.0, counts=False)  # ... (a call's rewards coming back adds none)
    second = phases.arrive(100.0)
    assert second is not None and second.lasts_s == 40.0
    assert sum(second.profile[:7]) == pytest.approx((1 / 12) ** 2)  # 1 of 12 rollouts before 28 s, squared
    assert second.profile[-1] > 0.5
