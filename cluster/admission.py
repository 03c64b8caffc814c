"""Admission: each tenant's groups in flight on one replica, bounded by its ``max_groups_in_flight``.

A tenant over its limit is refused new groups (the caller gets ``overloaded``, a 503 with
Retry-After) while members of groups it already has here join them: a careless or hostile tenant
cannot fill a replica with groups, and an honest one completes what it started. Pure: no Ray, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["GroupsInFlight"]


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
