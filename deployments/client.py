"""Calling scorer replicas through a Ray Serve handle, surviving replica death.

Used by the HTTP ingress and by the trainer bridge (which sits on the same Ray cluster and
skips the HTTP hop). A call whose replica dies is sent again with ``attempt + 1``: the router
then uses pure ring order, so every member of the group lands together on the same live replica
and the group is re-assembled there. A replica whose engine dies ends itself
(``deployments/replica.py``), so engine death reaches callers as replica death and is survived
the same way.

A call to a deployment none of whose replicas runs or can be placed (``deployments/availability.py``)
fails with :class:`~deployments.availability.ReplicasUnschedulableError` (a Serve
``DeploymentUnavailableError``) that names the missing resources, instead of waiting for ever; so
does a call already waiting when that becomes known.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from ray.exceptions import RayActorError
from ray.serve import context as serve_context
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from cluster.retry import RetryPolicy
from cluster.schema import DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest, MemberResult
from deployments.availability import DeploymentAvailability, wait_for_refresh
from deployments.handles import ready_handle

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


@dataclass(frozen=True, slots=True)
class ReplicaCallPolicy(RetryPolicy):
    """How often a call is re-routed after its replica died (``max_attempts`` sends in all, the
    backoff of :class:`~cluster.retry.RetryPolicy` between them). Serves the HTTP ingress, whose
    callers may not retry; a client with a retry layer of its own (``grrm_client``) sends with
    ``max_attempts=1`` and retries itself."""

    max_attempts: int = 4
    max_backoff_s: float = 5.0
    # Re-send a member once after its group timed out (see _call). Off for callers that re-join
    # incomplete groups themselves (grrm_client's RewardClient).
    resend_on_timeout: bool = True


class ScorerClient:
    """Group and member scoring through a handle to the replica deployment."""

    def __init__(
        self,
        handle: DeploymentHandle,
        policy: ReplicaCallPolicy | None = None,
        availability: DeploymentAvailability | None = None,
    ):
        self.handle = ready_handle(handle)  # a GCS outage must not find its router unmade
        self.policy = policy or ReplicaCallPolicy()
        # Whether the deployment can serve at all (None for what is not a Serve handle).
        self.availability = availability or DeploymentAvailability.for_handle(handle)
        self.replica_failures = 0  # calls re-sent because their replica died
        self.timeout_retries = 0  # members re-sent once after an assembly timeout

    async def score_group(self, group: GroupRequest, attempt: int = 0) -> GroupResult:
        """Score one whole group (``attempt``: sends a caller already made, for the router)."""
        return await self._call("score_group", group, attempt)

    async def score_member(self, member: MemberRequest, attempt: int = 0) -> MemberResult:
        """Score one member; answers when its whole group has been scored."""
        return await self._call("score_member", member, attempt)

    async def score_open_member(self, member: MemberRequest, attempt: int = 0) -> MemberResult:
        """Score a member of a keyed group without an id of its own (``GRRMReplica.score_open_member``)."""
        return await self._call("score_open_member", member, attempt)

    async def _call(self, method: str, request: GroupRequest | MemberRequest, first_attempt: int = 0):
        timeout_retried = False
        for sent in range(self.policy.max_attempts):
            if sent:
                await asyncio.sleep(self.policy.delay(sent))
            attempt = first_attempt + sent
            last = sent + 1 == self.policy.max_attempts
            try:
                result = await self._send_and_wait(method, request, attempt)
            except REPLICA_GONE_ERRORS:
                self.replica_failures += 1
                if last:
                    raise
                continue
            # Members of one group sent while routers disagreed (a replica just died, or one was
            # overloaded for one router's view) can be split over two replicas and time out.
            # Once more in pure ring order (attempt >= 1) brings them together; only once, so a
            # genuinely missing member costs at most two assembly timeouts.
            if (
                isinstance(result, MemberResult)
                and result.failure == "timeout"
                and self.policy.resend_on_timeout
                and not timeout_retried
                and not last
            ):
                timeout_retried = True
                self.timeout_retries += 1
                continue
            # Its group moved to another replica (the replica set changed, and the replica that now
            # collects it went away as well): the next send goes where the ring now places it.
            if isinstance(result, MemberResult) and result.failure == "moved" and self.policy.resend_on_timeout and not last:
                continue
            return result
        raise AssertionError("unreachable")

    async def _send_and_wait(self, method: str, request: GroupRequest | MemberRequest, attempt: int):
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

    async def announce_demand(self, announcement: DemandAnnouncement) -> DemandAccepted:
        """Tell a replica what work a tenant expects (for the autoscaling policy; any replica will do)."""
        return await self._call("announce_demand", announcement, 0)

    def ask_replica(self, method: str, replica: str, *args: Any, **kwargs: Any):
        """Call a method of one replica by its id (diagnostics such as ``tenants`` and ``info``, or a
        hand-off between replicas), once, without retries; a response."""
        return contextvars.copy_context().run(self._remote, method, *args, target_replica=replica, **kwargs)

    def _sent(self, method: str, request: GroupRequest | MemberRequest, attempt: int):
        return contextvars.copy_context().run(self._remote, method, request, attempt=attempt)

    def _remote(self, method: str, *args: Any, **kwargs: Any):
        # Calls made while serving one HTTP request inherit its internal request id, and Serve's
        # routing loop matches routed requests by that id: a fan-out of several calls would be
        # fulfilled as one (the others never). Each call gets its own id, set in a copied context
        # (ours is untouched). This uses Serve's private request context (Ray 2.60, pinned).
        current = serve_context._get_serve_request_context()
        serve_context._serve_request_context.set(
            dataclasses.replace(current, _internal_request_id=uuid.uuid4().hex)
        )
        return getattr(self.handle, method).remote(*args, **kwargs)
