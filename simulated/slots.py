"""A semaphore whose waiters get a free slot lowest priority first, then first come.

The scripted engine's capacity (``max_concurrent_prompts``): with every priority 0 it serves first
come, first served like ``asyncio.Semaphore``; with ``scheduling: largest_first`` the scorer's
priority (minus the prompt's length) puts the largest waiting group first, as vLLM's priority
scheduler does.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["PrioritySlots"]


class PrioritySlots:
    """``limit`` slots; a waiter with a lower ``priority`` is served first, ties first come."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        self._free = limit
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        """Waiters not yet served."""
        return sum(not future.done() for _, _, future in self._waiting)

    @asynccontextmanager
    async def hold(self, priority: int = 0) -> AsyncIterator[None]:
        """Hold a slot for the ``async with`` block, waiting for one if none is free."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            entry = (priority, next(self._arrivals), asyncio.get_running_loop().create_future())
            heapq.heappush(self._waiting, entry)
            try:
                await entry[2]
            except asyncio.CancelledError:
                if entry[2].done() and not entry[2].cancelled():
                    self._release()  # handed a slot as it was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():  # a cancelled waiter's entry is dropped here
                future.set_result(None)
                return
        self._free += 1
