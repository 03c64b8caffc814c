"""What a group assembler tells the rest of its replica: the groups it answered, and those it handed on.

:class:`AssemblyObserver` is the typed hook a :class:`~cluster.assembly.GroupAssembler` is given (its
methods do nothing by default: an observer overrides what it watches); :class:`RecentGroups` keeps the
last scored groups' traces for a replica's reports, benchmarks and tests.

Pure: no Ray, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from cluster.failures import FailureReason

__all__ = ["RECENT_GROUPS", "AssemblyObserver", "GroupTrace", "RecentGroups"]

# Scored groups kept by RecentGroups (timestamps for diagnostics and tests).
RECENT_GROUPS = 10_000


@dataclass(frozen=True, slots=True)
class GroupTrace:
    """When one scored group went through this replica (Unix seconds), for :class:`RecentGroups`."""

    group_id: str
    group_size: int
    first_sent_at: float | None  # the earliest sent_at of its members (the callers' clocks)
    first_received_at: float  # its first member's arrival here (the assembly that completed)
    complete_at: float
    scoring_started_at: float
    scoring_ended_at: float
    valid: bool
    failure: FailureReason | None


class AssemblyObserver(Protocol):
    """Told what an assembler did with its groups; each method does nothing unless an observer overrides it."""

    def group_scored(self, trace: GroupTrace) -> None:
        """A complete group got its verdict here (scored, or too few members to score)."""

    def group_handed_off(self, group_id: str, owner: str) -> None:
        """A group no engine had begun was released to ``owner``, the replica that now collects it."""


class RecentGroups(AssemblyObserver):
    """The last scored groups' traces (at most :data:`RECENT_GROUPS`), oldest first."""

    def __init__(self, size: int = RECENT_GROUPS):
        self._traces: deque[GroupTrace] = deque(maxlen=size)

    def group_scored(self, trace: GroupTrace) -> None:
        self._traces.append(trace)

    def since(self, at: float | None = None) -> list[GroupTrace]:
        """The traces kept, oldest first; ``at``: only those whose scoring ended at or after that wall-clock time."""
        return [trace for trace in self._traces if at is None or trace.scoring_ended_at >= at]
