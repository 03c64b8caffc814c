"""PhaseForecaster: generation phases found in request times, and the next one ahead (pure)."""

from __future__ import annotations

from cluster.demand_forecast import PhaseForecast, PhaseForecaster


def test_a_request_after_a_quiet_gap_opens_a_phase_announced_as_long_as_the_median_of_the_last():
    phases = PhaseForecaster(groups_per_phase=64, gap_s=10.0, first_phase_s=60.0)
    assert phases.arrive(0.0) == PhaseForecast(lasts_s=60.0, next_in_s=None)  # the first phase: nothing measured yet
    assert [phases.arrive(t) for t in (5.0, 12.0, 20.0, 29.0, 38.0)] == [None] * 5  # gaps under 10 s: one phase
    assert phases.arrive(100.0) == PhaseForecast(lasts_s=38.0, next_in_s=100.0)  # 0 -> 38 s, next opened 100 s later
    for t in (108.0, 116.0, 125.0):
        assert phases.arrive(t) is None
    assert phases.arrive(200.0) == PhaseForecast(lasts_s=31.5, next_in_s=100.0)  # medians of (38, 25), (100, 100)
    assert phases.arrive(200.5) is None
    # Medians of 38, 25 and 1 s (a phase of one request counts as 1 s) and of 100, 100 and 100.5 s.
    assert phases.arrive(300.5) == PhaseForecast(lasts_s=25.0, next_in_s=100.0)


def test_the_next_phase_is_announced_when_this_one_should_end_starting_a_period_after_this_one_opened():
    assert PhaseForecast(lasts_s=30.0, next_in_s=100.0).next_announcement() == (30.0, 70.0)
    assert PhaseForecast(lasts_s=30.0, next_in_s=None).next_announcement() is None  # one phase seen: no period yet
    # Phases back to back (an async trainer generating all the time): nothing to announce ahead.
    assert PhaseForecast(lasts_s=30.0, next_in_s=30.0).next_announcement() is None
