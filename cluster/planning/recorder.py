"""A run's trace, recorded as its client sends (pure: no Ray, no I/O, no clock of its own).

:class:`TraceRecorder` is told when each member (or whole group) of a run was first sent and, once
its group was scored, the group's engine tokens; :meth:`TraceRecorder.trace` makes the
:class:`~cluster.planning.trace.RunTrace` that ``grrm plan --trace`` replays. ``grrm_client``'s
``RewardClient`` feeds one when ``ClientConfig.trace_path`` is set, so every caller records alike.

Steps are found in the arrivals as the demand forecast finds phases (:func:`cluster.demand_forecast.opens_phase`):
a member sent after a quiet gap of at least ``phase_gap_s`` opens a new step. A step starts at its first
arrival and its generation lasts to its last; its training is the quiet time until the next step's
start (the last step's: unknown, 0, unless recording stopped at ``max_steps`` and the next step's start
was seen). Times are whatever clock the caller gives: Unix seconds in the client, so that several
runs' traces recorded on one shared pool line up (``cluster/planning/replay.py`` shifts them all by the
earliest start).

Bounded, whatever the caller does: at most ``max_steps`` steps (later arrivals are counted in
``dropped``, not kept), ``max_groups_per_step`` groups a step, and a group never more than its
``group_size`` members; a member sent again (the same key in the same group and step) is not a new
arrival. At the defaults (200 steps) a run of 128 groups of 8 a step holds about 200k arrival times,
about 2.3 MB of JSON (12 KB a step).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from cluster.demand_forecast import opens_phase
from cluster.planning.trace import GroupTrace, RunTrace, StepTrace

__all__ = ["DEFAULT_MAX_GROUPS_PER_STEP", "DEFAULT_MAX_STEPS", "MIN_PHASE_GAP_S", "TraceRecorder", "one_per_run"]

DEFAULT_MAX_STEPS = 200  # enough steps to see a run's pattern; a planner needs no more
DEFAULT_MAX_GROUPS_PER_STEP = 8192  # a GRPO batch of 8192 prompts is already huge
# Relative times are kept to the millisecond (the planner steps in 1 s ticks), so a step whose only
# arrival makes it instantaneous still lasts one resolution step (the format wants generation_s > 0),
# and a gap must exceed it for the next step to begin after this one's generation.
RESOLUTION_S = 0.001
MIN_PHASE_GAP_S = 0.01


@dataclass
class _Group:
    size: int
    arrivals: list[float] = field(default_factory=list)  # absolute, in the order they came
    keys: set[Hashable] = field(default_factory=set)  # members seen (those sent with a key)
    tokens: float | None = None


@dataclass
class _Step:
    start: float
    last: float
    groups: dict[Hashable, _Group] = field(default_factory=dict)


class TraceRecorder:
    """Records one run's arrivals into steps and groups; :meth:`trace` makes its :class:`RunTrace`."""

    def __init__(self, run: str, *, phase_gap_s: float = 10.0, max_steps: int = DEFAULT_MAX_STEPS,
                 max_groups_per_step: int = DEFAULT_MAX_GROUPS_PER_STEP) -> None:
        """``run``: the trace's run name (the client's tenant); ``phase_gap_s``: the quiet gap that ends
        a step; ``max_steps``, ``max_groups_per_step``: what is kept at most."""
        if phase_gap_s < MIN_PHASE_GAP_S:
            raise ValueError(f"phase_gap_s: {phase_gap_s}, must be at least {MIN_PHASE_GAP_S} s")
        if max_steps < 1 or max_groups_per_step < 1:
            raise ValueError("max_steps and max_groups_per_step: must be at least 1")
        self.run = run
        self.phase_gap_s = phase_gap_s
        self.max_steps = max_steps
        self.max_groups_per_step = max_groups_per_step
        self.dropped = 0  # arrivals not kept: beyond max_steps, max_groups_per_step or a group's size
        self._steps: list[_Step] = []
        self._last_arrival: float | None = None
        self._stopped_at: float | None = None  # the start of the first step not kept (max_steps reached)

    @property
    def steps(self) -> int:
        """Steps recorded so far."""
        return len(self._steps)

    def member_sent(self, group_id: Hashable, group_size: int, at: float, member: Hashable | None = None) -> bool:
        """Note a member's first send at ``at`` (seconds) to group ``group_id`` of ``group_size``;
        ``member``, its key in the group (index or id: a second send of it is not a new arrival; None:
        unknown, every call counts up to the group's size). Returns whether this ended a step (the
        previous one is now whole: the time to save the trace)."""
        return self._arrive(group_id, group_size, at, [member])

    def group_sent(self, group_id: Hashable, group_size: int, at: float) -> bool:
        """Note a whole group sent at ``at``: all its ``group_size`` members arrive at once. Returns
        whether this ended a step."""
        return self._arrive(group_id, group_size, at, range(group_size))

    def group_answered(self, group_id: Hashable, tokens: float | None = None) -> None:
        """Note the engine tokens (prompt and completion) the scoring of ``group_id`` took, in its
        latest step: kept once per group; 0 or None is not a measurement."""
        if not tokens or tokens <= 0:
            return
        for step in reversed(self._steps):  # an answer may come after the next step opened
            group = step.groups.get(group_id)
            if group is not None:
                if group.tokens is None:
                    group.tokens = float(tokens)
                return

    def trace(self, *, ended_only: bool = False) -> RunTrace | None:
        """The run's trace so far (None before anything was sent). Its last step's training is 0
        unless the step after it was seen. ``ended_only``: only the steps that have ended (a later one
        opened), without the one still going on (None while the first goes on): what a file written
        as a step ends holds, so that a run that stops without closing leaves no partial step."""
        kept = len(self._steps) - (ended_only and self._stopped_at is None)
        if kept < 1:
            return None
        steps = []
        for index, step in enumerate(self._steps[:kept]):
            generation_s = max(round(step.last - step.start, 3), RESOLUTION_S)
            ends = self._steps[index + 1].start if index + 1 < len(self._steps) else self._stopped_at
            training_s = 0.0 if ends is None else max(0.0, round(ends - step.start - generation_s, 3))
            groups = [GroupTrace(members_at=[round(at - step.start, 3) for at in group.arrivals], tokens=group.tokens,
                                 group_id=str(group_id))
                      for group_id, group in step.groups.items()]
            steps.append(StepTrace(start_s=step.start, generation_s=generation_s, training_s=training_s,
                                   groups=groups))
        group_size = max(group.size for step in self._steps[:kept] for group in step.groups.values())
        return RunTrace(run=self.run, group_size=group_size, steps=steps)

    def _arrive(self, group_id: Hashable, group_size: int, at: float, members: Sequence[Hashable | None]) -> bool:
        if group_size < 1:
            raise ValueError(f"group_size: {group_size}, must be at least 1")
        if self._stopped_at is not None:
            self.dropped += len(members)
            return False
        current = self._steps[-1].groups.get(group_id) if self._steps else None
        if current is not None:  # a member sent again is no arrival: it neither extends nor opens a step
            members = [member for member in members if member is None or member not in current.keys]
            if not members:
                return False
        ended = False
        if opens_phase(self._last_arrival, at, self.phase_gap_s):
            ended = bool(self._steps)
            if len(self._steps) >= self.max_steps:
                self._stopped_at = at
                self.dropped += len(members)
                return ended
            self._steps.append(_Step(start=at, last=at))
            current = None
        # Callers' send times may come slightly out of order (concurrent senders stamp them first).
        self._last_arrival = at if self._last_arrival is None else max(self._last_arrival, at)
        step = self._steps[-1]
        step.last = max(step.last, at)
        if current is None:
            if len(step.groups) >= self.max_groups_per_step:
                self.dropped += len(members)
                return ended
            current = step.groups.setdefault(group_id, _Group(size=group_size))
        for member in members:
            if len(current.arrivals) >= current.size:
                self.dropped += 1
                continue
            if member is not None:
                current.keys.add(member)
            current.arrivals.append(max(at, step.start))
        return ended


