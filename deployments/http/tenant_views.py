"""What ``GET /v1/tenants`` and ``GET /v1/demand`` show a caller (pure, no Ray).

A tenant's token sees its own row and the other tenants only as totals (not their names); the shared
and the operator's token see every tenant. Either way the answer is bounded: the busiest ``top``
tenants by name, the rest summed under ``other``, whatever the number of names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cluster.autoscaling import Demand
from deployments.http.auth import Caller

__all__ = ["WORK_KEYS", "demand_view", "tenants_view"]

# A tenant's row of /v1/tenants (summed over the scorer replicas), before its share is added.
WORK_KEYS = ("groups_in_flight", "members_waiting", "waiting_for_engine", "at_engine", "recent_groups", "recent_tokens")


def _summed(rows: Iterable[Mapping[str, float]], keys: Iterable[str]) -> dict[str, float]:
    rows = list(rows)
    return {"tenants": len(rows), **{key: sum(row.get(key, 0) for row in rows) for key in keys}}


def _split(names: list[str], caller: Caller, top: int) -> tuple[list[str], list[str]]:
    """The names ``caller`` sees one by one (``names`` busiest first), and the rest."""
    if not caller.sees_all:
        return [caller.tenant], [name for name in names if name != caller.tenant]
    return names[:top], names[top:]


def tenants_view(totals: Mapping[str, Mapping[str, float]], caller: Caller, top: int) -> dict[str, Any]:
    """``{"tenants": {name: row}, "other": totals or None}``: each row's work, and its share of the
    tokens served (``recent_share``, over every tenant)."""
    served = sum(work.get("recent_tokens", 0.0) for work in totals.values())

    def row(work: Mapping[str, float]) -> dict[str, float]:
        into = {key: work.get(key, 0) for key in WORK_KEYS}
        into["recent_share"] = into["recent_tokens"] / served if served else 0.0
        return into

    busiest = sorted(totals, key=lambda name: (-totals[name].get("groups_in_flight", 0),
                                               -totals[name].get("recent_tokens", 0.0), name))
    named, rest = _split(busiest, caller, top)
    other = _summed((totals[name] for name in rest), WORK_KEYS) if rest else None
    if other is not None:
        other["recent_share"] = other["recent_tokens"] / served if served else 0.0
    return {"tenants": {name: row(totals.get(name, {})) for name in named}, "other": other}


def demand_view(demands: Iterable[Demand], now: float, caller: Caller, top: int) -> dict[str, Any]:
    """``{"announcements": [...], "other": totals or None}``: the announcements in force (withdrawals
    left out), largest first; times relative to ``now``."""
    standing = sorted((demand for demand in demands if demand.groups > 0), key=lambda demand: -demand.groups)
    by_name = {demand.tenant: demand for demand in standing}
    named, rest = _split(list(by_name), caller, top)
    announcements = [
        {"tenant": name, "groups": by_name[name].groups, "starts_in_s": round(max(0.0, by_name[name].starts_at - now), 3),
         "ends_in_s": round(by_name[name].ends_at - now, 3), "announced_s_ago": round(now - by_name[name].announced_at, 3)}
        for name in named if name in by_name
    ]
    other = {"tenants": len(rest), "groups": sum(by_name[name].groups for name in rest)} if rest else None
    return {"announcements": announcements, "other": other}
