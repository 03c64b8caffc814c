"""Serve handles set up before their first call.

Serve sets a handle's router up on the handle's first use, and doing so reads the node table from
the GCS synchronously (Ray 2.60: the caller node's availability zone). A process whose first call
comes while the GCS is down therefore freezes, event loop and all, until the GCS is back: with GCS
fault tolerance on, every other call in flight goes on. The ingress, the scorer replicas (their
ledger handle), the ledger replicas (their peers) and the client's handle transport set theirs up
when they are built, so a later GCS outage finds every router ready.
"""

from __future__ import annotations

from typing import TypeVar

from ray.serve.handle import DeploymentHandle

H = TypeVar("H")


def ready_handle(handle: H) -> H:
    """``handle`` with its router set up now instead of at its first call; anything that is not a
    Serve handle (a test double) is returned as it is."""
    if isinstance(handle, DeploymentHandle) and not handle.is_initialized:
        handle.options()  # Serve initialises a handle's router on options() or remote()
    return handle


def fresh_handle(deployment_name: str, app_name: str) -> DeploymentHandle:
    """A handle to the deployment with a router of its own, set up now.

    ``serve.get_deployment_handle`` returns the process's cached handle, and with it the router that
    handle already has. A router can keep a stale replica set (on a loaded machine a replica's
    router to its own deployment knew only itself for minutes); one made afresh reads the set from
    the controller at once. For calls between replicas after a peer did not answer."""
    return ready_handle(DeploymentHandle(deployment_name, app_name))
