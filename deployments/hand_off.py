"""A scorer replica following the routers' ring: groups and members handed to the replica that owns them.

The routers place a group's members on one replica by a consistent-hash ring over the running
replicas (``deployments/router.py``). When that set changes (scaling, a death, a redeploy), a replica
learns of it from the same broadcast (``deployments/replica_set.py``) and:

* releases every group the new ring places elsewhere and its engine has not begun (members that
  wait are answered ``moved``, and sent on), and hands on the tenants' announced demand likewise;
* hands a member that arrives for a group the ring places elsewhere to that replica, once it
  answered a probe (a replica that lost its engine answers none), and passes the answer back. Views of
  the ring differ for a moment between replicas: a member is passed on :data:`MAX_HAND_OFFS` times
  at most, then answered ``moved`` for its caller to send again.

Why a group never splits for good and what a hand-off costs: docs/operations/faults.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ray import serve

from cluster.announced_demand import AnnouncedDemands
from cluster.assembly import GroupAssembler
from cluster.assembly_observers import AssemblyObserver
from cluster.routing import HashRing, RouteHint, demand_route_key
from cluster.protocol.schema import MemberRequest, MemberResult
from deployments.metrics import ReplicaMetrics
from deployments.replica_set import ReplicaSetWatch
from grrm_handles.send import REPLICA_GONE_ERRORS, HandleSender

__all__ = ["MAX_HAND_OFFS", "PROBE_TIMEOUT_S", "HandOffMetric", "RingFollower"]

logger = logging.getLogger("ray.serve")

# How often a member is passed between replicas whose views of the ring differ, before it is answered
# `moved` for its caller to send again.
MAX_HAND_OFFS = 3
# How long a replica waits for another to answer a probe before it hands it nothing.
PROBE_TIMEOUT_S = 5.0
# How long a replica that did not answer a probe is passed over before it is probed again. Not until the
# replica set changes: in a fixed pool that never comes, and a probe that timed out under load (a peer
# busy starting) would keep every group this replica was sent while routers disagreed split for good.
GONE_FOR_S = 5.0

class HandOffMetric(AssemblyObserver):
    """Counts the groups a replica's assembler released to their new owners (``grrm_groups_handed_off``)."""

    def __init__(self, metrics: ReplicaMetrics):
        self.metrics = metrics

    def group_handed_off(self, group_id: str, owner: str) -> None:
        self.metrics.groups_handed_off.inc()


