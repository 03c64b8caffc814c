"""Admission: each tenant's groups in flight on one replica, bounded by its ``max_groups_in_flight``,
and the bound on its members waiting for group-mates there (:func:`waiting_members_bound`).

A tenant over its limit is refused new groups (the caller gets ``overloaded``, a 503 with
Retry-After) while members of groups it already has here join them: a careless or hostile tenant
cannot fill a replica with groups, and an honest one completes what it started. Pure: no Ray, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from cluster.assembly import JOIN_HEADROOM

__all__ = ["TENANT_SLOT_SHARE", "GroupsInFlight", "slots_for_step", "waiting_members_bound"]

# The most of a replica's request slots one tenant's members waiting for group-mates may hold; the rest
# stays for the other tenants and for the members that complete groups (see waiting_members_bound).
TENANT_SLOT_SHARE = 0.75


def waiting_members_bound(slots: int, *, largest_group: int, max_groups_in_flight: int | None = None,
                          share: float = TENANT_SLOT_SHARE, join_headroom: float = JOIN_HEADROOM) -> int:
    """How many of one tenant's members a replica holds waiting for group-mates before it refuses the
    tenant's new groups: the default of ``tenants.*.max_waiting_members``.

    What a replica holds: ``slots`` (``replicas.max_ongoing_requests``) Serve request slots. A member
    waiting for group-mates holds one (an asyncio future: cheap), and so does every member of a complete
    group until the engine has scored it. Requests beyond ``slots`` wait in the caller's queue
    (``max_queued_requests``), where they cannot reach the replica.

    What must stay free:

    * the members that complete groups. A complete group frees its members' slots once scored; a
      member that would complete one is always admitted, but only once it has a slot. If waiting
      members held every slot, it would queue behind them and nothing would move until the assembly
      timeout;
    * the other tenants: one tenant whose groups never complete (a trainer with the wrong
      ``group_size``) must leave them room to be answered at once.

    So one tenant's waiting members may hold at most ``share`` of the slots (three quarters: a quarter
    stays for the rest). The assembler refuses the tenant's new groups at the bound and lets members of
    its groups already collecting join up to ``join_headroom`` times it (``cluster/assembly.py``), so that
    an honest run at the bound completes what it started: the bound is ``share x slots / join_headroom``
    (half the slots), and the tenant's waiting members never exceed ``share x slots``.

    What a tenant may use: where ``max_groups_in_flight`` is set, it has at most that many groups here,
    each with at most ``largest_group - 1`` members waiting (the last one completes it), so the bound is
    never above that: below it, only ``max_groups_in_flight`` can refuse.

    One tenant's step of G groups of n waits here without a refusal, in any order, while the bound is at
    least G x (n - 1): :func:`slots_for_step` gives the slots that takes. The bound is at least 1.
    """
    if slots < 1:
        raise ValueError(f"slots: must be >= 1, got {slots}")
    if largest_group < 2:
        raise ValueError(f"largest_group: must be >= 2, got {largest_group}")
    bound = math.floor(math.floor(share * slots) / join_headroom + 1e-9)
    if max_groups_in_flight is not None:
        bound = min(bound, max_groups_in_flight * (largest_group - 1))
    return max(1, bound)


def slots_for_step(groups: int, group_size: int, *, share: float = TENANT_SLOT_SHARE,
                   join_headroom: float = JOIN_HEADROOM) -> int:
    """The fewest request slots (``replicas.max_ongoing_requests``) whose :func:`waiting_members_bound`
    lets one tenant's step of ``groups`` groups of ``group_size`` wait on one replica without a refusal
    (``groups x (group_size - 1)`` members waiting, in the worst order)."""
    needed = groups * (group_size - 1)
    slots = math.ceil(needed * join_headroom / share)
    while waiting_members_bound(slots, largest_group=group_size, share=share, join_headroom=join_headroom) < needed:
        slots += 1
    return slots


class GroupsInFlight:
    """The groups (scoped ids) each tenant has in flight on one replica."""

    def __init__(self, limit_of: Callable[[str], int | None], replica: str):
        """``limit_of(tenant)``: its ``max_groups_in_flight`` (None: no limit)."""
        self._limit_of = limit_of
        self._replica = replica
        self._groups: dict[str, set[str]] = {}  # a tenant is listed only while it has groups here

    def admit(self, tenant: str, group: str) -> str | None:
        """Count ``group`` in flight for ``tenant``; why not (for the caller), when it is over its limit."""
        groups = self._groups.get(tenant, set())
        limit = self._limit_of(tenant)
        if group in groups or limit is None or len(groups) < limit:
            self._groups.setdefault(tenant, groups).add(group)
            return None
        return (f"tenant {tenant}: {len(groups)} groups in flight on replica {self._replica}, its limit "
                f"(tenants max_groups_in_flight {limit}); retry later")

    def settle(self, tenant: str, group: str) -> None:
        """``group`` left this replica (scored, timed out, moved, refused)."""
        groups = self._groups.get(tenant)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._groups[tenant]

    def count(self, tenant: str) -> int:
        """Groups ``tenant`` has in flight here."""
        return len(self._groups.get(tenant, ()))

    def tenants(self) -> set[str]:
        """The tenants with groups in flight here."""
        return set(self._groups)
