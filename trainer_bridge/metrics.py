"""Counting rewards by outcome, so a default reward is never a silent number.

:class:`RewardCounters` is what a reward manager or the whole-batch path keeps as it goes;
:func:`metrics_from_extra_info` computes the same numbers from the ``reward_extra_info`` columns
verl puts into ``batch.non_tensor_batch`` (any process can log them). Pure Python.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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
    defaults: Counter[str] = field(default_factory=Counter)  # default rewards by reason

    def record(self, outcome: RewardOutcome, *, masked: bool = False, request_attempts: int = 1) -> None:
        """Count one rollout's outcome."""
        self.total += 1
        self.valid += outcome.valid
        self.failed += outcome.failed
        self.masked += masked
        self.retried += request_attempts > 1
        self.retries += max(0, request_attempts - 1)
        if outcome.failure:
            self.defaults[outcome.failure] += 1

    def as_metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """Flat metrics for a logger: counts, rates, retries, and defaults per reason."""
        return _metrics(
            self.total, self.valid, self.failed, self.masked, self.retried, self.retries, self.defaults, prefix
        )


def metrics_from_extra_info(extra: Mapping[str, Sequence[Any]], prefix: str = PREFIX) -> dict[str, float]:
    """The :class:`RewardCounters` metrics from per-row extra-info columns (lists or arrays)."""
    valid = list(extra.get("valid", ()))
    failures = [str(reason) for reason in extra.get("failure", ()) if reason]
    attempts = [int(value) for value in extra.get("request_attempts", ())]
    return _metrics(
        len(valid),
        sum(bool(v) for v in valid),
        sum(bool(v) for v in extra.get("failed", ())),
        sum(bool(v) for v in extra.get("masked", ())),
        sum(value > 1 for value in attempts),
        sum(max(0, value - 1) for value in attempts),
        Counter(failures),
        prefix,
    )


def _metrics(
    total: int,
    valid: int,
    failed: int,
    masked: int,
    retried: int,
    retries: int,
    defaults: Iterable[tuple[str, int]] | Counter[str],
    prefix: str,
) -> dict[str, float]:
    items = defaults.items() if isinstance(defaults, Counter) else defaults
    metrics = {
        f"{prefix}/rewards": float(total),
        f"{prefix}/valid": float(valid),
        f"{prefix}/failed": float(failed),
        f"{prefix}/masked": float(masked),
        f"{prefix}/retried": float(retried),
        f"{prefix}/retries": float(retries),
        f"{prefix}/valid_rate": valid / total if total else 0.0,
        f"{prefix}/failed_rate": failed / total if total else 0.0,
    }
    for reason, count in sorted(items):
        metrics[f"{prefix}/default/{reason}"] = float(count)
    return metrics