class RingFollower:
    """One replica's view of the ring, and the hand-offs it makes (see the module docstring)."""

    def __init__(self, name: str, virtual_nodes: int, assembler: GroupAssembler, queued: set[str],
                 demands: AnnouncedDemands, clock: Callable[[], float] = time.monotonic):
        """``queued``: the groups waiting for this replica's engine, which may still move (the groups
        released to their new owners are counted by the assembler's observers: :class:`HandOffMetric`)."""
        self.name = name
        self.virtual_nodes = virtual_nodes
        self.assembler = assembler
        self.queued = queued
        self.demands = demands
        # The routers' ring as the controller last broadcast it (None: not known yet, or outside Serve).
        self.ring: HashRing | None = None
        self.gone: dict[str, float] = {}  # replicas on the ring that did not answer a probe -> when
        self._clock = clock
        self._probes: dict[str, asyncio.Future[bool]] = {}  # replica -> whether it answered (this replica set)
        self._background: set[asyncio.Task[None]] = set()
        self.peers, self.watch = self._follow()

    def _follow(self) -> tuple[HandleSender | None, ReplicaSetWatch | None]:
        """This deployment's replicas through the group-aware router, and the broadcast of their set. Both
        are made now: a handle's router made at its first use reads the GCS, and a hand-off during a GCS
        outage would freeze this replica until the GCS is back (docs/operations/faults.md)."""
        try:
            context = serve.get_replica_context()
        except Exception:  # noqa: BLE001 - outside Serve there is no ring to follow
            return None, None
        peers = HandleSender(serve.get_deployment_handle(context.deployment, context.app_name))
        return peers, ReplicaSetWatch(context.replica_id.deployment_id, self.on_replica_set, self.name)

    async def hand_on(self, member: MemberRequest, scoped: str, hint: RouteHint) -> MemberResult | None:
        """The answer of the replica the ring now places ``member``'s group on, when that is another one
        (``hint``: the call's routing hint, its attempt and the hand-offs so far); None: it joins here."""
        attempt, handed_off = hint.attempt, hint.handed_off
        # A member re-sent after a replica died (attempt >= 1) was placed by a router that knows of the
        # death before this replica's view of the ring does: it stays.
        if handed_off < MAX_HAND_OFFS and (attempt == 0 or handed_off) and not self.assembler.holds(scoped):
            owner = await self.reachable_owner(member.group_id)
            if owner is not None:
                return await self.hand_to(owner, member, handed_off + 1)
        return None

    async def follow_moved(self, member: MemberRequest, result: MemberResult, hint: RouteHint) -> MemberResult:
        """``member``'s ``result`` here, or, when its group was handed off meanwhile (``moved``), the answer
        of the replica the ring now places it on."""
        if result.failure == "moved" and hint.handed_off < MAX_HAND_OFFS:
            owner = await self.reachable_owner(member.group_id)
            if owner is not None:
                return await self.hand_to(owner, member, hint.handed_off + 1)
        return result

    def on_replica_set(self, replicas: list[str]) -> None:
        """The running replicas changed: hand every group that the new ring places elsewhere and that
        this engine has not begun (collecting members, or complete and waiting for the engine) to its
        new owner (its members here are answered ``moved`` and sent on)."""
        # A replica being stopped is no longer on the ring: every group it collects goes elsewhere. One
        # not yet on it is starting: until the broadcast that lists it, it knows no ring to go by.
        if self.name not in replicas and self.ring is None:
            return
        self.ring = HashRing(replicas, virtual_nodes=self.virtual_nodes)
        # A dead replica the controller still lists stays passed over (for GONE_FOR_S).
        self.gone = {name: at for name, at in self.gone.items() if name in replicas}
        self._probes.clear()
        released = self.assembler.hand_off(self.owner_elsewhere, self.queued)
        for tenant in self.demands.tenants():
            owner = self.owner_elsewhere(demand_route_key(tenant))
            if owner is not None and self.peers is not None:  # one replica reports a tenant's demand
                self._in_background(self.peers.ask_replica("keep_demand", owner, self.demands.pop(tenant)))
        if released:
            logger.info("replica %s: replica set now %s; %d groups not yet at the engine handed to their new owners",
                        self.name, replicas, released)

    def owner_elsewhere(self, route_key: str) -> str | None:
        """The replica the routers' ring now sends ``route_key``'s members to, if not this one (a
        replica found gone is passed over, as routers do before the controller has seen the death)."""
        if self.ring is None:
            return None
        owner = next((name for name in self.ring.walk(route_key) if not self._passed_over(name)), None)
        return owner if owner != self.name else None

    async def reachable_owner(self, route_key: str) -> str | None:
        """:meth:`owner_elsewhere`, once that replica answered a probe: a call routed to one that is
        gone would wait for it for ever. None: this replica owns the group (or no owner answers)."""
        for _ in range(len(self.ring.replica_ids) if self.ring is not None else 0):
            owner = self.owner_elsewhere(route_key)
            if owner is None or await self._reachable(owner):
                return owner
        return None

    def _passed_over(self, replica: str) -> bool:
        """Whether ``replica`` did not answer a probe within the last :data:`GONE_FOR_S`."""
        at = self.gone.get(replica)
        return at is not None and self._clock() - at < GONE_FOR_S

    async def _reachable(self, replica: str) -> bool:
        """Whether ``replica`` answers a probe (asked once per replica set; a silent one is asked again
        once it has been passed over for :data:`GONE_FOR_S`)."""
        probe = self._probes.get(replica)
        if probe is None or (probe.done() and replica in self.gone and not self._passed_over(replica)):
            self.gone.pop(replica, None)
            probe = self._probes[replica] = asyncio.ensure_future(self._probe(replica))
        return await asyncio.shield(probe)

    async def _probe(self, replica: str) -> bool:
        try:
            assert self.peers is not None
            await asyncio.wait_for(self.peers.ask_replica("takes_members", replica), PROBE_TIMEOUT_S)
            return True
        except Exception as error:  # noqa: BLE001 - whatever the reason, members do not go there
            logger.warning("replica %s: replica %s did not answer a probe (%s); its groups stay here",
                           self.name, replica, type(error).__name__)
            self.gone[replica] = self._clock()
            return False

    async def hand_to(self, owner: str, member: MemberRequest, hand_offs: int) -> MemberResult:
        """Send a member to the replica that now owns its group and pass its answer back; if that
        replica went away meanwhile, answer ``moved`` so the caller sends it again."""
        assert self.peers is not None
        try:
            return await self.peers.ask_replica("add_member", owner, member, handed_off=hand_offs)
        except REPLICA_GONE_ERRORS as error:
            return MemberResult(group_id=member.group_id, index=member.index, member_id=member.member_id, valid=False,
                                failure="moved", replica=self.name,
                                error=f"group {member.group_id}: replica {owner}, which now collects it, went away "
                                      f"({type(error).__name__}); send the member again")

    def _in_background(self, call: Any) -> None:
        """Run a hand-off call without waiting for it; a failure only costs the policy a forecast."""
        async def run() -> None:
            try:
                await call
            except Exception as error:  # noqa: BLE001 - the announcement is advisory
                logger.warning("replica %s: handing on a demand failed: %r", self.name, error)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def stop(self) -> None:
        """Stop following the broadcast."""
        if self.watch is not None:
            self.watch.stop()
