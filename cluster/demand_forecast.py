"""When a run's next burst of rewards begins, and what to announce for it (pure, no I/O).

A GRPO step asks for rewards in a burst: its rollouts finish during the generation phase, then
nothing comes while the trainer trains. A caller sees only when its rewards are asked for, so it
finds the phases there: a request after a quiet gap opens a phase. It announces the step's groups
(one per prompt of the generation batch) over the time its earlier phases lasted, so that the reward
pool scales for them (``cluster/autoscaling.py``), and, once two phases were seen, the next phase
ahead of it: when the current one is expected to end, it announces the next, starting one step's
period after this one opened. The pool then starts replicas a cold start before the burst instead of
at it, and may let them go while the trainer trains. Several callers of one run announce alike; the
service keeps a tenant's latest announcement, so they count once.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["PhaseForecast", "PhaseForecaster"]


@dataclass(frozen=True)
class PhaseForecast:
    """What to announce when a phase opens (seconds from its opening)."""

    lasts_s: float  # how long this phase is expected to last
    next_in_s: float | None  # when the next phase is expected to open (None: fewer than two phases seen)

    def next_announcement(self) -> tuple[float, float] | None:
        """(when to announce the next phase, its starts_in_s then), from this phase's opening; None when
        unknown or when the next phase would open before this one is expected to end."""
        if self.next_in_s is None or self.next_in_s <= self.lasts_s:
            return None
        return self.lasts_s, self.next_in_s - self.lasts_s


@dataclass
class PhaseForecaster:
    """Finds generation phases in request times (seconds) and sizes their announcements."""

    groups_per_phase: int
    gap_s: float = 10.0  # a quiet gap at least this long ends a phase
    first_phase_s: float = 60.0  # the announced length before any phase was seen whole
    _phase_started: float | None = None
    _last_arrival: float | None = None
    _durations: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    _periods: deque[float] = field(default_factory=lambda: deque(maxlen=5))  # phase opening to the next's

    def arrive(self, now: float) -> PhaseForecast | None:
        """Note one request; when it opens a phase, the forecast to announce (the medians of the last
        phases seen whole and of the last periods). None otherwise."""
        opens = self._last_arrival is None or now - self._last_arrival >= self.gap_s
        if opens and self._phase_started is not None and self._last_arrival is not None:
            self._durations.append(max(1.0, self._last_arrival - self._phase_started))
            self._periods.append(now - self._phase_started)
        self._last_arrival = now
        if not opens:
            return None
        self._phase_started = now
        return PhaseForecast(
            lasts_s=statistics.median(self._durations) if self._durations else self.first_phase_s,
            next_in_s=statistics.median(self._periods) if self._periods else None,
        )
