"""What the keepers of announced demand (the HTTP ingress, the scorer replicas) report to the autoscaling
policy, and how the policy reads all their reports (pure, no Ray).

Serve's controller reads every reporter's keys every second: reports that named every tenant (4 keys each,
and one per slice of its profile) took it from 25% to 87% CPU with 1,000 tenants. So a report holds at most
:data:`MAX_REPORT_KEYS` keys, whatever the number of tenants:

- its :data:`REPORTED_TENANTS` largest announcements (by the rate of their busiest slice: what they may
  claim), each whole, with its tenant as a number (:func:`tenant_id`). These are the tenants that matter: per
  tenant the latest announcement wins across reporters, a withdrawal cancels older copies elsewhere, and each
  is clamped to its tenant's cap;
- its :data:`REPORTED_WITHDRAWALS` latest withdrawals (0 groups: whose, and when);
- the rest merged into one demand (tenant :data:`~cluster.autoscaling.OTHER_TENANTS`) over the next
  :data:`MERGED_HORIZON_S` seconds (:func:`merged_demand`): for any look-ahead within it the policy reads
  what it would add up for them one by one, each one's busiest slice. The far future waits for a later
  report (one comes every ``metrics_interval_s``).

Why the largest by name and the rest merged, rather than one forecast timeline of everything: the policy's
per-tenant rules (the latest wins, a withdrawal cancels, the cap) need the tenant, and a shared pool's
tenants that matter are few; a flood of names still counts, in a fixed number of keys.

Entries go by position (``demand/<i>/...``), not by tenant name, so that the keys Serve's controller tracks
are a fixed set (a name no longer reported would linger there as a stale series for ``look_back_period_s``);
``demand/entries`` says how many positions hold this report's (one beyond is a stale series from an earlier
report).

The policy (:class:`DemandReader`) takes, of every tenant named anywhere, its latest announcement; a reported
withdrawal it remembers for as long as an older copy of that tenant is reported anywhere (the keeper forgets
it after a minute: ``cluster/announced_demand.py``). The merged tails it adds up within a deployment and takes
the larger deployment's: the ingress keeps every announcement it took and a scorer replica copies of them, so
counting both would count a tenant twice. Approximate, beyond each reporter's largest tenants: a merged
tenant counts where its reporter's tail is (a withdrawal taken elsewhere does not cancel it there: an older
copy counts until its phase ends; one named by another reporter may count there too), up to a slice (4.7 s)
further ahead than the policy looks, and from its phase's start rather than from a backlog's worth of work:
a little more than the tenants one by one, never less.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping

from cluster.autoscaling import OTHER_TENANTS, Demand

__all__ = [
    "MAX_REPORT_KEYS",
    "MERGED_HORIZON_S",
    "MERGED_SLICES",
    "REPORTED_TENANTS",
    "REPORTED_WITHDRAWALS",
    "DemandReader",
    "merged_demand",
    "read_report",
    "report_demands",
    "reported_groups",
    "tenant_id",
]

REPORTED_TENANTS = 8  # announcements a report holds whole (a shared pool's runs announce a few at once)
REPORTED_WITHDRAWALS = 8  # the latest withdrawals a report holds
# How far ahead the merged rest reaches: beyond the policy's look-ahead (two cold starts, or the break-even
# horizon of idle="sleep": (60 - 10) / 0.1 = 500 s at the defaults) ...
MERGED_HORIZON_S = 600.0
# ... in slices of 4.7 s: the policy may count a merged tenant up to a slice further ahead than it looks.
MERGED_SLICES = 128
MAX_PROFILE_SLICES = 64  # DemandAnnouncement.profile's max_length; a longer profile is resampled
PREFIX = "demand/"
ENTRIES = f"{PREFIX}entries"
ENTRY_FIELDS = ("tenant", "groups", "starts_at", "ends_at", "announced_at", "tenants", "slices")
MERGED = -1  # the tenant number of the merged rest (tenant_id is never negative)
MAX_REPORT_KEYS = (1 + REPORTED_TENANTS * (len(ENTRY_FIELDS) + MAX_PROFILE_SLICES)
                   + REPORTED_WITHDRAWALS * len(ENTRY_FIELDS) + len(ENTRY_FIELDS) + MERGED_SLICES)
# Withdrawals the policy remembers at most (each one while an older copy of its tenant is reported).
MAX_REMEMBERED_WITHDRAWALS = 1024


def tenant_id(tenant: str) -> int:
    """A tenant as a report value: 48 bits of a hash that is the same in every process (a float holds it
    exactly; two of 10,000 names share one with a chance of 2e-7)."""
    return int.from_bytes(hashlib.blake2b(tenant.encode("utf-8"), digest_size=6).digest(), "big")


def report_demands(demands: Iterable[Demand], now: float, grace_s: float = 0.0) -> dict[str, float]:
    """A keeper's announced demands (withdrawals included) as a report of at most :data:`MAX_REPORT_KEYS`
    keys; ``grace_s``: how long a merged phase keeps the rate of its last slice after its end."""
    demands = list(demands)
    work = sorted((demand for demand in demands if demand.groups > 0),
                  key=lambda demand: (demand.peak_rate(demand.starts_at, demand.ends_at), demand.announced_at),
                  reverse=True)
    withdrawals = sorted((demand for demand in demands if demand.groups <= 0),
                         key=lambda demand: demand.announced_at, reverse=True)
    entries = [(tenant_id(demand.tenant), demand)
               for demand in work[:REPORTED_TENANTS] + withdrawals[:REPORTED_WITHDRAWALS]]
    rest = [demand for demand in work[REPORTED_TENANTS:] if demand.ends_at + grace_s > now]
    if rest:
        entries.append((MERGED, merged_demand(rest, now, grace_s)))
    report = {ENTRIES: float(len(entries))}
    for position, (tenant, demand) in enumerate(entries):
        report.update(_entry(f"{PREFIX}{position}/", tenant, demand))
    return report


def _entry(prefix: str, tenant: int, demand: Demand) -> dict[str, float]:
    profile = _resampled(demand.profile, MERGED_SLICES if tenant == MERGED else MAX_PROFILE_SLICES)
    entry = dict(zip((prefix + name for name in ENTRY_FIELDS),
                     (float(tenant), float(demand.groups), demand.starts_at, demand.ends_at, demand.announced_at,
                      float(demand.tenants), float(len(profile))), strict=True))
    entry.update({f"{prefix}profile/{position}": share for position, share in enumerate(profile)})
    return entry


def _resampled(profile: tuple[float, ...], slices: int) -> tuple[float, ...]:
    """``profile`` in at most ``slices`` equal slices, each holding the shares it overlaps pro rata."""
    if len(profile) <= slices:
        return profile
    resampled = [0.0] * slices
    for position, share in enumerate(profile):  # a share over [position, position + 1) of len(profile)
        begins, ends = position * slices / len(profile), (position + 1) * slices / len(profile)
        for target in range(int(begins), min(slices, math.ceil(ends))):
            resampled[target] += share * (min(ends, target + 1) - max(begins, target)) / (ends - begins)
    return tuple(resampled)


def merged_demand(demands: list[Demand], now: float, grace_s: float) -> Demand:
    """``demands`` (announced work) as one demand from the first one's start (or now) over at most
    :data:`MERGED_HORIZON_S`, in :data:`MERGED_SLICES` slices whose rates are, each, the sum of every demand's
    busiest rate from now to the slice's end (its last slice's rate counts ``grace_s`` past its end).

    So for any look-ahead the policy's busiest slice of it is what :func:`~cluster.autoscaling.replicas_for_demand`
    adds up for the demands one by one: each one's busiest slice within it (to within a slice). Its profile is
    not when its groups come (it only grows), and it counts each one from its start, not from when its work
    reaches a replica's backlog: more, never fewer, replicas than the demands one by one."""
    starts_at = max(now, min(demand.starts_at for demand in demands))
    ends_at = min(max(demand.ends_at + grace_s for demand in demands), starts_at + MERGED_HORIZON_S)
    ends_at = max(ends_at, starts_at + 1.0)  # a demand spans a second at least (Demand.span_s)
    slice_s = (ends_at - starts_at) / MERGED_SLICES
    # Where the sum steps up: each demand's busiest rate so far grows at the slice its busier piece begins in.
    steps = [0.0] * MERGED_SLICES
    for demand in demands:
        busiest = 0.0
        for begins, ends, rate in _segments(demand, grace_s):  # in order of time
            if ends > starts_at and begins < ends_at and rate > busiest:
                steps[max(0, math.floor((begins - starts_at) / slice_s))] += rate - busiest
                busiest = rate
    groups = [rate * slice_s for rate in itertools.accumulate(steps)]
    return Demand(OTHER_TENANTS, math.ceil(sum(groups) - 1e-9), starts_at, ends_at,
                  announced_at=max(demand.announced_at for demand in demands), profile=tuple(groups),
                  tenants=len(demands))


