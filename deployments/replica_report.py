"""What a replica reports about itself to operators, benchmarks and tests: ``info``, ``recent_groups``
and ``tenants`` (each asked of one replica by id: ``grrm_handles.send.to_replica``)."""

from __future__ import annotations

import dataclasses
import os
import resource
from typing import Any

from cluster.admission import GroupsInFlight
from cluster.assembly import GroupAssembler
from cluster.assembly_observers import RecentGroups
from cluster.engine_lane import EngineLane
from cluster.fair_share import GateStats
from cluster.protocol.schema import unscoped_group_id
from deployments.config import AppConfig

__all__ = ["replica_info", "recent_group_rows", "tenant_rows"]


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:  # not Linux
        return None


def replica_info(name: str, config: AppConfig, lane: EngineLane, assembler: GroupAssembler,
                 cold_start_s: float | None) -> dict[str, Any]:
    """What this replica runs, what it did so far, and its memory."""
    return {
        "replica": name,
        "pid": os.getpid(),
        "model": config.engine.model,
        "engine": config.engine.kind,
        "prompt_type": config.scoring.prompt_type,
        **config.engine.parallelism(),
        "groups_scored": lane.groups_scored,
        "cold_start_s": cold_start_s,  # construction to serving, as the policy reads it
        # Resident memory of this replica process now, and its peak so far (Linux: KiB).
        "rss_bytes": _current_rss_bytes(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "assembler": assembler.stats(),
        "engine_sleep": None if (sleeper := lane.sleeper) is None else {
            "sleeping": sleeper.sleeping, "sleeps": sleeper.sleeps, "wakes": sleeper.wakes,
            "woken_for_work": sleeper.woken_for_work},
    }


def recent_group_rows(recent: RecentGroups, since: float | None) -> list[dict[str, Any]]:
    """The groups scored lately, oldest first, with their tenant and times (see ``GRRMReplica.recent_groups``)."""
    rows = []
    for trace in recent.since(since):
        tenant, group_id = unscoped_group_id(trace.group_id)
        rows.append({**dataclasses.asdict(trace), "group_id": group_id, "tenant": tenant})
    return rows


def tenant_rows(lane: EngineLane, in_flight: GroupsInFlight, assembler: GroupAssembler) -> dict[str, dict[str, Any]]:
    """Each active tenant's work on this replica now and what the engine served it lately."""
    stats = lane.gate.stats()
    collecting = assembler.members_collecting()
    report = {}
    for name in set(stats) | in_flight.tenants() | set(collecting):
        gate = stats.get(name, GateStats())
        report[name] = {"groups_in_flight": in_flight.count(name),
                        "members_waiting": collecting.get(name, 0), "waiting_for_engine": gate.waiting,
                        "at_engine": gate.running, "recent_groups": gate.recent_groups,
                        "recent_tokens": gate.recent_tokens}
    return report
