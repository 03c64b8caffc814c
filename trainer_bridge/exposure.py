"""How much reward time a training step exposes, against the physical limit (docs/exposure.md).

From one step's ``reward_extra_info`` (every rollout's times, :mod:`trainer_bridge.timing`):

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

Pure Python: the same numbers in verl's step metrics (:mod:`trainer_bridge.verl_metrics`) and in
the benchmarks.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ScoredGroup", "exposure_metrics", "peak_concurrency", "schedule_finish_bound"]


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


def exposure_metrics(infos: Iterable[Mapping[str, Any]], prefix: str = "grrm") -> dict[str, float]:
    """The exposure figures of one step from its rollouts' ``reward_extra_info`` ({} if none was timed).

    Rows without a scored group (defaults, invalid groups) count for the last rollout and the last
    answer, not for the limit.
    """
    rows = [info for info in infos if float(info.get("sent_at") or 0) > 0 and float(info.get("answered_at") or 0) > 0]
    if not rows:
        return {}
    last_rollout = max(float(info["sent_at"]) for info in rows)
    last_answer = max(float(info["answered_at"]) for info in rows)
    groups: dict[str, ScoredGroup] = {}
    waits = []
    for info in rows:
        start, end, release = (float(info.get(key) or 0) for key in ("scoring_started_at", "scoring_ended_at", "complete_at"))
        if start > 0 and end >= start and release > 0:
            groups.setdefault(str(info.get("group_id", "")), ScoredGroup(release=release, start=start, end=end))
            waits.append(max(0.0, release - float(info["sent_at"])))
    exposed = max(0.0, last_answer - last_rollout)
    metrics = {f"{prefix}/exposed_reward_s": exposed}
    if groups:
        scored = list(groups.values())
        capacity = peak_concurrency(scored)
        limit = max(0.0, schedule_finish_bound(scored, capacity) - last_rollout)
        queue = [max(0.0, group.start - group.release) for group in scored]
        scoring = [group.duration for group in scored]
        metrics.update({
            f"{prefix}/limit_s": limit,
            f"{prefix}/exposed_vs_limit": exposed / limit if limit > 0 else 0.0,
            f"{prefix}/scoring_concurrency": float(capacity),
            f"{prefix}/queue_s_mean": statistics.fmean(queue),
            f"{prefix}/queue_s_max": max(queue),
            f"{prefix}/scoring_s_mean": statistics.fmean(scoring),
            f"{prefix}/scoring_s_max": max(scoring),
            f"{prefix}/group_wait_s_mean": statistics.fmean(waits),
            f"{prefix}/group_wait_s_max": max(waits),
        })
    return metrics
