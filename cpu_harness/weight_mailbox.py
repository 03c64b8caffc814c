"""TEST SUPPORT: the mailbox through which :mod:`cpu_harness.checkpoint_engine` hands weights over.

A module of its own, importing only Ray: the mailbox's Ray worker then starts without importing
verl, torch or vLLM (a noticeable cost on a 2-core machine).
"""

from __future__ import annotations

import asyncio

import ray

__all__ = ["WeightMailbox"]


@ray.remote(num_cpus=0)
class WeightMailbox:
    """Per sync id, the ordered bucket references actor rank 0 posted (an asyncio actor).

    One per training job (a named actor in the job's namespace, owned by the process that first
    asks for it: the one that holds verl's ``CheckpointEngineManager``).
    """

    NAME = "cpu_harness_weight_mailbox"

    def __init__(self) -> None:
        self._buckets: dict[str, list[tuple[list[ray.ObjectRef], bool]]] = {}
        self._posted = asyncio.Condition()

    async def put(self, sync_id: str, bucket: list[ray.ObjectRef], is_last: bool) -> None:
        # ``bucket`` is a list so that Ray hands over the reference, not the tensors it names.
        async with self._posted:
            self._buckets.setdefault(sync_id, []).append((bucket, is_last))
            self._posted.notify_all()

    async def get(self, sync_id: str, index: int) -> tuple[list[ray.ObjectRef], bool]:
        async with self._posted:
            await self._posted.wait_for(lambda: len(self._buckets.get(sync_id, ())) > index)
            return self._buckets[sync_id][index]

    async def clear(self, sync_id: str) -> None:
        async with self._posted:
            self._buckets.pop(sync_id, None)
