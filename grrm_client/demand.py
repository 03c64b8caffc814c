"""Announcing a run's generation phases to the service, each as it opens and the next one ahead.

Trainer adapters (the verl bridge, the TRL adapter) note when they ask for rewards; the forecast
(``cluster/demand_forecast.py``) says when a phase opens, how long it lasts and when the next
opens. Announcements are advisory (``RewardClient.announce_demand``: one attempt, never raises) and
run in the background, so no reward ever waits for one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field

from cluster.demand_forecast import PhaseForecaster

__all__ = ["DemandAnnouncer", "DemandSettings"]

# RewardClient.announce_demand's signature: (groups, lasts_s, starts_in_s, tenant, profile) -> taken.
Announce = Callable[..., Awaitable[bool]]


class DemandSettings(BaseModel):
    """Whether a trainer adapter announces its generation phases (mixed into its config; the quiet gap that
    ends a phase is the client's own ``ClientConfig.phase_gap_s``, which the recorded trace uses too)."""

    announce_demand: bool = Field(
        True, description="At the start of each generation phase (a reward asked for after a quiet gap), announce "
                          "the step's groups to the service, and once two phases were seen the next phase ahead of "
                          "it, so that its autoscaling has the replicas for them in time (advisory: never holds up "
                          "a reward).")


class DemandAnnouncer:
    """Announces each generation phase when it opens, and the next one when this one should end."""

    def __init__(self, announce: Announce, groups_per_phase: int, *, gap_s: float, tenant: str | None = None,
                 first_phase_s: float = 60.0) -> None:
        self.phases = PhaseForecaster(groups_per_phase, gap_s=gap_s, first_phase_s=first_phase_s)
        self._announce = announce
        self._tenant = tenant
        self._now: set[asyncio.Task[bool]] = set()
        self._ahead: asyncio.Task[bool] | None = None

    def requested(self, now: float, *, group_size: int | None = None, counts: bool = True) -> None:
        """Note that a reward was asked for at ``now`` (seconds), for a rollout of a group of
        ``group_size`` (None: as before; 1: a whole group); announce when that opens a phase.
        ``counts`` False: nothing was asked for, but the phase goes on (e.g. its rewards came back).
        Must run on the event loop the announcements are to be made from."""
        if group_size is not None:
            self.phases.group_size = group_size
        forecast = self.phases.arrive(now, counts=counts)
        if forecast is None:
            return
        if self._ahead is not None:  # this phase came: its own announcement replaces the early one
            self._ahead.cancel()
            self._ahead = None
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._send(forecast.lasts_s, 0.0, forecast.profile))
        self._now.add(task)
        task.add_done_callback(self._now.discard)
        ahead = forecast.next_announcement()
        if ahead is not None:
            after_s, starts_in_s = ahead
            self._ahead = loop.create_task(self._send(forecast.lasts_s, starts_in_s, forecast.profile, after_s=after_s))

    async def settled(self) -> None:
        """Wait for the announcements of the phases opened so far (not the ones scheduled ahead)."""
        await asyncio.gather(*self._now)

    def close(self) -> None:
        """Drop the announcement scheduled ahead (the run is over)."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead = None

    async def _send(self, lasts_s: float, starts_in_s: float, profile: tuple[float, ...], after_s: float = 0.0) -> bool:
        if after_s > 0:
            await asyncio.sleep(after_s)
        return await self._announce(groups=self.phases.groups_per_phase, lasts_s=lasts_s, starts_in_s=starts_in_s,
                                    tenant=self._tenant, profile=profile)
