"""Exposed reward time against the physical limit: the schedule bound (grrm_client/adapters/verl/exposure.py)
checked against brute force, and the step figures from reward_extra_info rows (grrm_client/adapters/verl/metrics.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from grrm_client.adapters.verl.exposure import ScoredGroup, peak_concurrency, schedule_finish_bound
from grrm_client.adapters.verl.metrics import exposure_metrics


def optimal_finish(groups: list[ScoredGroup], capacity: int) -> float:
    """The optimal non-preemptive finish time, by brute force: every order, each group on the slot
    that frees first (an optimal schedule is among these list schedules)."""
    best = float("inf")
    for order in itertools.permutations(groups):
        slots = [0.0] * capacity
        for group in order:
            slot = min(range(capacity), key=slots.__getitem__)
            slots[slot] = max(slots[slot], group.release) + group.duration
        best = min(best, max(slots))
    return best


def group(release: float, duration: float) -> ScoredGroup:
    return ScoredGroup(release=release, start=release, end=release + duration)


@pytest.mark.parametrize("seed", range(40))
def test_the_bound_never_exceeds_the_optimal_schedule(seed):
    rng = random.Random(seed)
    groups = [group(rng.choice([0, 0, 1, 2, 5]) * rng.random(), rng.uniform(0.1, 3)) for _ in range(rng.randint(1, 6))]
    capacity = rng.randint(1, 3)
    bound = schedule_finish_bound(groups, capacity)
    assert bound <= optimal_finish(groups, capacity) + 1e-9
    assert bound >= max(g.release + g.duration for g in groups)  # at least the last group's own time


def test_the_bound_counts_queueing_that_the_last_group_alone_misses():
    # Six 1 s groups released together on 2 slots: 3 s, although each group alone takes 1 s.
    groups = [group(10.0, 1.0) for _ in range(6)]
    assert schedule_finish_bound(groups, 2) == pytest.approx(13.0) == optimal_finish(groups, 2)
    assert schedule_finish_bound(groups, 6) == pytest.approx(11.0)


def test_peak_concurrency_counts_overlapping_scorings():
    groups = [ScoredGroup(0, 0, 2), ScoredGroup(0, 1, 3), ScoredGroup(0, 2, 4), ScoredGroup(0, 2.5, 3)]
    assert peak_concurrency(groups) == 3  # (1,3), (2,4), (2.5,3); the first ended at 2
    assert peak_concurrency([]) == 1


def row(group_id, sent, complete, start, end, answered):
    return {"group_id": group_id, "sent_at": sent, "complete_at": complete, "scoring_started_at": start,
            "scoring_ended_at": end, "answered_at": answered}


def test_step_figures_from_reward_extra_info():
    rows = [
        row("a", 100.0, 101.0, 101.0, 103.0, 103.1),
        row("a", 101.0, 101.0, 101.0, 103.0, 103.1),
        row("b", 102.0, 102.0, 103.0, 105.0, 105.2),  # queued 1 s behind a (one slot)
        row("b", 101.5, 102.0, 103.0, 105.0, 105.2),
        {"sent_at": 102.5, "answered_at": 102.6, "group_id": "", "complete_at": 0.0,  # a default reward
         "scoring_started_at": 0.0, "scoring_ended_at": 0.0},
    ]
    metrics = exposure_metrics(rows)
    assert metrics["grrm/exposed_reward_s"] == pytest.approx(105.2 - 102.5)
    # One slot: a (released 101, 2 s) then b (released 102, 2 s) finish at 105 at the earliest.
    assert metrics["grrm/scoring_concurrency"] == 1
    assert metrics["grrm/limit_s"] == pytest.approx(105.0 - 102.5)
    assert metrics["grrm/exposed_vs_limit"] == pytest.approx(2.7 / 2.5)
    assert metrics["grrm/queue_s_max"] == pytest.approx(1.0) and metrics["grrm/scoring_s_mean"] == pytest.approx(2.0)
    assert metrics["grrm/group_wait_s_max"] == pytest.approx(1.0)
    assert exposure_metrics([{"sent_at": 0.0, "answered_at": 0.0}]) == {}
