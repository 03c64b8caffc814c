"""A training step's reward metrics (``grrm/...``), so a default reward is never a silent number.

:func:`step_metrics` computes them from the rows' ``reward_extra_info`` (verl puts it into every
step; any process can log them): counts of rewards by outcome (:class:`RewardCounters`), each part
of the service's recipe (``grrm/component/<name>/mean``, :func:`cluster.protocol.members.component_means`),
and how much reward time the step exposed against the physical limit (:func:`exposure_metrics`, with
the bound of :mod:`grrm_client.adapters.verl.exposure`). The verl trainers' step metrics
(:mod:`grrm_client.adapters.verl.verl_metrics`) and the whole-batch path call it; a reward manager keeps a
:class:`RewardCounters` over its lifetime. Pure Python.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.protocol.members import component_means
from grrm_client.adapters.verl.exposure import ScoredGroup, peak_concurrency, schedule_finish_bound
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, row_components

__all__ = ["PREFIX", "RewardCounters", "exposure_metrics", "step_metrics"]

PREFIX = "grrm"


def step_metrics(infos: Iterable[Mapping[str, Any] | None], prefix: str = PREFIX) -> dict[str, float]:
    """The bridge's metrics over one step's ``reward_extra_info`` rows; {} when none is the bridge's
    (rows of other reward managers, and ``None``, are skipped): the counts by outcome, the recipe's
    parts and the exposure figures."""
    ours = [info for info in infos if isinstance(info, Mapping) and all(key in info for key in EXTRA_INFO_KEYS)]
    if not ours:
        return {}
    counters = RewardCounters()
    for info in ours:
        counters.record(info)
    parts = component_means((row_components(info) for info in ours), f"{prefix}/component")
    return {**counters.as_metrics(prefix), **parts, **exposure_metrics(ours, prefix)}


@dataclass
class RewardCounters:
    """Rewards handed out, by outcome (counts since creation)."""

    total: int = 0
    valid: int = 0
    failed: int = 0
    masked: int = 0
    retried: int = 0  # rewards whose request needed more than one transport attempt
    retries: int = 0  # transport attempts beyond the first, over all requests
    rejoins: int = 0  # re-joins of groups still incomplete at the replica's assembly timeout
    worker_in_flight_max: int = 0  # most reward calls running at once in the reward worker
    defaults: Counter[str] = field(default_factory=Counter)  # default rewards by reason

    def record(self, info: Mapping[str, Any]) -> None:
        """Count one rollout's reward from its ``reward_extra_info`` row
        (:func:`grrm_client.adapters.verl.extra_info.extra_info`)."""
        attempts = int(info["request_attempts"])
        self.total += 1
        self.valid += bool(info["valid"])
        self.failed += bool(info["failed"])
        self.masked += bool(info["masked"])
        self.retried += attempts > 1
        self.retries += max(0, attempts - 1)
        self.rejoins += int(info["rejoins"])
        self.worker_in_flight_max = max(self.worker_in_flight_max, int(info["worker_in_flight"]))
        if info["failure"]:
            self.defaults[str(info["failure"])] += 1

    def as_metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """Flat metrics for a logger: counts, rates, retries, re-joins, and defaults per reason."""
        total = self.total
        metrics = {
            f"{prefix}/rewards": float(total),
            f"{prefix}/valid": float(self.valid),
            f"{prefix}/failed": float(self.failed),
            f"{prefix}/masked": float(self.masked),
            f"{prefix}/retried": float(self.retried),
            f"{prefix}/retries": float(self.retries),
            f"{prefix}/rejoins": float(self.rejoins),
            f"{prefix}/worker_in_flight_max": float(self.worker_in_flight_max),
            f"{prefix}/valid_rate": self.valid / total if total else 0.0,
            f"{prefix}/failed_rate": self.failed / total if total else 0.0,
        }
        for reason, count in sorted(self.defaults.items()):
            metrics[f"{prefix}/default/{reason}"] = float(count)
        return metrics


def exposure_metrics(infos: Iterable[Mapping[str, Any]], prefix: str = PREFIX) -> dict[str, float]:
    """The exposure figures of one step from its rollouts' ``reward_extra_info`` ({} if none was
    timed): the exposed reward time, the limit (:mod:`grrm_client.adapters.verl.exposure`), queueing,
    scoring and the wait for group-mates.

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
