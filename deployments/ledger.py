"""The ledger of scored groups: one small Serve deployment every scorer replica writes to.

A replica publishes each scored group here before answering its members, so the answer
outlives the replica: a member whose answer was lost when its replica died is re-sent to
another replica, which finds the group here (see ``cluster.assembly.CompletedGroupLedger``).
Entries hold digests and scores only, expire after ``ttl_s``, and are bounded in number.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from ray.serve.handle import DeploymentHandle

from cluster.assembly import CompletedGroup


class GroupLedger:
    """In-memory, bounded, expiring map from group id to its scored record."""

    def __init__(self, ttl_s: float, max_groups: int = 200_000):
        self.ttl_s = ttl_s
        self.max_groups = max_groups
        self._records: OrderedDict[str, tuple[float, CompletedGroup]] = OrderedDict()

    def put(self, group_id: str, record: CompletedGroup) -> None:
        """Store (or replace) a scored group."""
        self._expire()
        self._records[group_id] = (time.monotonic() + self.ttl_s, record)
        self._records.move_to_end(group_id)
        while len(self._records) > self.max_groups:
            self._records.popitem(last=False)

    def get(self, group_id: str) -> CompletedGroup | None:
        """The scored group, if it is known and not expired."""
        self._expire()
        entry = self._records.get(group_id)
        return entry[1] if entry is not None else None

    def size(self) -> int:
        """Groups held."""
        return len(self._records)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._records:
            expires_at, _ = next(iter(self._records.values()))
            if expires_at > now:
                break
            self._records.popitem(last=False)


class ServeLedger:
    """The assembler's ledger interface over a handle to the GroupLedger deployment."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle

    async def put(self, group_id: str, record: CompletedGroup) -> None:
        await self.handle.put.remote(group_id, record)

    async def get(self, group_id: str) -> CompletedGroup | None:
        return await self.handle.get.remote(group_id)
