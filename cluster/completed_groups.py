"""Groups already scored: the answers kept for retries, and the ledger they are published to and adopted from.

A replica's :class:`~cluster.assembly.GroupAssembler` hands every group it scored to :class:`CompletedGroups`:
it publishes the group's record to the ledger before the members hear of it (a member whose answer dies with
this replica is re-sent elsewhere and finds it there), and keeps it for ``ttl_s`` so that a retry arriving
here is answered from it. A group another replica scored is looked up in the ledger when its first member
arrives, and adopted. The ledger is optional and bounded in time: a ledger outage never holds an answer back.

Pure asyncio: no Ray, no I/O of its own (the ledger is injected: ``deployments/ledger.py`` on Serve).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from cluster.group_records import CompletedGroup
from cluster.ledger import CompletedGroupLedger, GroupLedger

__all__ = ["LEDGER_WRITE_BUDGET_S", "CompletedGroups", "LedgerCounts"]

# How long a ledger write may go on after its members were answered (a ledger replica being
# replaced, a starved CPU) before it is given up and counted as a ledger error.
LEDGER_WRITE_BUDGET_S = 60.0


@dataclass(slots=True)
class LedgerCounts:
    """What the ledger did for this replica since it started (the names its stats export)."""

    ledger_adopted: int = 0  # groups answered from the ledger (scored by a replica now gone)
    ledger_errors: int = 0  # ledger calls that failed or timed out (scoring goes on without)
    ledger_late_writes: int = 0  # writes that outlasted ledger_timeout_s: answered first, written after


class CompletedGroups:
    """The scored groups of one replica: a bounded, expiring answer cache, published to an optional ledger."""

    def __init__(self, ttl_s: float = 600.0, max_groups: int = 100_000, ledger: CompletedGroupLedger | None = None,
                 ledger_timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        """``ttl_s``: how long a scored group's answer is kept for retries (at most ``max_groups`` of them;
        0: none); ``ledger``: where scored groups outlive this replica (None: nowhere), each call to it
        bounded by ``ledger_timeout_s``; ``clock``: expiry's clock."""
        if ttl_s < 0:
            raise ValueError(f"completed_ttl_s must not be negative, got {ttl_s}")
        if max_groups < 0:
            raise ValueError(f"max_completed_groups must be >= 0, got {max_groups}")
        self.ttl_s = float(ttl_s)
        self.max_groups = max_groups
        self.ledger_timeout_s = ledger_timeout_s
        self.counts = LedgerCounts()
        self._ledger = ledger
        self._clock = clock
        self._groups = GroupLedger(self.ttl_s, max_groups, clock)  # the same bounded, expiring map as a ledger's
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def has_ledger(self) -> bool:
        """Whether scored groups are published to (and looked up in) a ledger."""
        return self._ledger is not None

    def get(self, group_id: str) -> CompletedGroup | None:
        """The group's record, while it is kept."""
        return self._groups.get(group_id)

    def __contains__(self, group_id: str) -> bool:
        return self._groups.get(group_id) is not None

    def __len__(self) -> int:
        return self._groups.size()

    def remember(self, group_id: str, record: CompletedGroup) -> None:
        """Keep ``record`` for retries (the oldest goes beyond ``max_groups``)."""
        if self.max_groups > 0:
            self._groups.put(group_id, record)

    def expire(self) -> None:
        """Forget the records past their time."""
        self._groups.expire()

    async def look_up(self, group_id: str) -> CompletedGroup | None:
        """The ledger's record of a group another replica scored (None: no record, no ledger, or no
        answer within ``ledger_timeout_s``, which counts as a ledger error)."""
        if self._ledger is None:
            return None
        try:
            return await asyncio.wait_for(self._ledger.get(group_id), self.ledger_timeout_s)
        except Exception:  # noqa: BLE001 - no ledger answer: the group is assembled as usual
            self.counts.ledger_errors += 1
            return None

    def adopt(self, group_id: str, record: CompletedGroup) -> None:
        """Keep the ledger's ``record`` as this replica's answer for the group."""
        self.counts.ledger_adopted += 1
        self.remember(group_id, record)  # for ttl_s from now, whenever the ledger took it

    async def publish(self, group_id: str, record: CompletedGroup) -> None:
        """Write a scored group to the ledger before its members hear of it.

        The members wait for the write at most ``ledger_timeout_s`` (a ledger outage must not hold
        answers back); a write still under way then goes on in the background, so a slow ledger
        delays the record instead of losing it: a member re-sent after this replica dies must find
        what the others were told.
        """
        if self._ledger is None:
            return
        write = asyncio.get_running_loop().create_task(self._write(group_id, record), name=f"ledger-put-{group_id}")
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        try:
            await asyncio.wait_for(asyncio.shield(write), self.ledger_timeout_s)
        except TimeoutError:
            self.counts.ledger_late_writes += 1

    async def _write(self, group_id: str, record: CompletedGroup) -> None:
        assert self._ledger is not None
        try:
            await asyncio.wait_for(self._ledger.put(group_id, record), LEDGER_WRITE_BUDGET_S)
        except Exception:  # noqa: BLE001 - counted; the members were answered regardless
            self.counts.ledger_errors += 1

    async def finish_writes(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the ledger writes still under way (the records of groups
        already answered): a replica about to end gives them this grace."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout_s)

    async def close(self) -> None:
        """Give the writes under way ``ledger_timeout_s``, drop the rest, and forget every record."""
        await self.finish_writes(self.ledger_timeout_s)
        for write in list(self._writes):
            write.cancel()
        self._groups = GroupLedger(self.ttl_s, self.max_groups, self._clock)

    def stats(self) -> dict[str, int]:
        """The ledger's counters, the records kept and the writes under way."""
        return {**dataclasses.asdict(self.counts), "completed_cached": self._groups.size(),
                "ledger_writes_pending": len(self._writes)}
