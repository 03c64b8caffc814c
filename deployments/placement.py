"""Where a scorer replica and its engine's ranks run: Ray resources from the config, decided once.

Pure logic (no Ray): :func:`plan_placement` turns the engine's parallelism and the replica's
device settings into the Serve options of one replica, and refuses a combination that cannot
run with an error naming the setting, before anything starts.

* One rank (TP = PP = 1): the replica actor holds its GPU (``gpus_per_rank``) itself.
* ``mp`` executor (``auto``; single-node TP/PP): the engine starts its ranks as processes of the
  replica, on the devices the replica holds: the actor asks for every rank's GPUs, so Ray puts
  them on one node and sets ``CUDA_VISIBLE_DEVICES`` for all of them. On a CPU machine the ranks
  share the replica's node and ``num_cpus``.
* ``ray`` executor (multi-node TP or PP): one placement group per replica, the actor's CPUs and
  the first rank's GPU in bundle 0, one GPU bundle per further rank, ``PACK``ed (one node when one
  has room, else across nodes); vLLM's Ray executor starts a worker actor in each GPU bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from cluster.engines.config import EngineConfig


class PlacementError(ValueError):
    """A replica placement that cannot run; the message names the setting to change."""


@dataclass(frozen=True)
class ReplicaPlacement:
    """The Ray resources of one replica and how its engine starts its ranks."""

    ranks: int
    executor: Literal["mp", "ray"] | None
    actor_cpus: float
    actor_gpus: float
    placement_group_bundles: list[dict[str, float]] | None = None
    placement_group_strategy: str | None = None
    # Custom Ray resources the actor asks for (replicas.resources); with a placement group, bundle 0 holds them.
    actor_resources: dict[str, float] = field(default_factory=dict)

    @property
    def gpus(self) -> float:
        """GPUs one replica takes in all."""
        if self.placement_group_bundles is not None:
            return sum(bundle.get("GPU", 0.0) for bundle in self.placement_group_bundles)
        return self.actor_gpus

    def serve_options(self) -> dict[str, Any]:
        """Serve deployment options: the placement group (if any) and the actor's own resources."""
        options: dict[str, Any] = {}
        if self.placement_group_bundles is not None:
            options["placement_group_bundles"] = [dict(bundle) for bundle in self.placement_group_bundles]
            options["placement_group_strategy"] = self.placement_group_strategy
        actor: dict[str, float] = {"num_cpus": self.actor_cpus}
        if self.actor_gpus > 0:
            actor["num_gpus"] = self.actor_gpus
        if self.actor_resources:
            actor["resources"] = dict(self.actor_resources)
        options["ray_actor_options"] = actor
        return options


def plan_placement(engine: EngineConfig, *, num_cpus: float, gpus_per_rank: float,
                   resources: dict[str, float] | None = None) -> ReplicaPlacement:
    """The placement of one replica of ``engine`` (see the module docstring).

    ``gpus_per_rank`` 0 means a CPU replica; ``resources``: custom Ray resources the replica asks for. Raises :class:`PlacementError` naming the setting when
    the combination cannot run: the Ray executor on CPU replicas (vLLM's CPU backend refuses Ray
    workers), or parallel ranks sharing a GPU.
    """
    ranks = engine.ranks
    executor = engine.executor
    custom = dict(resources or {})
    if executor is None:
        return ReplicaPlacement(ranks=1, executor=None, actor_cpus=num_cpus, actor_gpus=gpus_per_rank,
                                actor_resources=custom)
    if gpus_per_rank == 0 and executor == "ray":
        raise PlacementError(
            "engine.distributed_executor_backend: 'ray' needs GPU replicas (replicas.gpus_per_rank > 0); "
            "on CPU the engine runs its parallel ranks as processes of the replica: use 'mp' or 'auto'"
        )
    if 0 < gpus_per_rank < 1:
        raise PlacementError(
            f"replicas.gpus_per_rank: {gpus_per_rank} with {ranks} parallel ranks; each rank needs a whole "
            "GPU of its own (1), or set engine.tensor_parallel_size and pipeline_parallel_size to 1"
        )
    if executor == "mp":
        return ReplicaPlacement(ranks=ranks, executor="mp", actor_cpus=num_cpus, actor_gpus=gpus_per_rank * ranks,
                                actor_resources=custom)
    # Bundle 0 holds the replica actor (Serve schedules it there, so its custom resources too) and the
    # first rank's GPU.
    first = {"CPU": num_cpus, "GPU": gpus_per_rank} if num_cpus > 0 else {"GPU": gpus_per_rank}
    bundles = [{**first, **custom}] + [{"GPU": gpus_per_rank} for _ in range(ranks - 1)]
    return ReplicaPlacement(
        ranks=ranks, executor="ray", actor_cpus=num_cpus, actor_gpus=0.0,
        placement_group_bundles=bundles, placement_group_strategy="PACK", actor_resources=custom,
    )
