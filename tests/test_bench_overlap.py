"""bench/overlap.py's scheduling model (pure): the policies, and the limit it reports against."""

from __future__ import annotations

import random

import pytest

from bench.overlap import schedule
from grrm_client.adapters.verl.exposure import ScoredGroup, schedule_finish_bound


def test_fifo_serves_groups_in_arrival_order_on_free_slots():
    # One slot: a (t=0, 2 s), then b and c both waiting at t=2; FIFO takes b (arrived first).
    assert schedule([0.0, 1.0, 1.5], [2.0, 1.0, 5.0], slots=1) == [2.0, 3.0, 8.0]


def test_largest_first_takes_the_largest_waiting_group():
    # Same jobs: at t=2 the larger c goes before b.
    assert schedule([0.0, 1.0, 1.5], [2.0, 1.0, 5.0], slots=1, largest_first=True) == [2.0, 8.0, 7.0]


def test_a_slot_idles_until_the_next_arrival():
    assert schedule([0.0, 10.0], [1.0, 1.0], slots=2) == [1.0, 11.0]
    # Two groups complete together: each waits for its arrival, on its own slot.
    assert schedule([0.0, 5.0, 5.0], [1.0, 1.0, 1.0], slots=2) == [1.0, 6.0, 6.0]


@pytest.mark.parametrize("largest_first", [False, True])
def test_no_schedule_beats_the_reported_limit(largest_first):
    rng = random.Random(7)
    for _ in range(200):
        jobs = rng.randint(1, 30)
        # rounded: groups often complete together (rollouts clipped at the same max length)
        arrivals = [round(rng.uniform(0, 10)) for _ in range(jobs)]
        work = [rng.uniform(0.1, 3) for _ in range(jobs)]
        slots = rng.randint(1, 4)
        finish = schedule(arrivals, work, slots, largest_first=largest_first)
        starts = [f - w for f, w in zip(finish, work)]
        assert all(start >= arrival - 1e-9 for start, arrival in zip(starts, arrivals))
        # never more than `slots` at once (a start equal to an end, up to rounding, follows it)
        events = sorted([(round(s, 9), 1) for s in starts] + [(round(f, 9), -1) for f in finish])
        running = 0
        for _, change in events:
            running += change
            assert running <= slots
        bound = schedule_finish_bound([ScoredGroup(a, 0.0, w) for a, w in zip(arrivals, work)], slots)
        assert max(finish) >= bound - 1e-9
