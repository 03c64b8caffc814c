"""When a run's next burst of rewards begins, and what to announce for it (pure, no I/O).

A GRPO step asks for rewards in a burst: its rollouts finish during the generation phase, then
nothing comes while the trainer trains. A reward worker sees only its rollouts' arrival times, so
it finds the phases there: a rollout after a quiet gap opens a phase. It then announces the step's
groups (one per prompt of the generation batch) over the time its earlier phases lasted, so that the
reward pool scales for them (``cluster/autoscaling.py``). Several workers of one run announce the
same step; the service keeps a tenant's latest announcement, so they count once.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["PhaseForecaster"]


@dataclass
class PhaseForecaster:
    """Finds generation phases in rollout arrival times (seconds) and sizes their announcements."""

    groups_per_phase: int
    gap_s: float = 10.0  # a quiet gap at least this long ends a phase
    first_phase_s: float = 60.0  # the announced length before any phase was seen whole
    _phase_started: float | None = None
    _last_arrival: float | None = None
    _durations: deque[float] = field(default_factory=lambda: deque(maxlen=5))

    def arrive(self, now: float) -> float | None:
        """Note one rollout's arrival; when it opens a phase, how long that phase is expected to last
        (the median of the last phases seen whole) — the cue to announce. None otherwise."""
        opens = self._last_arrival is None or now - self._last_arrival >= self.gap_s
        if opens and self._phase_started is not None and self._last_arrival is not None:
            self._durations.append(max(1.0, self._last_arrival - self._phase_started))
        self._last_arrival = now
        if not opens:
            return None
        self._phase_started = now
        return statistics.median(self._durations) if self._durations else self.first_phase_s
