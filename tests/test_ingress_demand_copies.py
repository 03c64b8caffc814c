"""The HTTP ingress hands each tenant's announcements to a scorer replica in the order they were
made. A replica keeps the last copy it receives, and a call the ingress cancels may still land (a
Serve call already assigned to a replica runs there), so a withdrawal must not overtake the copy
ahead of it: one CI run read the replica's demand as the run's 108 groups after the run had
withdrawn them. No Ray here: the ingress class with its scorer client replaced."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cluster.announced_demand import AnnouncedDemands
from cluster.engines import EngineConfig
from cluster.protocol.schema import DemandAnnouncement
from deployments.config import AppConfig, AutoscalingSettings, ReplicaSettings
from deployments.ingress import GRRMIngress

# The ingress class is used without Serve's wrapper around it (whose finalizer is a coroutine).
pytestmark = pytest.mark.filterwarnings("ignore:coroutine .*ASGIIngressWrapper.__del__:RuntimeWarning")


class SlowScorers:
    """A scorer client whose first announcement call lands at the replica only when ``release`` is
    set, cancelled or not (as an assigned Serve call does), and whose later calls land at once."""

    def __init__(self):
        self.release = asyncio.Event()
        self.landed: list[int] = []
        self.calls = 0
        self.availability = SimpleNamespace(current=self._running)

    async def _running(self, max_age_s: float):
        return SimpleNamespace(running=1)

    async def announce_demand(self, announcement: DemandAnnouncement):
        self.calls += 1
        slow = self.calls == 1

        async def at_the_replica():
            if slow:
                await self.release.wait()
            self.landed.append(announcement.groups)

        await asyncio.shield(asyncio.ensure_future(at_the_replica()))


def ingress_with(scorers: SlowScorers, replicas: ReplicaSettings | None = None):
    """The ingress class's state as its constructor sets it, without Serve (no handle, no replica context)."""
    ingress = GRRMIngress.func_or_class.__new__(GRRMIngress.func_or_class)
    ingress.config = AppConfig(engine=EngineConfig(kind="scripted"), replicas=replicas or ReplicaSettings())
    ingress.client = scorers
    ingress.name = "ingress"
    ingress.demands = AnnouncedDemands()
    ingress._forwards, ingress._copies_sending, ingress._keepers = {}, set(), set()
    return ingress


def test_a_withdrawal_lands_after_the_copy_already_on_its_way():
    async def run():
        scorers = SlowScorers()
        ingress = ingress_with(scorers)
        await ingress.take_demand(DemandAnnouncement(groups=108, lasts_s=600))
        await asyncio.sleep(0.05)  # the copy of 108 is in its call now
        await ingress.take_demand(DemandAnnouncement(groups=0, lasts_s=1))
        await asyncio.sleep(0.05)
        scorers.release.set()
        while ingress._forwards:
            await asyncio.sleep(0.01)
        return scorers.landed

    assert asyncio.run(run()) == [108, 0]  # the withdrawal last: the replica keeps 0


def test_a_copy_not_yet_sent_is_replaced_not_sent():
    async def run():
        scorers = SlowScorers()
        scorers.release.set()
        may_empty = ReplicaSettings(autoscaling=AutoscalingSettings(min_replicas=0, max_replicas=1))
        ingress = ingress_with(scorers, may_empty)
        # A pool that may empty: announced work is copied when its phase starts (in 30 s here).
        await ingress.take_demand(DemandAnnouncement(groups=50, starts_in_s=30, lasts_s=60))
        await ingress.take_demand(DemandAnnouncement(groups=0, lasts_s=1))
        while ingress._forwards:
            await asyncio.sleep(0.01)
        return scorers.landed

    assert asyncio.run(run()) == [0]


def test_a_withdrawal_to_a_pool_that_may_empty_lands_on_a_replica_before_the_ingress_keeps_it():
    """Kept first, a withdrawal lets the application's policy empty the pool while its copy is still on its
    way: the copy then waits at the empty pool and starts a replica at once (a full run saw 1 replica start
    a second after the pool emptied). So the copy lands first; a copy that never lands is dropped after
    WITHDRAWAL_COPY_WAIT_S and the withdrawal kept all the same. The caller is answered at once (a full run
    saw a withdrawal's HTTP call outlast the client's 5 s while the ingress waited for its copy)."""
    import deployments.ingress as ingress_module

    async def run(release: bool):
        scorers = SlowScorers()
        may_empty = ReplicaSettings(autoscaling=AutoscalingSettings(min_replicas=0, max_replicas=1))
        ingress = ingress_with(scorers, may_empty)
        await ingress.take_demand(DemandAnnouncement(tenant="run-a", groups=50, lasts_s=60))  # the phase is on
        accepted = await ingress.take_demand(DemandAnnouncement(tenant="run-a", groups=0, lasts_s=1))
        assert accepted.groups == 0  # answered at once: the caller's announcement has a few seconds only
        await asyncio.sleep(0.05)
        kept_before = [demand.groups for demand in ingress.demands._by_tenant.values()]
        if release:
            scorers.release.set()
        await asyncio.gather(*ingress._keepers)
        return kept_before, [demand.groups for demand in ingress.demands._by_tenant.values()], scorers.landed

    kept_before, kept_after, landed = asyncio.run(run(release=True))
    # While the withdrawal's copy was on its way (held at the replica; it replaced the phase's copy not yet
    # sent), the ingress still held the phase; it kept the withdrawal once the copy had landed.
    assert kept_before == [50] and kept_after == [0] and landed == [0]
    original = ingress_module.WITHDRAWAL_COPY_WAIT_S
    ingress_module.WITHDRAWAL_COPY_WAIT_S = 0.2
    try:
        kept_before, kept_after, landed = asyncio.run(run(release=False))
    finally:
        ingress_module.WITHDRAWAL_COPY_WAIT_S = original
    assert kept_after == [0] and 0 not in landed  # never landed: dropped, the withdrawal kept regardless
