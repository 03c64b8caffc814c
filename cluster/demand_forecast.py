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

import bisect
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["PROFILE_SLICES", "PhaseForecast", "PhaseForecaster", "group_completion_profile", "opens_phase"]

PROFILE_SLICES = 10  # equal slices of a phase in an announced profile


def opens_phase(last_arrival: float | None, now: float, gap_s: float) -> bool:
    """Whether a request at ``now`` opens a generation phase: it is the first, or came after a quiet
    gap of at least ``gap_s`` seconds since the previous one (``last_arrival``). The one rule of the
    clients' announcements and of their recorded traces (``cluster/planning/recorder.py``)."""
    return last_arrival is None or now - last_arrival >= gap_s


def group_completion_profile(arrivals_s: Sequence[float], lasts_s: float, group_size: int,
                             slices: int = PROFILE_SLICES) -> tuple[float, ...]:
    """The share of a phase's groups completed in each of ``slices`` equal slices of it, from when its
    requests came (seconds from the phase's opening; ``lasts_s`` its length). Each request is one
    rollout of a group of ``group_size`` (1: each request is a whole group); a group is complete at
    its last rollout, so, the rollouts of a group finishing independently, the share of groups
    complete by time x is F(x) ** group_size, F the share of requests come by x. Empty when no
    request came."""
    if not arrivals_s:
        return ()
    ordered = sorted(arrivals_s)
    complete = [0.0] + [(bisect.bisect_right(ordered, lasts_s * edge / slices) / len(ordered)) ** max(1, group_size)
                        for edge in range(1, slices)] + [1.0]
    return tuple(later - earlier for earlier, later in zip(complete, complete[1:]))


@dataclass(frozen=True)
class PhaseForecast:
    """What to announce when a phase opens (seconds from its opening)."""

    lasts_s: float  # how long this phase is expected to last
    next_in_s: float | None  # when the next phase is expected to open (None: fewer than two phases seen)
    # The share of its groups expected in each equal slice of it (empty: unknown, evenly).
    profile: tuple[float, ...] = ()

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
    group_size: int = 1  # rollouts per group, one request each (1: each request is a whole group)
    _phase_started: float | None = None
    _last_arrival: float | None = None
    _durations: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    _periods: deque[float] = field(default_factory=lambda: deque(maxlen=5))  # phase opening to the next's
    _profiles: deque[tuple[float, ...]] = field(default_factory=lambda: deque(maxlen=5))
    _arrivals: list[float] = field(default_factory=list)  # the open phase's requests, from its opening

    def arrive(self, now: float, *, counts: bool = True) -> PhaseForecast | None:
        """Note one request (``counts`` False: the phase goes on, but no rollout came now, e.g. a
        trainer's rewards came back); when it opens a phase, the forecast to announce (the medians
        of the last phases seen whole and of the last periods, the mean of their profiles). None
        otherwise."""
        opens = opens_phase(self._last_arrival, now, self.gap_s)
        if opens and self._phase_started is not None and self._last_arrival is not None:
            lasted = max(1.0, self._last_arrival - self._phase_started)
            self._durations.append(lasted)
            self._periods.append(now - self._phase_started)
            profile = group_completion_profile(self._arrivals, lasted, self.group_size)
            if profile:
                self._profiles.append(profile)
            self._arrivals = []
        self._last_arrival = now
        if opens:
            self._phase_started = now
        if counts:
            self._arrivals.append(now - self._phase_started)
        if not opens:
            return None
        return PhaseForecast(
            lasts_s=statistics.median(self._durations) if self._durations else self.first_phase_s,
            next_in_s=statistics.median(self._periods) if self._periods else None,
            profile=self.profile(),
        )

    def profile(self) -> tuple[float, ...]:
        """The profile to announce: the mean of the last phases' (seen whole), or, before any, that of
        rollouts finishing evenly over the phase (groups of one: evenly, the empty profile)."""
        if self._profiles:
            return tuple(statistics.fmean(shares) for shares in zip(*self._profiles))
        if self.group_size < 2:
            return ()
        # Rollouts come evenly (a share x by x): a group of n is complete by x with x ** n.
        complete = [(edge / PROFILE_SLICES) ** self.group_size for edge in range(PROFILE_SLICES + 1)]
        return tuple(later - earlier for earlier, later in zip(complete, complete[1:]))