def _segments(demand: Demand, grace_s: float) -> Iterator[tuple[float, float, float]]:
    """``demand``'s arrival rate as (begins, ends, groups per second) pieces: each slice of its profile, then
    its last slice's rate for ``grace_s`` (the policy keeps that for a phase's last groups)."""
    length = demand.span_s()
    shares = demand.profile if demand.profile and sum(demand.profile) > 0 else (1.0,)
    total, slice_s = sum(shares), length / len(shares)
    for position, share in enumerate(shares):
        yield (demand.starts_at + position * slice_s, demand.starts_at + (position + 1) * slice_s,
               demand.groups * share / total / slice_s)
    if grace_s > 0:
        ends = demand.starts_at + length
        yield ends, ends + grace_s, demand.groups * shares[-1] / total / slice_s


def read_report(report: Mapping[str, float], names: Mapping[int, str] | None = None) -> list[tuple[int, Demand]]:
    """A report's entries: (tenant number, its demand), the merged rest as (:data:`MERGED`, its demand). A
    tenant is named by ``names`` where it is there, else by its number (``#<hex>``: no tenant's name)."""
    names = names or {}
    entries = []
    for position in range(int(report.get(ENTRIES, 0))):
        prefix = f"{PREFIX}{position}/"
        if prefix + "groups" not in report:
            continue
        tenant = int(report.get(prefix + "tenant", MERGED))
        slices = int(report.get(prefix + "slices", 0))
        name = OTHER_TENANTS if tenant == MERGED else names.get(tenant, f"#{tenant:012x}")
        demand = Demand(name, int(report[prefix + "groups"]), report.get(prefix + "starts_at", 0.0),
                        report.get(prefix + "ends_at", 0.0), report.get(prefix + "announced_at", 0.0),
                        tuple(report.get(f"{prefix}profile/{slice_}", 0.0) for slice_ in range(slices)),
                        tenants=int(report.get(prefix + "tenants", 1)))
        entries.append((tenant, demand))
    return entries


