"""Counting rewards by outcome, so a default reward is never a silent number.

:class:`RewardCounters` is what a reward manager or the whole-batch path keeps as it goes;
:func:`metrics_from_extra_info` computes the same numbers from the ``reward_extra_info`` columns
verl puts into ``batch.non_tensor_batch`` (any process can log them). Pure Python.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer_bridge.rewards import RewardOutcome

PREFIX = "grrm"


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

    def record(
        self,
        outcome: RewardOutcome,
        *,
        masked: bool = False,
        request_attempts: int = 1,
        rejoins: int = 0,
        worker_in_flight: int = 0,
    ) -> None:
        """Count one rollout's outcome."""
        self.total += 1
        self.valid += outcome.valid
        self.failed += outcome.failed
        self.masked += masked
        self.retried += request_attempts > 1
        self.retries += max(0, request_attempts - 1)
        self.rejoins += rejoins
        self.worker_in_flight_max = max(self.worker_in_flight_max, worker_in_flight)
        if outcome.failure:
            self.defaults[outcome.failure] += 1

    def as_metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """Flat metrics for a logger: counts, rates, retries, re-joins, and defaults per reason."""
        return _metrics(self, prefix)


def metrics_from_extra_info(extra: Mapping[str, Sequence[Any]], prefix: str = PREFIX) -> dict[str, float]:
    """The :class:`RewardCounters` metrics from per-row extra-info columns (lists or arrays)."""
    valid = list(extra.get("valid", ()))
    failures = [str(reason) for reason in extra.get("failure", ()) if reason]
    attempts = [int(value) for value in extra.get("request_attempts", ())]
    counters = RewardCounters(
        total=len(valid),
        valid=sum(bool(v) for v in valid),
        failed=sum(bool(v) for v in extra.get("failed", ())),
        masked=sum(bool(v) for v in extra.get("masked", ())),
        retried=sum(value > 1 for value in attempts),
        retries=sum(max(0, value - 1) for value in attempts),
        rejoins=sum(int(value) for value in extra.get("rejoins", ())),
        worker_in_flight_max=max((int(value) for value in extra.get("worker_in_flight", ())), default=0),
        defaults=Counter(failures),
    )
    return _metrics(counters, prefix)


def _metrics(counters: RewardCounters, prefix: str) -> dict[str, float]:
    total, valid, failed = counters.total, counters.valid, counters.failed
    metrics = {
        f"{prefix}/rewards": float(total),
        f"{prefix}/valid": float(valid),
        f"{prefix}/failed": float(failed),
        f"{prefix}/masked": float(counters.masked),
        f"{prefix}/retried": float(counters.retried),
        f"{prefix}/retries": float(counters.retries),
        f"{prefix}/rejoins": float(counters.rejoins),
        f"{prefix}/worker_in_flight_max": float(counters.worker_in_flight_max),
        f"{prefix}/valid_rate": valid / total if total else 0.0,
        f"{prefix}/failed_rate": failed / total if total else 0.0,
    }
    for reason, count in sorted(counters.defaults.items()):
        metrics[f"{prefix}/default/{reason}"] = float(count)
    return metrics
