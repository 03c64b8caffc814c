"""Groups whose members come with neither a group id nor a position: which group a member joins.

OpenRLHF posts each sample of a prompt on its own, concurrently for the ``n`` samples of one
prompt, with no group id and no index. The samples of one prompt share a *key* (the service derives
it from the prompt, the label and ``n``), and every member gets an id of its own. The same key comes
back later (the next epoch, or the same prompt twice in one batch), so a key is not a group:
:class:`OpenGroups` cuts its members into groups of ``size`` in arrival order -- the first ``size``
members of a key form one group, the next ``size`` the next -- and names each group
``{key}~{token}`` with a token of its own (never reused, so a later group never reads an earlier
one's verdict). A member sent again (a caller's retry) is recognised by its id and gets the group it
joined the first time.

The replica that owns a key (the router sends every member of a key to one replica) holds its
:class:`OpenGroups`; a member's id is forgotten ``ttl_s`` after it was last seen.
Pure Python: no Ray, no I/O.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OpenGroups", "GROUP_SEPARATOR"]

# Between a key and its group's token in a group id.
GROUP_SEPARATOR = "~"


@dataclass
class _Filling:
    """The group of a key that is taking members now."""

    group_id: str
    size: int
    members: int = 0


class OpenGroups:
    """Assigns members of keyed, unnumbered groups to groups of their size, in arrival order."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 token: Callable[[], str] = lambda: uuid.uuid4().hex[:12]):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s: must be positive (got {ttl_s})")
        self.ttl_s = ttl_s
        self._clock = clock
        self._token = token
        self._filling: dict[str, _Filling] = {}
        # (key, member id) -> (group id, last seen), least recently seen first.
        self._members: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._remembered: dict[str, int] = {}  # group id -> its members remembered now

    def group_of(self, key: str, size: int, member_id: str) -> str:
        """The group id of member ``member_id`` of a group of ``size`` under ``key``."""
        if size < 1:
            raise ValueError(f"size: must be at least 1 (got {size})")
        now = self._clock()
        self._expire(now)
        known = self._members.pop((key, member_id), None)
        if known is not None:
            self._members[(key, member_id)] = (known[0], now)
            return known[0]
        filling = self._filling.get(key)
        if filling is None or filling.members >= filling.size or filling.size != size:
            # A full group, or a caller that changed n: the next members form a new group.
            filling = self._filling[key] = _Filling(f"{key}{GROUP_SEPARATOR}{self._token()}", size)
        filling.members += 1
        self._members[(key, member_id)] = (filling.group_id, now)
        self._remembered[filling.group_id] = self._remembered.get(filling.group_id, 0) + 1
        return filling.group_id

    def members(self) -> int:
        """Members remembered now."""
        return len(self._members)

    def _expire(self, now: float) -> None:
        while self._members:
            (key, member_id), (group_id, seen) = next(iter(self._members.items()))
            if now - seen < self.ttl_s:
                return
            del self._members[(key, member_id)]
            self._remembered[group_id] -= 1
            if self._remembered[group_id] == 0:
                del self._remembered[group_id]
                filling = self._filling.get(key)
                if filling is not None and filling.group_id == group_id:
                    del self._filling[key]  # a group nobody was seen for in ttl_s takes no more members