def reported_groups(report: Mapping[str, float], tenant: str) -> float | None:
    """The groups ``report`` holds for ``tenant`` by name (0: its withdrawal; None: not named there)."""
    number = tenant_id(tenant)
    return next((float(demand.groups) for reported, demand in read_report(report) if reported == number), None)


class DemandReader:
    """The announced demand the policy decides on, from every keeper's report (see the module docstring).
    It remembers reported withdrawals from one read to the next; ``tenants``: names to give the tenants
    that have a cap of their own (the others are known by number; their cap is the default)."""

    def __init__(self, tenants: Iterable[str] = ()) -> None:
        self.names = {tenant_id(tenant): tenant for tenant in tenants}
        # tenant number -> (the latest withdrawal's announced_at, until when it is remembered)
        self.withdrawn: dict[int, tuple[float, float]] = {}

    def demands(self, deployments: Iterable[Iterable[Mapping[str, float]]], now: float,
                grace_s: float) -> list[Demand]:
        """The demands the reports of ``deployments`` (each its reporters' reports) hold that count now."""
        copies: dict[int, list[Demand]] = {}
        merged_tails: list[list[Demand]] = []
        for reports in deployments:
            merged_tails.append([])
            for report in reports:
                for tenant, demand in read_report(report, self.names):
                    if tenant == MERGED:
                        merged_tails[-1].append(demand)
                    else:
                        copies.setdefault(tenant, []).append(demand)
        counted = [latest for tenant, of_tenant in copies.items()
                   if (latest := self._latest(tenant, of_tenant, now, grace_s)) is not None
                   and latest.ends_at + grace_s >= now]
        self._forget(now)
        # The merged tails of the deployment that holds more of them (see the module docstring).
        tail = max(merged_tails, key=lambda merged: sum(demand.groups for demand in merged), default=[])
        return counted + [demand for demand in tail if demand.ends_at + grace_s >= now]

    def _latest(self, tenant: int, of_tenant: list[Demand], now: float, grace_s: float) -> Demand | None:
        """A tenant's latest announcement reported (None: withdrawn), remembering its withdrawals while
        older copies are reported."""
        latest = of_tenant[0]
        for demand in of_tenant[1:]:
            if demand.announced_at > latest.announced_at:
                latest = demand
        withdrawals = [demand.announced_at for demand in of_tenant if demand.groups <= 0]
        withdrawn_at, until = self.withdrawn.get(tenant, (-math.inf, now))
        withdrawn_at = max([withdrawn_at, *withdrawals])
        if withdrawn_at == -math.inf:
            return latest
        # Remembered while it is reported, and then until the older copies it cancels would have expired.
        older = [demand.ends_at + grace_s for demand in of_tenant
                 if demand.groups > 0 and demand.announced_at < withdrawn_at]
        self.withdrawn[tenant] = (withdrawn_at, max([until, *older, now] if withdrawals or older else [until]))
        return latest if latest.groups > 0 and latest.announced_at > withdrawn_at else None

    def _forget(self, now: float) -> None:
        """Forget the withdrawals that cancel nothing reported now and no copy that may still count; beyond
        :data:`MAX_REMEMBERED_WITHDRAWALS`, those remembered for the shortest time first."""
        for tenant, (_, until) in list(self.withdrawn.items()):
            if until < now:
                del self.withdrawn[tenant]
        if len(self.withdrawn) > MAX_REMEMBERED_WITHDRAWALS:
            kept = sorted(self.withdrawn.items(), key=lambda item: item[1][1])[-MAX_REMEMBERED_WITHDRAWALS:]
            self.withdrawn = dict(kept)
