"""The demands trainers announced, per tenant: what the HTTP ingress and the scorer replicas keep and
report to the autoscaling policy (pure, no Ray).

A tenant's latest announcement counts wherever earlier ones are kept (Unix ``announced_at`` decides:
the keepers may be several); one of 0 groups withdraws the tenant's demand. A withdrawal frees the
tenant's announcement at once and is kept, bare, for :data:`WITHDRAWAL_KEPT_S`: long enough to be
reported, after which the policy, which sees every keeper, remembers it for as long as an older copy
elsewhere is reported (``cluster/demand_report.py``). An announcement that is over (its phase ended
``grace_s`` ago: a client that announced and never came) is forgotten.

A book holds at most :data:`MAX_KEPT_TENANTS` tenants, so that any number of names cannot grow it:
beyond, withdrawals go first (the oldest), then the announcement whose phase ends soonest (it would
be forgotten soonest anyway, and its replicas, asked for a cold start ahead, serve by then).
"""

from __future__ import annotations

from collections.abc import Iterator

from cluster.autoscaling import Demand
from cluster.protocol.schema import DemandAnnouncement

__all__ = ["MAX_KEPT_TENANTS", "WITHDRAWAL_KEPT_S", "AnnouncedDemands", "copy_delay_s", "demand_of", "seen_later"]

# How long a withdrawal (0 groups) is kept and reported: the policy reads a report every metrics_interval_s (2 s by
# default) and then remembers the withdrawal itself while an older copy kept elsewhere is reported. A minute is many
# reports, also where metrics_interval_s is set to several seconds.
WITHDRAWAL_KEPT_S = 60.0
# The most tenants a book keeps (ten times the announcements a shared pool's runs make at once, and a few hundred
# kilobytes at 64-slice profiles).
MAX_KEPT_TENANTS = 1024


def demand_of(announcement: DemandAnnouncement, now: float) -> Demand:
    """An announcement received at ``now`` (Unix seconds), on the receiver's clock (no clock is shared)."""
    if not announcement.groups:  # a withdrawal: nothing of the announcement kept but who and when
        return Demand(announcement.tenant, 0, now, now, announced_at=now)
    starts_at = now + announcement.starts_in_s
    return Demand(announcement.tenant, announcement.groups, starts_at, starts_at + announcement.lasts_s,
                  announced_at=now, profile=tuple(announcement.profile))


def copy_delay_s(announcement: DemandAnnouncement, pool_may_empty: bool) -> float:
    """How long the HTTP ingress waits before it hands a copy of ``announcement`` to a scorer replica.

    At once where the scorer pool never empties. Where it may (``min_replicas`` 0), a copy sent while
    the pool is being emptied waits at the callers' handle and starts a replica at once, which is
    what the policy avoids between steps: so the copy of announced work goes when its phase starts (the
    policy has started replicas for it by then, from the ingress's own copy); a withdrawal at once."""
    return announcement.starts_in_s if pool_may_empty and announcement.groups else 0.0


def seen_later(announcement: DemandAnnouncement, elapsed_s: float) -> DemandAnnouncement | None:
    """``announcement`` as its receiver would have said it ``elapsed_s`` later (times are relative to
    the receiver's clock): its start that much nearer, its phase shorter once begun; None once over."""
    if not announcement.groups:
        return announcement  # a withdrawal has no times that matter
    starts_in_s = announcement.starts_in_s - elapsed_s
    lasts_s = announcement.lasts_s + min(0.0, starts_in_s)
    if lasts_s <= 0:
        return None
    return announcement.model_copy(update={"starts_in_s": max(0.0, starts_in_s), "lasts_s": lasts_s})


def _forgotten_at(demand: Demand, grace_s: float) -> float:
    """When a kept announcement stops counting: a withdrawal after :data:`WITHDRAWAL_KEPT_S`, work
    ``grace_s`` after its phase's end."""
    return demand.announced_at + WITHDRAWAL_KEPT_S if demand.groups == 0 else demand.ends_at + grace_s


def _eviction_order(demand: Demand) -> tuple[bool, float]:
    """Which kept announcement goes first from a full book (the least): withdrawals, the oldest first; then
    announced work, the one whose phase ends soonest first."""
    return (demand.groups > 0, demand.ends_at if demand.groups > 0 else demand.announced_at)


class AnnouncedDemands:
    """Each tenant's latest announced :class:`Demand`, for at most ``max_tenants`` tenants."""

    def __init__(self, max_tenants: int = MAX_KEPT_TENANTS) -> None:
        self.max_tenants = max_tenants
        self._by_tenant: dict[str, Demand] = {}

    def keep(self, demand: Demand) -> None:
        """Keep ``demand`` unless a later announcement of its tenant is kept already; a new tenant in a
        full book takes the place of the first to go (or goes itself, where that is it)."""
        known = self._by_tenant.get(demand.tenant)
        if known is not None:
            if demand.announced_at >= known.announced_at:
                self._by_tenant[demand.tenant] = demand
            return
        if len(self._by_tenant) >= self.max_tenants:
            first = min(self._by_tenant.values(), key=_eviction_order)
            if _eviction_order(demand) <= _eviction_order(first):
                return
            del self._by_tenant[first.tenant]
        self._by_tenant[demand.tenant] = demand

    def pop(self, tenant: str) -> Demand:
        """Remove and return ``tenant``'s demand (handed on to another keeper)."""
        return self._by_tenant.pop(tenant)

    def tenants(self) -> list[str]:
        """The tenants with an announcement kept (withdrawn ones included)."""
        return list(self._by_tenant)

    def current(self, now: float, grace_s: float) -> list[Demand]:
        """The kept announcements (withdrawals included: they cancel older copies elsewhere), after
        forgetting those over for ``grace_s`` and withdrawals older than :data:`WITHDRAWAL_KEPT_S`."""
        for tenant in [tenant for tenant, demand in self._by_tenant.items() if _forgotten_at(demand, grace_s) < now]:
            del self._by_tenant[tenant]
        return list(self._by_tenant.values())

    def __iter__(self) -> Iterator[Demand]:
        return iter(list(self._by_tenant.values()))

    def __len__(self) -> int:
        return len(self._by_tenant)
