"""How much reward time a training step exposes, against the physical limit (docs/exposure.md).

From one step's ``reward_extra_info`` (every rollout's times, :class:`grrm_client.adapters.verl.extra_info.RewardTiming`):

* **exposed reward** ``last answer - last rollout finished``: how long the step waited for rewards
  after its last rollout was done (``answered_at`` and ``sent_at``, both on the bridge's clock);
* **the limit**: how long it must have waited at least, whatever the reward service did. Each group
  becomes scorable when its last member reaches a replica (``complete_at``, its release ``r``) and
  takes its measured scoring time ``p`` (``scoring_ended_at - scoring_started_at``); the replicas
  scored at most ``m`` groups at once (the step's peak). No schedule of those groups on ``m`` slots
  finishes before

      F = max( max_j (r_j + p_j),  max_k ( r_k + sum_{j: r_j >= r_k} p_j / m ) )

  (a group cannot end before its release plus its own time; the work released at or after ``r_k``
  cannot start before ``r_k`` and ``m`` slots do at most ``m`` seconds of it per second). ``F`` is a
  lower bound of every schedule's finish time, the optimal one's included (optimal non-preemptive
  scheduling is NP-hard; ``tests/bridge/test_bridge_exposure.py`` checks ``F`` against brute force),
  so a ratio against it is conservative. The limit is ``F - last rollout finished``; the last
  group's own scoring time is only its first term;
* queueing (``scoring_started_at - complete_at``), scoring, and the wait for group-mates
  (``complete_at - sent_at``), mean and max.

Pure Python: the step's figures are computed by :func:`grrm_client.adapters.verl.metrics.exposure_metrics`
(part of every step's metrics); the benchmarks use the bound directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ScoredGroup", "peak_concurrency", "schedule_finish_bound"]


@dataclass(frozen=True, slots=True)
class ScoredGroup:
    """One group's times on its replica."""

    release: float  # its last member arrived (complete_at)
    start: float  # scoring started
    end: float  # scoring ended

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


def peak_concurrency(groups: Sequence[ScoredGroup]) -> int:
    """The most groups whose scoring overlapped at one moment (at least 1)."""
    events = sorted([(group.start, 1) for group in groups] + [(group.end, -1) for group in groups],
                    key=lambda event: (event[0], event[1]))  # an end before a start at the same instant
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return max(1, peak)


def schedule_finish_bound(groups: Sequence[ScoredGroup], capacity: int) -> float:
    """``F`` of the module docstring: no schedule on ``capacity`` slots finishes these groups earlier."""
    if not groups:
        return 0.0
    if capacity < 1:
        raise ValueError(f"capacity: must be at least 1, got {capacity}")
    bound = max(group.release + group.duration for group in groups)
    remaining = sum(group.duration for group in groups)
    for group in sorted(groups, key=lambda g: g.release):
        bound = max(bound, group.release + remaining / capacity)
        remaining -= group.duration
    return bound
