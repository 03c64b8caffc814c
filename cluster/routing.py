"""Group-aware routing decisions, as pure logic (the Ray Serve router in
``deployments/router.py`` only feeds it replica ids and loads).

- Whole groups with a group id: consistent hashing of the group id over a ring of virtual
  nodes, with bounded load (consistent hashing with bounded loads, Mirrokni et al. 2018): a
  replica far above ``load_factor`` times the mean load hands *new* groups to the next replica
  on the ring; groups already assigned keep their replica while it lives.
- Members of a group: pure consistent hashing. Members arrive through different routers (the
  HTTP proxy, each trainer worker's handle), each seeing loads at a different moment; a
  load-dependent choice would split a group across replicas, so members use the one choice
  every router makes alike. Overload of one replica is handled by its queue limit (503) and
  autoscaling instead.
- Requests without a group id: the replica with the least outstanding work (candidates, not
  request count), ties broken by ring order so every router breaks them the same way.

The ring is a pure function of the replica ids, so every router (HTTP proxy, trainer workers'
handles) maps a group to the same replica as long as no replica is overloaded.
"""

from __future__ import annotations

import bisect
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


def stable_hash(key: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring with virtual nodes over replica ids."""

    def __init__(self, replica_ids: Iterable[str] = (), virtual_nodes: int = 100):
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes: must be >= 1 (got {virtual_nodes})")
        self.virtual_nodes = virtual_nodes
        self.replica_ids: frozenset[str] = frozenset()
        self._hashes: list[int] = []
        self._owners: list[str] = []
        self.rebuild(replica_ids)

    def rebuild(self, replica_ids: Iterable[str]) -> bool:
        """Rebuild for a new replica set; returns whether anything changed."""
        replica_ids = frozenset(replica_ids)
        if replica_ids == self.replica_ids and (self._hashes or not replica_ids):
            return False
        points = sorted(
            (stable_hash(f"{replica_id}#{vnode}"), replica_id)
            for replica_id in replica_ids
            for vnode in range(self.virtual_nodes)
        )
        self._hashes = [point for point, _ in points]
        self._owners = [owner for _, owner in points]
        self.replica_ids = replica_ids
        return True

    def owner(self, key: str) -> str | None:
        """The replica that owns ``key`` (the first of :meth:`walk`; None on an empty ring)."""
        if not self._hashes:
            return None
        return self._owners[bisect.bisect_right(self._hashes, stable_hash(key)) % len(self._hashes)]

    def walk(self, key: str) -> list[str]:
        """Every replica once, in ring order starting at the owner of ``key``."""
        if not self._hashes:
            return []
        start = bisect.bisect_right(self._hashes, stable_hash(key)) % len(self._hashes)
        order: list[str] = []
        seen: set[str] = set()
        for offset in range(len(self._hashes)):
            owner = self._owners[(start + offset) % len(self._hashes)]
            if owner not in seen:
                seen.add(owner)
                order.append(owner)
                if len(order) == len(self.replica_ids):
                    break
        return order


@dataclass
class RoutingPolicy:
    """Decides replica preference order for each request; holds sticky group assignments."""

    load_factor: float = 1.25
    # In units of work (candidates): how far above load_factor * mean a replica may be.
    headroom: float = 8.0
    virtual_nodes: int = 100
    # How long a router remembers which replica a group went to (members arrive within the
    # assembly timeout; retries of a scored group within the replica's result cache TTL).
    assignment_ttl_s: float = 900.0
    max_assignments: int = 200_000
    clock: Callable[[], float] = time.monotonic
    ring: HashRing = field(init=False)
    _assignments: OrderedDict[str, tuple[str, float]] = field(init=False, default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.load_factor < 1:
            raise ValueError(f"load_factor: must be >= 1 (got {self.load_factor})")
        if self.headroom < 0:
            raise ValueError(f"headroom: must be >= 0 (got {self.headroom})")
        self.ring = HashRing(virtual_nodes=self.virtual_nodes)

    def update_replicas(self, replica_ids: Iterable[str]) -> None:
        """Take the current replica set; assignments to replicas that are gone are dropped."""
        self.ring.rebuild(replica_ids)
        live = self.ring.replica_ids
        for group_id in [g for g, (replica, _) in self._assignments.items() if replica not in live]:
            del self._assignments[group_id]

    def assigned_replica(self, group_id: str) -> str | None:
        """The live replica this router already sent ``group_id`` to, if any."""
        entry = self._assignments.get(group_id)
        if entry is None:
            return None
        replica, assigned_at = entry
        if self.clock() - assigned_at > self.assignment_ttl_s or replica not in self.ring.replica_ids:
            del self._assignments[group_id]
            return None
        return replica

    def rank_for_group(self, group_id: str, loads: Mapping[str, float], *, bounded: bool = True) -> list[str]:
        """Replica preference order for a request of group ``group_id``.

        The first entry is where the group goes; the rest are fallbacks in ring order (used by
        Serve only if the first one rejects the request). ``bounded=False`` gives the pure
        ring order, ignoring loads and this router's sticky assignments: every router agrees on
        it whatever it sees, which member requests need (a group's members come through
        different routers) and retries use.
        """
        order = self.ring.walk(group_id)
        if not order:
            return []
        assigned = self.assigned_replica(group_id) if bounded else None
        if assigned is not None:
            chosen = assigned
        elif bounded:
            chosen = self._first_within_bound(order, loads)
        else:
            chosen = order[0]
        self._remember(group_id, chosen)
        return [chosen] + [replica for replica in order if replica != chosen]

    def rank_least_loaded(self, loads: Mapping[str, float], tie_break_key: str = "") -> list[str]:
        """Replicas by outstanding work, least first; ties in ring order of ``tie_break_key``."""
        order = self.ring.walk(tie_break_key)
        position = {replica: rank for rank, replica in enumerate(order)}
        return sorted(order, key=lambda replica: (loads.get(replica, 0.0), position[replica]))

    def forget(self, group_id: str) -> None:
        """Drop a group's sticky assignment (its replica died or it was answered)."""
        self._assignments.pop(group_id, None)

    def _first_within_bound(self, order: list[str], loads: Mapping[str, float]) -> str:
        # "Far above the mean" = above load_factor * mean plus a headroom of a few groups, so
        # that small absolute differences (one group in flight vs none) never move a group.
        mean = sum(loads.get(replica, 0.0) for replica in order) / len(order)
        bound = self.load_factor * mean + self.headroom
        for replica in order:
            if loads.get(replica, 0.0) <= bound:
                return replica
        return order[0]  # unreachable: the least-loaded replica is always within the bound

    def _remember(self, group_id: str, replica: str) -> None:
        self._assignments[group_id] = (replica, self.clock())
        self._assignments.move_to_end(group_id)
        while len(self._assignments) > self.max_assignments:
            self._assignments.popitem(last=False)


@dataclass(frozen=True)
class RouteHint:
    """How a call to a scorer replica is to be routed, beside the request it carries.

    It travels as the call's Serve session id (a handle option, ``grrm_handles.send``), which only
    the group-aware router and the replica read: replica methods take the request and nothing the
    router needs. A session id that is not one of ours (a caller's own, or garbage) reads as no hint.
    """

    # Earlier sends of this call whose replica died: a re-send (>= 1) takes pure ring order, so the
    # members of a group split by a death converge on one replica.
    attempt: int = 0
    # One replica by id: diagnostics (each replica's info), probes and hand-offs between replicas.
    target_replica: str | None = None
    # How often replicas whose views of the ring differ passed this member on (deployments/hand_off.py).
    handed_off: int = 0

    PREFIX = "grrm-route:"

    def encode(self) -> str:
        """The session id that carries this hint ("" for none: the handle's default)."""
        if self == NO_HINT:
            return ""
        return f"{self.PREFIX}{self.attempt}:{self.handed_off}:{self.target_replica or ''}"

    @classmethod
    def decode(cls, session_id: str | None) -> RouteHint:
        """The hint a session id carries; :data:`NO_HINT` for one that is not a hint (never raises)."""
        if not session_id or not session_id.startswith(cls.PREFIX):
            return NO_HINT
        attempt, handed_off, target = (session_id[len(cls.PREFIX):].split(":", 2) + ["", "", ""])[:3]
        if not (attempt.isdigit() and handed_off.isdigit()):
            return NO_HINT
        return cls(attempt=int(attempt), handed_off=int(handed_off), target_replica=target or None)


NO_HINT = RouteHint()


@dataclass(frozen=True)
class RouteKey:
    """What the router needs to know about one call to a scorer replica."""

    group_id: str | None
    # Outstanding work the call brings, in candidates.
    work: float
    # Member calls must reach exactly the group's replica: never fall back to another.
    member: bool
    # Retries (attempt >= 1) use pure ring order so split groups converge.
    attempt: int = 0
    # An explicit replica (operators and tests addressing one replica, e.g. for its info).
    target_replica: str | None = None


def demand_route_key(tenant: str) -> str:
    """The ring key of a tenant's demand announcements: they meet on one replica, which hands them
    on when the replica set changes, as it does groups."""
    return f"demand:{tenant}"


def route_key(args: tuple | list, kwargs: Mapping[str, object], hint: RouteHint = NO_HINT) -> RouteKey:
    """Read a :class:`RouteKey` from the arguments of a replica call and its :class:`RouteHint`.

    Replica methods take the request as their first argument (a ``MemberRequest``, a
    ``GroupRequest`` or a ``DemandAnnouncement``).
    """
    # Imported here so this module stays importable by routers that never see schema objects.
    from cluster.protocol.schema import DemandAnnouncement, GroupRequest, MemberRequest

    request = args[0] if args else kwargs.get("member", kwargs.get("group"))
    attempt = hint.attempt
    if hint.target_replica is not None:
        return RouteKey(group_id=None, work=0.0, member=False, target_replica=hint.target_replica)
    if isinstance(request, MemberRequest):
        return RouteKey(group_id=request.group_id, work=1.0, member=True, attempt=attempt)
    if isinstance(request, DemandAnnouncement):
        # A tenant's announcements meet on one replica, where the next replaces the last.
        return RouteKey(group_id=demand_route_key(request.tenant), work=0.0, member=True, attempt=attempt)
    if isinstance(request, GroupRequest):
        return RouteKey(group_id=request.group_id, work=float(len(request.candidates)), member=False, attempt=attempt)
    return RouteKey(group_id=None, work=1.0, member=False, attempt=attempt)


def copy_holders(replicas: Iterable[str], copy: int, exclude: str | None = None) -> list[str]:
    """The replicas, in preference order, that hold copy ``copy`` of a replicated record.

    Copy ``k`` lives on the ``k``-th replica in name order, so copies ``0 .. n-1`` of a record land
    on ``n`` distinct replicas whenever ``n`` replicas run; the others follow as fallbacks (a
    write still lands somewhere while a replica is being replaced). ``exclude`` leaves one out
    (a replica asking its peers for their records).
    """
    names = sorted(name for name in set(replicas) if name != exclude)
    if not names:
        return []
    start = copy % len(names)
    return names[start:] + names[:start]
