"""TEST SUPPORT: a verl checkpoint-engine backend for a machine without GPUs: weights via Ray's object store.

verl's modes with a standalone rollout pool (v1 ``separate_async``, ``one_step_off_policy``,
``fully_async_policy``) sync the trained weights to the rollout replicas through a checkpoint
engine (``verl/checkpoint_engine/base.py``, ``CheckpointEngineManager.update_weights``). Their
default backend, ``nccl``, needs cupy and CUDA. verl loads a backend of one's own from
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module`` (imported by the actor
workers, ``CheckpointEngineWorker`` and ``CheckpointEngineManager``); this module registers
:data:`BACKEND` there::

    actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_object_store
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=cpu_harness.checkpoint_engine

How a sync goes (the same calls verl makes on the nccl backend, see ``nccl_checkpoint_engine.py``):

* ``build_topology`` (in the process that holds the ``CheckpointEngineManager``) gets or creates the
  job's :class:`~cpu_harness.weight_mailbox.WeightMailbox` actor and hands its handle and a fresh sync id to every worker
  (``init_process_group`` kwargs);
* actor rank 0 (the ``is_master`` engine) walks the trained weights, puts them into Ray's object
  store one bucket at a time (``ray.put``) and posts each bucket's reference to the mailbox; other
  actor ranks walk the generator (gathering a weight is collective over the actor group) and drop it;
* every rollout worker reads the references from the mailbox in order and yields the tensors
  to its server adapter (vLLM's ``update_weights``);
* ``finalize`` on actor rank 0 drops the sync's references, so the object store frees the buckets.

Checked once (2026-11-23, ``one_step_off``, ``actor.optim.lr=1e-2`` so that one update shows in
bfloat16): after each sync, ``layers.0.mlp.down_proj.weight`` inside the vLLM worker equalled what
actor rank 0 sent (to bfloat16 rounding), starting from the checkpoint's values at the initial
sync (vLLM starts on dummy weights) and changing with every trained update.

Nothing here is used on a GPU cluster.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Generator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from cpu_harness.weight_mailbox import WeightMailbox

__all__ = ["BACKEND", "MODULE", "ObjectStoreCheckpointEngine", "WeightMailbox"]

BACKEND = "cpu_object_store"
MODULE = __name__

logger = logging.getLogger(__name__)


@CheckpointEngineRegistry.register(BACKEND)
class ObjectStoreCheckpointEngine(CheckpointEngine):
    """Actor rank 0 -> Ray object store -> every rollout worker (see the module docstring)."""

    def __init__(self, bucket_size: int, is_master: bool = False, **kwargs: Any) -> None:
        # verl's default bucket (update_weights_bucket_megabytes) is 2 GiB; nothing is
        # preallocated here, it only bounds how many bytes one ray.put carries.
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.rank: int | None = None
        self.sync_id: str | None = None
        self.mailbox: ray.actor.ActorHandle | None = None

    def prepare(self) -> dict[str, Any]:
        return {"is_master": self.is_master}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        assert metadata[0]["is_master"], "actor rank 0 must be the checkpoint engine master"
        mailbox = WeightMailbox.options(name=WeightMailbox.NAME, get_if_exists=True).remote()
        sync_id = uuid.uuid4().hex
        actor_kwargs = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),  # only rank 0 sends
            "sync_id": [sync_id] * actor_wg_world_size,
            "mailbox": [mailbox] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(1, rollout_world_size + 1)),
            "sync_id": [sync_id] * rollout_world_size,
            "mailbox": [mailbox] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, sync_id: str, mailbox: ray.actor.ActorHandle) -> None:
        self.rank, self.sync_id, self.mailbox = rank, sync_id, mailbox

    def finalize(self) -> None:
        if self.rank == 0 and self.mailbox is not None:
            self.mailbox.clear.remote(self.sync_id)  # every receiver is done (verl finalizes after update_weights)
        self.rank, self.sync_id, self.mailbox = None, None, None

    @torch.no_grad()
    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> dict:
        assert self.rank is not None and self.rank <= 0, "rollout workers do not send weights"
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):  # collective over the actor group
                pass
            return {}
        started, total_bytes, count = time.time(), 0, 0
        bucket: dict[str, torch.Tensor] = {}
        bucket_bytes = 0
        async for name, weight in ensure_async_iterator(weights):
            tensor = weight.detach().to("cpu").contiguous()
            if bucket and bucket_bytes + tensor.nbytes > self.bucket_size:
                await self._post(bucket, is_last=False)
                bucket, bucket_bytes = {}, 0
            bucket[name] = tensor
            bucket_bytes += tensor.nbytes
            total_bytes += tensor.nbytes
            count += 1
        await self._post(bucket, is_last=True)
        logger.info(
            "sent %d tensors (%.1f MiB) through the object store in %.2f s",
            count, total_bytes / 2**20, time.time() - started,
        )
        return {}

    async def _post(self, bucket: dict[str, torch.Tensor], is_last: bool) -> None:
        await self.mailbox.put.remote(self.sync_id, [ray.put(bucket)], is_last)

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        assert self.rank is not None and self.rank > 0, "actor rank 0 does not receive weights"
        index, is_last = 0, False
        while not is_last:
            (reference,), is_last = await self.mailbox.get.remote(self.sync_id, index)
            bucket: dict[str, torch.Tensor] = await reference
            for name, tensor in bucket.items():
                yield name, tensor
            index += 1
