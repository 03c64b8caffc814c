"""When one replica's engine sleeps and wakes (``replicas.autoscaling.idle: sleep``).

vLLM's sleep mode offloads the weights to CPU memory and frees the KV cache; the engine serves
again seconds later, where a new replica takes a cold start (minutes for a 7B model). A replica
the pool keeps for a later need (``cluster/autoscaling.py`` decides how many) therefore sleeps while
it has nothing to do:

- it sleeps once its engine has had no group queued or running for ``sleep_after_s``, unless an
  announced phase it knows of is expected to send a group within a wake-up;
- it wakes when a group is queued for it (the group waits for the wake-up), or a wake-up before an
  announced phase it knows of is expected to send its first group (by the phase's profile: a GRPO
  phase's groups crowd its end, so a replica may sleep through its quiet start).

Members waiting for their group-mates neither keep an engine awake nor wake it: as for the pool's
size, they are a forecast, not work (a GRPO group's rollouts finish minutes apart).

:func:`sleep_action` is the decision (pure); :class:`EngineSleeper` applies it to one engine and
makes sure no generation reaches a sleeping engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Literal

from cluster.autoscaling import Demand, ScalingSettings
from cluster.engines.base import EngineDeadError, SleepingEngine

__all__ = ["EngineSleeper", "SleepAction", "groups_expected", "sleep_action"]

logger = logging.getLogger(__name__)

SleepAction = Literal["sleep", "wake"]


# An announced phase keeps (or makes) an engine awake once this many of its groups are expected
# within a wake-up: one, so the first group of a phase's busy part finds the engine awake.
GROUPS_WORTH_WAKING = 1.0


def groups_expected(demands: Iterable[Demand], now: float, within_s: float) -> float:
    """The announced groups expected to arrive between now and ``within_s`` ahead (by each phase's
    profile)."""
    return sum(demand.groups_between(now, now + within_s) for demand in demands if demand.groups > 0)


def sleep_action(*, now: float, sleeping: bool, busy: bool, idle_since: float | None, demands: Iterable[Demand],
                 settings: ScalingSettings, margin_s: float = 0.0) -> SleepAction | None:
    """What one replica's engine should do now (None: stay as it is).

    ``busy``: a group is queued for or at the engine;
    ``idle_since``: since when it has not been busy (None: it is); ``demands``: the announcements
    this replica knows of; ``margin_s``: how late the caller may act (its check period), added to
    the wake-up's lead time."""
    soon = groups_expected(demands, now, settings.wake_s + margin_s) >= GROUPS_WORTH_WAKING
    if sleeping:
        return "wake" if busy or soon else None
    if busy or soon or idle_since is None or now - idle_since < settings.sleep_after_s:
        return None
    return "sleep"


class EngineSleeper:
    """Puts one engine to sleep and wakes it (see the module docstring).

    Every generation runs inside :meth:`awake`, which wakes the engine first and keeps it from
    sleeping until the generation is done; :meth:`check` (called periodically) applies
    :func:`sleep_action`. A sleep or wake-up holds a lock, so none overlaps another or a generation's
    start. ``clock``: Unix seconds (the demands' clock)."""

    def __init__(self, engine: SleepingEngine, settings: ScalingSettings, *, margin_s: float = 0.0,
                 clock: Callable[[], float] = time.time):
        self.engine = engine
        self.settings = settings
        self.margin_s = margin_s
        self.clock = clock
        self.idle_since: float | None = clock()
        self.sleeps = 0
        self.wakes = 0
        self.woken_for_work = 0  # wake-ups a generation waited for
        self._generating = 0
        self._lock = asyncio.Lock()

    @property
    def sleeping(self) -> bool:
        """Whether the engine sleeps now."""
        return self.engine.sleeping

    @contextlib.asynccontextmanager
    async def awake(self) -> AsyncIterator[None]:
        """Hold the engine awake for one generation, waking it first if it sleeps (the caller waits
        for the wake-up). A failed wake-up is the engine's loss (:class:`EngineDeadError`): it can
        serve nothing, so the replica gives it up."""
        async with self._lock:
            if self.engine.sleeping:
                await self._wake()
                self.woken_for_work += 1
            self._generating += 1
            self.idle_since = None
        try:
            yield
        finally:
            self._generating -= 1
            if self._generating == 0:
                self.idle_since = self.clock()

    async def check(self, *, pending: bool, demands: Iterable[Demand]) -> SleepAction | None:
        """Sleep or wake the engine as :func:`sleep_action` says; ``pending``: groups are queued for
        the engine. Returns what it did (None: nothing)."""
        now = self.clock()
        busy = pending or self._generating > 0
        if busy:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        action = sleep_action(now=now, sleeping=self.engine.sleeping, busy=busy, idle_since=self.idle_since,
                              demands=demands, settings=self.settings, margin_s=self.margin_s)
        if action is None:
            return None
        async with self._lock:
            if action == "wake" and self.engine.sleeping:
                await self._wake()
                return action
            # Re-checked under the lock: a generation may have started while it was taken.
            if action == "sleep" and self._generating == 0 and not self.engine.sleeping:
                await self.engine.sleep()
                self.sleeps += 1
                logger.info("engine asleep after %.0f s idle", now - (self.idle_since or now))
                return action
        return None

    async def _wake(self) -> None:
        started = time.monotonic()
        try:
            await self.engine.wake_up()
        except Exception as error:
            raise EngineDeadError(f"the engine could not wake up: {error!r}") from error
        self.wakes += 1
        logger.info("engine awake in %.1f s", time.monotonic() - started)