def one_per_run(traces: Sequence[RunTrace], phase_gap_s: float = 10.0) -> list[RunTrace]:
    """``traces`` with the parts of one run merged: traces of the same ``run`` name are what several
    processes of that run recorded (verl's reward workers each send a share of every group), so their
    arrivals are replayed through one recorder, groups joined by ``group_id`` (a part's group without
    one stays its own), steps found again by ``phase_gap_s``. Runs keep their first part's order."""
    parts: dict[str, list[RunTrace]] = {}
    for trace in traces:
        parts.setdefault(trace.run, []).append(trace)
    merged = []
    for run, pieces in parts.items():
        if len(pieces) == 1:
            merged.append(pieces[0])
            continue
        arrivals, tokens = [], {}
        for number, piece in enumerate(pieces):
            for index, step in enumerate(piece.steps):
                for position, group in enumerate(step.groups):
                    key = group.group_id or f"part{number}/step{index}/group{position}"
                    arrivals += [(step.start_s + at, key, piece.group_size) for at in group.members_at]
                    if group.tokens is not None:
                        tokens[key] = group.tokens
        recorder = TraceRecorder(run, phase_gap_s=phase_gap_s, max_steps=sum(len(piece.steps) for piece in pieces),
                                 max_groups_per_step=sum(len(step.groups) for piece in pieces for step in piece.steps))
        for at, key, size in sorted(arrivals, key=lambda arrival: arrival[0]):
            recorder.member_sent(key, size, at)
        for key, count in tokens.items():
            recorder.group_answered(key, count)
        merged.append(recorder.trace())
    return merged
