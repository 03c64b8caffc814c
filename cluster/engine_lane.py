"""The engine lane: the way a complete group goes to a replica's engine, and what it costs.

Every group a replica scores, whole or assembled from members, goes through one lane:

* the fair gate (:mod:`cluster.fair_share`): at most the engine's slots at once, each tenant its share;
* the work meter (:class:`~cluster.autoscaling.EngineWorkMeter`): what waits for the engine and
  what it runs, for the autoscaling policy (members that only wait for group-mates are not in it);
* the sleeper (:mod:`cluster.engine_sleep`), when the engine sleeps while idle: it wakes first;
* the scorer (:class:`~cluster.scorer.GroupScorer`): prompts, generation, parsing.

The lane is a :class:`~cluster.scorer.GroupScoring` for whole groups, and :attr:`EngineLane.assembled`
one for the groups the replica's assembler completed (they may move to another replica until the
engine takes them). An engine that died raises :class:`~cluster.engines.base.EngineDeadError` out of
either, for the replica to act on (it ends its process so that callers re-send elsewhere); from then
on the lane takes no group. Pure: no Ray, no
I/O of its own (the engine's aside).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

from cluster.autoscaling import Demand, EngineWorkMeter
from cluster.engine_sleep import EngineSleeper
from cluster.engines.base import EngineDeadError
from cluster.fair_share import FairGate
from cluster.protocol.schema import GroupRequest, GroupResult
from cluster.scorer import GroupScorer, GroupScoring

__all__ = ["CHARS_PER_TOKEN", "PROMPT_OVERHEAD_TOKENS", "AssembledGroups", "EngineLane", "estimated_tokens"]

# A group's prompt before it is built, roughly: its texts at about 4 characters a token, plus the
# template's own tokens. Charged when it goes to the engine; the real count settles it after.
CHARS_PER_TOKEN = 4
PROMPT_OVERHEAD_TOKENS = 64

Scored = Callable[[GroupRequest, GroupResult, float], None]


def estimated_tokens(group: GroupRequest) -> float:
    """What a group's prompt will cost, before it is built."""
    return ((len(group.source) + sum(len(candidate) for candidate in group.candidates)) / CHARS_PER_TOKEN
            + PROMPT_OVERHEAD_TOKENS)


class EngineLane(GroupScoring):
    """A replica's groups to its engine: fair gate, work meter, sleep, scorer (see the module docstring)."""

    def __init__(self, scorer: GroupScorer, gate: FairGate[GroupResult], sleeper: EngineSleeper | None = None,
                 on_scored: Scored | None = None, clock: Callable[[], float] = time.monotonic):
        """``on_scored(group, result, waited_s)``: called for every group the engine answered (metrics)."""
        self.scorer = scorer
        self.gate = gate
        self.sleeper = sleeper
        self.work = EngineWorkMeter()
        self.queued: set[str] = set()  # groups (their ids) that may still move: waiting at the gate
        self.groups_scored = 0  # groups whose engine path returned (a verdict or a flagged failure)
        self.lost: BaseException | None = None  # why the engine is gone (None: it serves)
        self._on_scored = on_scored
        self._clock = clock
        self.assembled = AssembledGroups(self)

    async def score_group(self, group: GroupRequest) -> GroupResult:
        """Score a whole group when its tenant's turn comes (it stays on this replica)."""
        return await self.score(group)

    async def score(self, group: GroupRequest, movable: bool = False) -> GroupResult:
        """Score ``group`` when its tenant's turn comes. ``movable``: until the engine takes it, the group
        is in :attr:`queued` (an assembled group may move to a new owner meanwhile)."""
        if self.lost is not None:
            raise EngineDeadError(f"the engine is lost: {self.lost!r}")
        estimate = estimated_tokens(group)
        meter = self.work
        meter.queued(estimate, len(group.candidates))
        at_engine = False
        used: float | None = None
        if movable:
            self.queued.add(group.group_id)

        async def at_the_engine() -> GroupResult:
            nonlocal at_engine
            if movable:
                self.queued.discard(group.group_id)
            # A sleeping engine wakes first (the group waits for it), and sleeps not while it generates.
            async with self.sleeper.awake() if self.sleeper is not None else contextlib.nullcontext():
                at_engine = True
                meter.started(self._clock())  # after the wake-up: it is no engine work
                return await self.scorer.score_group(group)

        def tokens(done: GroupResult) -> float:
            nonlocal used
            used = float(done.usage.prompt_tokens + done.usage.completion_tokens)
            return used

        try:
            result, waited = await self.gate.run(group.tenant, estimate, at_the_engine, tokens)
        except EngineDeadError as error:
            self.lose(error)
            raise
        finally:
            if movable:
                self.queued.discard(group.group_id)
            if at_engine:
                meter.finished(self._clock(), estimate, used)
            else:
                meter.withdrawn(estimate)
        self.groups_scored += 1
        if self._on_scored is not None:
            self._on_scored(group, result, waited)
        return result

    def lose(self, error: BaseException) -> None:
        """The engine is gone (a failed health check, a dead sleep): the lane takes no more groups."""
        self.lost = self.lost or error

    async def tend_sleep(self, demands: Iterable[Demand]) -> None:
        """Put an idle engine to sleep, or wake it for work: groups waiting for it, or an announced phase
        about to send groups (``cluster/engine_sleep.py``). Raises EngineDeadError as :meth:`score`."""
        if self.sleeper is None:
            return
        pending = self.work.waiting > 0  # members assembling are a forecast, not work
        try:
            await self.sleeper.check(pending=pending, demands=list(demands))
        except EngineDeadError as error:
            self.lose(error)
            raise


class AssembledGroups(GroupScoring):
    """The lane as a replica's assembler scores through it: a group it completed may move (to a new
    owner of its route key) until the engine takes it."""

    def __init__(self, lane: EngineLane):
        self.lane = lane

    async def score_group(self, group: GroupRequest) -> GroupResult:
        """Score an assembled group through the lane; it is in the lane's ``queued`` until the engine takes it."""
        return await self.lane.score(group, movable=True)
