"""The group-aware Ray Serve request router for scorer replicas.

A thin edge over :mod:`cluster.routing`: it feeds the policy the live replica set and each
replica's outstanding work (reported by every replica through ``record_routing_stats`` so all
routers see the same numbers, plus this router's own in-flight work), and turns the policy's
preference order into Serve's ranks.

It extends Ray's (experimental, pinned with Ray 2.60) ``ConsistentHashRouter`` for its routing
loop only: Ray's base loop hands a free replica to the *oldest* pending request, which breaks
affinity when requests of different groups wait at once; the consistent-hash loop fulfils
exactly the request whose ranks it computed. Ranking itself is ours.
"""

from __future__ import annotations

from typing import Any

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter
from ray.serve.request_router import PendingRequest, RunningReplica

from cluster.routing import RouteHint, RoutingPolicy, route_key

# Key under which replicas report outstanding work in record_routing_stats().
OUTSTANDING_WORK = "outstanding_work"


def replica_name(replica: RunningReplica) -> str:
    """The stable id a replica is known by on the ring and in results."""
    return replica.replica_id.unique_id


class GroupAwareRequestRouter(ConsistentHashRouter):
    """Consistent hashing with bounded load for grouped requests, least-work otherwise."""

    def initialize_state(self, load_factor: float = 1.25, headroom: float = 8.0, virtual_nodes: int = 100, **_: Any):
        self._policy = RoutingPolicy(load_factor=load_factor, headroom=headroom, virtual_nodes=virtual_nodes)
        self._inflight: dict[str, tuple[str, float]] = {}  # internal request id -> (replica, work)
        self._local_work: dict[str, float] = {}
        self._policy.update_replicas(self._replica_id_set_names())

    def _replica_id_set_names(self) -> list[str]:
        return [replica_id.unique_id for replica_id in self._replica_id_set]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        if hasattr(self, "_policy"):
            self._policy.update_replicas(replica_name(replica) for replica in replicas)

    def on_replica_actor_died(self, replica_id) -> None:
        # Serve calls this when a call to the replica failed because it died, before the
        # controller broadcasts the new replica set. Taking it off the ring at once sends re-sent
        # members to its ring successor, where every router sends them once it has seen the death.
        super().on_replica_actor_died(replica_id)
        if hasattr(self, "_policy"):
            self._policy.update_replicas(self._replica_id_set_names())

    def _load(self, replica: RunningReplica) -> float:
        reported = (replica.routing_stats or {}).get(OUTSTANDING_WORK, 0.0)
        # Reported work covers every router but lags by up to the stats period; ours is current.
        return max(float(reported), self._local_work.get(replica_name(replica), 0.0))

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is None:
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True
        by_name = {replica_name(replica): replica for replica in candidate_replicas}
        loads = {name: self._load(replica) for name, replica in by_name.items()}
        metadata = pending_request.metadata
        key = route_key(pending_request.args, pending_request.kwargs, RouteHint.decode(metadata.session_id))
        if key.target_replica is not None:
            order = [key.target_replica]
        elif key.group_id is None:
            order = self._policy.rank_least_loaded(loads, metadata.internal_request_id)
        else:
            # Members must meet on one replica whichever router they come through: pure ring
            # order, and wait for that replica rather than spill over to another.
            order = self._policy.rank_for_group(key.group_id, loads, bounded=key.attempt == 0 and not key.member)
            if key.member:
                order = order[:1]
        ranks = [[by_name[name]] for name in order if name in by_name]
        if ranks:
            self._account(metadata.internal_request_id, order[0], key.work)
        return ranks

    def _account(self, internal_request_id: str, name: str, work: float) -> None:
        # Serve reports routed requests to routers only under its rejection protocol, but always
        # reports completion: count work when ranking, settle it on completion.
        previous = self._inflight.pop(internal_request_id, None)
        if previous is not None:
            self._local_work[previous[0]] -= previous[1]
        self._inflight[internal_request_id] = (name, work)
        self._local_work[name] = self._local_work.get(name, 0.0) + work

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        entry = self._inflight.pop(internal_request_id, None)
        if entry is not None:
            name, work = entry
            self._local_work[name] = max(0.0, self._local_work.get(name, 0.0) - work)
