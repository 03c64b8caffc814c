"""The one handle sender: calls to the scorer replicas through a Ray Serve handle, once each.

:class:`HandleSender` is the client's handle transport (one send per attempt, each attempt's errors
typed as the protocol's: ``cluster/protocol/calls.py``; the retrying is the protocol's one loop) and
what the service's own callers send with: the HTTP ingress (``deployments/client.py``'s
:class:`~deployments.client.ScorerClient` is a sender that runs that loop on a policy of its own) and
the replicas' hand-offs. A send waits for the deployment only while it can serve: a call to a
deployment none of whose replicas runs or can be placed (:mod:`grrm_handles.availability`) fails
with :class:`~grrm_handles.availability.ReplicasUnschedulableError` (a Serve
``DeploymentUnavailableError``) that names the missing resources, instead of waiting for ever; so
does a call already waiting when that becomes known.

Imports Ray Serve: the client imports this module only when it makes a handle transport.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import uuid
from typing import Any, Literal, Protocol

from pydantic import BaseModel
from ray import serve
from ray.exceptions import RayActorError
from ray.serve import context as serve_context
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from cluster.protocol.calls import Attempts, RetryableError, Transport
from cluster.protocol.schema import (DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest,
                                     MemberResult)
from cluster.routing import NO_HINT, RouteHint
from grrm_handles.availability import DeploymentAvailability, wait_for_refresh
from grrm_handles.ready import ready_handle

__all__ = ["REPLICA_GONE_ERRORS", "UNANSWERED_ERRORS", "HandleSender", "OpenMembers", "ServeApp", "routed",
           "to_replica", "unanswered_code"]

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


class ServeApp(Protocol):
    """Where a sender without a handle of its own finds the deployments it calls (the client's config)."""

    app_name: str
    replica_deployment: str
    ingress_deployment: str


# Attempts is named beside Transport (which extends it): the retry loop drives a sender as its Attempts.
class HandleSender(Transport, Attempts):
    """Sends calls to the replica deployment through its handle, once each (no retries): the raw
    :meth:`send`, and the protocol's attempts (:class:`~cluster.protocol.calls.Attempts`: a member, a
    group, a demand announcement), whose unanswered sends raise
    :class:`~cluster.protocol.calls.RetryableError`."""

    def __init__(self, handle: DeploymentHandle | None = None, availability: DeploymentAvailability | None = None,
                 *, app: ServeApp | None = None):
        """``handle``: the replica deployment's, its router set up now (a GCS outage must not find it
        unmade); None: looked up in ``app`` at the first send. ``availability``: whether the deployment
        can serve at all (None: the handle's own; none for what is not a Serve handle). ``app``: where
        demand announcements go (its ingress, else a scorer replica)."""
        if handle is None and app is None:
            raise ValueError("handle or app: a sender needs one")
        self.app = app
        self._given = handle, availability
        self._handle: DeploymentHandle | None = None
        self._availability: DeploymentAvailability | None = None
        self._announce_to: tuple[HandleSender, str] | None = None  # the sender and method that take announcements
        if handle is not None:
            self._resolve()

    def _resolve(self) -> None:
        if self._handle is not None:
            return
        handle, availability = self._given
        if handle is None:
            handle = serve.get_deployment_handle(self.app.replica_deployment, app_name=self.app.app_name)
        self._handle = ready_handle(handle)
        self._availability = availability or DeploymentAvailability.for_handle(handle)

    @property
    def handle(self) -> DeploymentHandle:
        """The replica deployment's handle (looked up now, when this sender was given none)."""
        self._resolve()
        return self._handle

    @property
    def availability(self) -> DeploymentAvailability | None:
        """Whether the deployment can serve at all (None for what is not a Serve handle)."""
        self._resolve()
        return self._availability

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                     attempts_left: int = 1) -> MemberResult:
        """One attempt at a member (``GRRMReplica.add_member``)."""
        return await self._attempt("add_member", member, attempt)

    async def open_member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                          attempts_left: int = 1) -> MemberResult:
        """One attempt at a member of a keyed group without an id of its own (OpenRLHF's samples:
        ``GRRMReplica.add_open_member``)."""
        return await self._attempt("add_open_member", member, attempt)

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0,
                    attempts_left: int = 1) -> GroupResult:
        """One attempt at a whole group (``GRRMReplica.run_group``)."""
        return await self._attempt("run_group", group, attempt)

    async def announce(self, announcement: DemandAnnouncement, timeout_s: float) -> DemandAccepted:
        """One attempt at a demand announcement."""
        sender, method = self._announce_with()
        return await sender._attempt(method, announcement, 0)

    def _announce_with(self) -> tuple[HandleSender, str]:
        """The application's ingress, which keeps announcements where the autoscaling policy reads them
        while no scorer replica runs; a scorer replica where the application has no such ingress (or
        this sender knows no application)."""
        if self._announce_to is None:
            self._announce_to = (self, "announce_demand")
            if self.app is not None:
                try:
                    ingress = serve.get_deployment_handle(self.app.ingress_deployment, app_name=self.app.app_name)
                    self._announce_to = (HandleSender(ingress), "take_demand")
                except Exception:  # noqa: BLE001 - no such deployment (an application of scorers only)
                    pass
        return self._announce_to

    async def _attempt(self, method: str, request: BaseModel, attempt: int) -> Any:
        """:meth:`send`, a call no replica answered raised as the protocol's RetryableError."""
        try:
            return await self.send(method, request, attempt)
        except UNANSWERED_ERRORS as error:
            # The same kinds as the HTTP ingress answers for these errors (overloaded / unavailable).
            lost = isinstance(error, REPLICA_GONE_ERRORS)
            message = f"{'replica gone: ' if lost else ''}{type(error).__name__}: {error}"
            raise RetryableError(unanswered_code(error), message, replica_lost=lost, cause=error) from None

    async def aclose(self) -> None:
        """Forget the handles looked up (a later send looks them up anew)."""
        self._handle = self._availability = self._announce_to = None

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


@dataclasses.dataclass(frozen=True)
class OpenMembers:
    """A sender's members as members of keyed groups without an id of their own
    (:meth:`HandleSender.open_member`), for the retry loop (an :class:`~cluster.protocol.calls.Attempts`
    by its shape: the loop's own path is the sender's)."""

    sender: HandleSender

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                     attempts_left: int = 1) -> MemberResult:
        """One attempt at ``member`` as a member of its keyed group."""
        return await self.sender.open_member(member, timeout_s, attempt, attempts_left)

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0,
                    attempts_left: int = 1) -> GroupResult:
        """One attempt at a whole group (as the sender's)."""
        return await self.sender.group(group, timeout_s, attempt, attempts_left)
