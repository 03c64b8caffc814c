"""The replicas of one deployment by id, for calls addressed to each of them (``target_replica``).

Serve's handle routes a call to one replica of its choosing; a question for *every* replica (each
one's tenants for ``GET /v1/tenants``, each one's counters for benchmarks and tests) goes to each by
id. The ids come from Ray's named actors (``SERVE_REPLICA::{app}#{deployment}#{id}``), which needs
the GCS: such questions are diagnostics, never on a request's path.
"""

from __future__ import annotations

__all__ = ["replica_actor_names"]


def replica_actor_names(app: str, deployment: str = "GRRMReplica") -> dict[str, str]:
    """Replica id -> Ray actor name, for the deployment's replicas alive now (starting ones too)."""
    import ray

    names = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor.get("namespace") == "serve" and f"{app}#{deployment}#" in actor["name"]:
            names[actor["name"].rsplit("#", 1)[-1]] = actor["name"]
    return names
