"""The ledger of scored groups: what a group assembler asks of one (:class:`CompletedGroupLedger`),
and the store behind the ledger deployment (``deployments/ledger.py`` serves it): a bounded,
expiring map whose writes are numbered, so replicas of it can catch up with each other.

Pure logic: no Ray, no I/O; the clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

from cluster.group_records import CompletedGroup


class CompletedGroupLedger(Protocol):
    """Somewhere outside this replica where scored groups outlive it (injected; may be absent).

    A replica publishes each scored group before answering its members; a replica that starts
    collecting a group it does not know looks it up. So a member whose answer died with its
    replica (the group was scored, the answer lost) gets the group's answer when it is re-sent,
    although its group-mates, already answered, will never be sent again.
    """

    async def put(self, group_id: str, record: CompletedGroup) -> None: ...

    async def get(self, group_id: str) -> CompletedGroup | None: ...


class GroupLedger:
    """In-memory, bounded, expiring map from group id to its scored record.

    Writes are numbered, so a peer can ask for what was written since it last asked
    (:meth:`changes_since`) and take it (:meth:`merge`).
    """

    def __init__(self, ttl_s: float, max_groups: int = 200_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.max_groups = max_groups
        self._clock = clock
        self._records: OrderedDict[str, tuple[float, CompletedGroup]] = OrderedDict()
        self._writes: deque[tuple[int, str]] = deque(maxlen=max_groups)  # (number, group id)
        self._last_write = 0

    def put(self, group_id: str, record: CompletedGroup, copy: int = 0) -> None:
        """Store (or replace) a scored group (``copy``: which copy this is, read by the router)."""
        self.expire()
        self._records[group_id] = (self._clock() + self.ttl_s, record)
        self._records.move_to_end(group_id)
        self._log_write(group_id)
        self._bound()

    def get(self, group_id: str, copy: int = 0) -> CompletedGroup | None:
        """The scored group, if it is known and not expired."""
        self.expire()
        entry = self._records.get(group_id)
        return entry[1] if entry is not None else None

    def size(self, copy: int = 0) -> int:
        """Groups held."""
        self.expire()
        return len(self._records)

    def changes_since(self, since: int, exclude: str | None = None) -> tuple[int, list[tuple[str, float, CompletedGroup]]]:
        """The number of the last write, and the records written after write ``since`` that are
        still held, each with the seconds it has left (``exclude``: the asking replica, for the router).

        Remaining time rather than an expiry instant: monotonic clocks differ between processes.
        """
        self.expire()
        now = self._clock()
        changed: list[tuple[str, float, CompletedGroup]] = []
        for number, group_id in reversed(self._writes):
            if number <= since:
                break
            entry = self._records.get(group_id)
            if entry is not None:
                changed.append((group_id, entry[0] - now, entry[1]))
        return self._last_write, changed

    def merge(self, records: list[tuple[str, float, CompletedGroup]]) -> int:
        """Take a peer's records (from its :meth:`changes_since`) that this ledger lacks; returns how many."""
        now = self._clock()
        taken = 0
        for group_id, remaining_s, record in records:
            if remaining_s > 0 and group_id not in self._records:
                self._records[group_id] = (now + min(remaining_s, self.ttl_s), record)
                self._log_write(group_id)  # so a replica that starts later takes it from here too
                taken += 1
        if taken:
            # Insertion order is expiry order (what _expire relies on): a peer's records interleave.
            self._records = OrderedDict(sorted(self._records.items(), key=lambda item: item[1][0]))
            self._bound()
        return taken

    def _log_write(self, group_id: str) -> None:
        self._last_write += 1
        self._writes.append((self._last_write, group_id))

    def _bound(self) -> None:
        while len(self._records) > self.max_groups:
            self._records.popitem(last=False)

    def expire(self) -> None:
        """Forget the records past their time."""
        now = self._clock()
        while self._records:
            expires_at, _ = next(iter(self._records.values()))
            if expires_at > now:
                break
            self._records.popitem(last=False)
