"""The ledger of scored groups: a small replicated Serve deployment every scorer replica writes to.

A replica publishes each scored group here before answering its members, so the answer
outlives the replica: a member whose answer was lost when its replica died is re-sent to
another replica, which finds the group here (see ``cluster.ledger.CompletedGroupLedger``).
Entries hold digests and scores only, expire after ``ttl_s``, and are bounded in number.

The ledger itself must outlive any one of its replicas (or their node): every record is written
to ``copies`` replicas (copy ``k`` on the ``k``-th replica in name order, chosen by
:class:`LedgerCopyRouter`), a lookup asks all of them, and every replica keeps taking what its
peers were written (so a replacement for a dead one is filled within seconds). Serve spreads the
replicas over nodes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray import serve
from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RunningReplica

from cluster.group_records import CompletedGroup
from cluster.ledger import GroupLedger
from cluster.routing import copy_holders
from grrm_handles.ready import fresh_handle, ready_handle

logger = logging.getLogger("ray.serve")

# How often a ledger replica takes what its peers were written meanwhile, and how long one such
# call may take.
PEER_SYNC_PERIOD_S = 2.0
PEER_CALL_TIMEOUT_S = 10.0


class LedgerReplica(GroupLedger):
    """One replica of the ledger deployment: a :class:`GroupLedger` that keeps up with its peers.

    Writers put every record on each replica already; every ``sync_period_s`` a replica also
    takes what its peers were written since it last asked. That repairs what a direct write
    missed (a write that fell back to another replica while one was being replaced, or that a
    router sent before it knew every replica) and fills a replacement with its peers' records.
    """

    async def __init__(self, ttl_s: float, copies: int = 1, sync_period_s: float = PEER_SYNC_PERIOD_S,
                     max_groups: int = 200_000):
        super().__init__(ttl_s, max_groups)
        self.copies = copies
        self.synced_from_peers = 0
        context = serve.get_replica_context()
        self._name = context.replica_id.unique_id
        self._deployment = (context.deployment, context.app_name)
        self._peers: DeploymentHandle | None = None  # made in the sync loop, once the replica runs
        self._cursors: dict[str, int] = {}  # peer -> the number of its last write taken
        if copies > 1:
            self._sync = asyncio.get_running_loop().create_task(self._keep_up(sync_period_s))

    async def _keep_up(self, period_s: float) -> None:
        await asyncio.sleep(period_s)
        while True:
            if self._peers is None:
                # Off the event loop: setting the router up reads the GCS, which may be down right now. A
                # router of its own (fresh_handle), not the process's cached handle's, which may be stale.
                self._peers = await asyncio.to_thread(fresh_handle, *self._deployment)
            answered = True
            for peer in range(self.copies - 1):
                try:
                    await asyncio.wait_for(self._take_from(peer), period_s + PEER_CALL_TIMEOUT_S)
                except Exception as error:  # noqa: BLE001 - a peer being replaced: next round
                    logger.info("ledger replica %s: peer %d did not answer: %r", self._name, peer, error)
                    answered = False
            if not answered:
                # The next round asks through a new handle, whose router reads the replica set afresh: a guard
                # against a stale set (one router knew only its own replica for minutes; the cause found was the
                # routing spin LedgerCopyRouter now backs off from). The other peers still ask through this one.
                self._peers = None
            await asyncio.sleep(period_s)

    async def _take_from(self, peer: int) -> None:
        name = await self._peers.name.remote(copy=peer, exclude=self._name)
        last_write, records = await self._peers.changes_since.remote(
            self._cursors.get(name, 0), copy=peer, exclude=self._name, peer=name
        )
        self.synced_from_peers += self.merge(records)
        self._cursors[name] = last_write

    def name(self, copy: int = 0, exclude: str | None = None) -> str:
        """This replica's name (its Serve replica id)."""
        return self._name

    def changes_since(self, since: int, exclude: str | None = None, copy: int = 0, peer: str | None = None):
        if peer is not None and peer != self._name:
            raise LookupError(f"ledger replica {self._name} is not {peer}")  # routed elsewhere meanwhile
        return super().changes_since(since)

    def info(self, copy: int = 0) -> dict[str, Any]:
        """This replica's name, size and how many records it took from its peers."""
        return {"replica": self._name, "groups": self.size(), "synced_from_peers": self.synced_from_peers}


class LedgerCopyRouter(ConsistentHashRouter):
    """Sends copy ``k`` of a ledger call to the ``k``-th ledger replica in name order.

    Extends Ray's consistent-hash router for its routing loop, which fulfils exactly the request
    whose ranks it computed (Ray's base loop may hand a replica to an older request instead).
    """

    def initialize_state(self, **_: Any) -> None:
        pass

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas] if candidate_replicas else []
        kwargs = pending_request.kwargs
        copy = kwargs.get("copy", 0)
        exclude = kwargs.get("exclude")
        by_name = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        order = copy_holders(by_name, copy if isinstance(copy, int) else 0, exclude if isinstance(exclude, str) else None)
        if not order:
            # Nothing to offer: without backing off, Ray's routing loop asks again at once, never awaiting. A
            # peer call whose router knew no peer yet spun the router's event loop, so the broadcast naming the
            # peer never ran. (A call with a replica to go to keeps Ray's quick retry.)
            pending_request.routing_context.should_backoff = True
        return [[by_name[name]] for name in order]


class ServeLedger:
    """The assembler's ledger interface over a handle to the ledger deployment.

    A record is written to ``copies`` ledger replicas at once; a lookup asks as many and takes the
    first that knows the group. A write counts when one copy landed (a ledger outage must not hold
    answers back: the assembler bounds every call).
    """

    def __init__(self, handle: DeploymentHandle, copies: int = 1):
        if copies < 1:
            raise ValueError(f"copies must be at least 1, got {copies}")
        self.handle = ready_handle(handle)  # a GCS outage must not find its router unmade
        self.copies = copies

    async def put(self, group_id: str, record: CompletedGroup) -> None:
        outcomes = await asyncio.gather(
            *(self.handle.put.remote(group_id, record, copy=copy) for copy in range(self.copies)),
            return_exceptions=True,
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if len(failures) == self.copies:
            raise failures[0]

    async def get(self, group_id: str) -> CompletedGroup | None:
        pending = {asyncio.ensure_future(self._get_copy(group_id, copy)) for copy in range(self.copies)}
        errors: list[BaseException] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is not None:
                        errors.append(task.exception())
                    elif task.result() is not None:
                        return task.result()
        finally:
            for task in pending:
                task.cancel()
        if len(errors) == self.copies:
            raise errors[0]  # no copy answered: the assembler counts a ledger error
        return None

    async def _get_copy(self, group_id: str, copy: int) -> CompletedGroup | None:
        return await self.handle.get.remote(group_id, copy=copy)
