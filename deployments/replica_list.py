"""The replicas of one deployment by id, for calls addressed to each of them (``target_replica``).

Serve's handle routes a call to one replica of its choosing; a question for *every* replica (each
one's tenants for ``GET /v1/tenants``, each one's counters for benchmarks and tests, their cold starts
for ``grrm profile``) goes to each by id. The ids come from Ray's named actors
(``SERVE_REPLICA::{app}#{deployment}#{id}``), which needs the GCS: such questions are diagnostics,
never on a request's path.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["replica_actor_names", "replica_infos"]


def replica_actor_names(app: str, deployment: str = "GRRMReplica") -> dict[str, str]:
    """Replica id -> Ray actor name, for the deployment's replicas alive now (starting ones too)."""
    import ray

    names = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor.get("namespace") == "serve" and f"{app}#{deployment}#" in actor["name"]:
            names[actor["name"].rsplit("#", 1)[-1]] = actor["name"]
    return names


async def replica_infos(handle: Any, app: str, timeout_s: float = 10,
                        replicas: list[str] | None = None) -> dict[str, dict]:
    """``info()`` of every replica of ``handle``'s deployment in ``app`` (or of ``replicas``) that answers
    within ``timeout_s``, asked at once: one snapshot, not one replica's view after another's."""
    from grrm_handles.send import to_replica  # Serve's handle plumbing: imported by those that ask

    async def ask(replica: str) -> dict | None:
        try:
            return await asyncio.wait_for(to_replica(handle, replica).info.remote(), timeout_s)
        except Exception:  # noqa: BLE001 - a replica starting or going away has no info to give
            return None

    if replicas is None:
        replicas = list(replica_actor_names(app, handle.deployment_name))
    answers = await asyncio.gather(*(ask(replica) for replica in replicas))
    return {replica: info for replica, info in zip(replicas, answers) if info is not None}
