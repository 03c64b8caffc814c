"""One send to the scorer replicas through a Ray Serve handle, and what its unanswered errors mean.

The core every handle caller shares: the client's handle transport (one send per attempt; the
retrying is :class:`~grrm_client.reward_client.RewardClient`'s), the HTTP ingress and the replicas'
hand-offs (``deployments/client.py``'s :class:`~deployments.client.ScorerClient` re-sends on a
policy of its own). A send waits for the deployment only while it can serve: a call to a
deployment none of whose replicas runs or can be placed (:mod:`grrm_handles.availability`) fails
with :class:`~grrm_handles.availability.ReplicasUnschedulableError` (a Serve
``DeploymentUnavailableError``) that names the missing resources, instead of waiting for ever; so
does a call already waiting when that becomes known.

Imports Ray Serve: the client imports this module only when it is given a handle or first uses one.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import uuid
from typing import Any, Literal

from pydantic import BaseModel
from ray.exceptions import RayActorError
from ray.serve import context as serve_context
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from cluster.routing import NO_HINT, RouteHint
from grrm_handles.availability import DeploymentAvailability, wait_for_refresh
from grrm_handles.ready import ready_handle

__all__ = ["REPLICA_GONE_ERRORS", "UNANSWERED_ERRORS", "HandleSender", "routed", "to_replica", "unanswered_code"]

# Errors that mean "the replica went away", not "the request is bad": safe to send again.
REPLICA_GONE_ERRORS: tuple[type[BaseException], ...] = (RayActorError, ReplicaUnavailableError)
# Errors that leave a call unanswered but worth sending again: its replica went away, none can
# answer now, or Serve's queue is full.
UNANSWERED_ERRORS: tuple[type[BaseException], ...] = (
    BackPressureError, DeploymentUnavailableError, *REPLICA_GONE_ERRORS,
)


def unanswered_code(error: BaseException) -> Literal["overloaded", "unavailable"]:
    """The failure kind (``cluster/failures.py``) of a call that met one of :data:`UNANSWERED_ERRORS`:
    Serve's back pressure is overload; no replica to answer (none placed, all gone) is unavailable."""
    return "overloaded" if isinstance(error, BackPressureError) else "unavailable"


def routed(handle: DeploymentHandle, hint: RouteHint) -> DeploymentHandle:
    """``handle``, its calls carrying ``hint`` for the group-aware router (as their Serve session id,
    ``cluster.routing.RouteHint``); the handle itself when there is no hint. The new handle shares the
    old one's router: it costs an options copy, not a router."""
    return handle if hint == NO_HINT else handle.options(session_id=hint.encode())


def to_replica(handle: DeploymentHandle, replica: str) -> DeploymentHandle:
    """``handle``, its calls addressed to one replica by id (diagnostics such as ``info``, probes and
    hand-offs between replicas). Ids: :func:`deployments.replica_list.replica_actor_names`."""
    return routed(handle, RouteHint(target_replica=replica))


class HandleSender:
    """Sends calls to the replica deployment through its handle, once each (no retries)."""

    def __init__(self, handle: DeploymentHandle, availability: DeploymentAvailability | None = None):
        self.handle = ready_handle(handle)  # a GCS outage must not find its router unmade
        # Whether the deployment can serve at all (None for what is not a Serve handle).
        self.availability = availability or DeploymentAvailability.for_handle(handle)

    async def send(self, method: str, request: BaseModel, attempt: int = 0) -> Any:
        """Call replica method ``method`` with ``request`` once and return its answer; raises one of
        :data:`UNANSWERED_ERRORS` when no replica answered. ``attempt``: earlier sends whose replica
        died (the router then takes pure ring order)."""
        availability = self.availability
        if availability is None:
            return await self._sent(method, request, attempt)
        # The verdict known now, never a wait for a fresh one: fetching it needs the GCS, and a call
        # must go on while the GCS is down (the replicas, proxies and handles serve without it).
        verdict, refreshing = availability.check(self.handle.deployment_id)
        response = self._sent(method, request, attempt)
        if verdict is not None and verdict.ready:
            return await response
        # Unknown yet, or no replica runs: the call waits in the handle's queue. Give up once a
        # verdict says none can start (the first refresh's, as soon as it comes).
        waiting = asyncio.ensure_future(response)
        try:
            while True:
                if refreshing is None:
                    await asyncio.wait({waiting}, timeout=availability.refresh_s)
                else:
                    await wait_for_refresh(refreshing, availability.refresh_s, also=waiting)
                if waiting.done():
                    return waiting.result()
                verdict, refreshing = availability.check(self.handle.deployment_id)
                if verdict is not None and verdict.ready:
                    return await waiting
        finally:
            if not waiting.done():
                response.cancel()
                waiting.cancel()
                # Its end (RequestCancelledError) is expected: read it so asyncio does not report it.
                waiting.add_done_callback(lambda task: task.cancelled() or task.exception())

    def ask_replica(self, method: str, replica: str, *args: Any, handed_off: int = 0):
        """Call a method of one replica by its id (diagnostics such as ``tenants`` and ``info``, or a
        hand-off between replicas: ``handed_off`` counts them), once, without retries; a response."""
        hint = RouteHint(target_replica=replica, handed_off=handed_off)
        return contextvars.copy_context().run(self._remote, routed(self.handle, hint), method, *args)

    def _sent(self, method: str, request: BaseModel, attempt: int):
        handle = routed(self.handle, RouteHint(attempt=attempt))
        return contextvars.copy_context().run(self._remote, handle, method, request)

    @staticmethod
    def _remote(handle: DeploymentHandle, method: str, *args: Any):
        # Calls made while serving one HTTP request inherit its internal request id, and Serve's
        # routing loop matches routed requests by that id: a fan-out of several calls would be
        # fulfilled as one (the others never). Each call gets its own id, set in a copied context
        # (ours is untouched). This uses Serve's private request context (Ray 2.60, pinned).
        current = serve_context._get_serve_request_context()
        serve_context._serve_request_context.set(
            dataclasses.replace(current, _internal_request_id=uuid.uuid4().hex)
        )
        return getattr(handle, method).remote(*args)
