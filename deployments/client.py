"""Calling scorer replicas through a Ray Serve handle, surviving replica death.

Used by the HTTP ingress and by the Serve-side callers of the replicas. Each send is
:class:`~grrm_handles.send.HandleSender`'s (the core the client's handle transport shares);
this module adds the Serve side's own re-send policy, for callers that may not retry themselves.
A call whose replica dies is sent again with ``attempt + 1``: the router then uses pure ring
order, so every member of the group lands together on the same live replica and the group is
re-assembled there. A replica whose engine dies ends itself (``deployments/replica.py``), so engine
death reaches callers as replica death and is survived the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ray.serve.handle import DeploymentHandle

from cluster.retry import RetryPolicy
from cluster.schema import DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest, MemberResult
from grrm_handles.availability import DeploymentAvailability
from grrm_handles.send import REPLICA_GONE_ERRORS, HandleSender


@dataclass(frozen=True, slots=True)
class ReplicaCallPolicy(RetryPolicy):
    """How often a call is re-routed after its replica died (``max_attempts`` sends in all, the
    backoff of :class:`~cluster.retry.RetryPolicy` between them). Serves the HTTP ingress, whose
    callers may not retry; the client (``grrm_client``) sends once per attempt and retries itself."""

    max_attempts: int = 4
    max_backoff_s: float = 5.0
    # Re-send a member once after its group timed out, or at once when its group moved (see _call).
    resend_on_timeout: bool = True


class ScorerClient(HandleSender):
    """Group and member scoring through a handle to the replica deployment, re-sent on ``policy``."""

    def __init__(
        self,
        handle: DeploymentHandle,
        policy: ReplicaCallPolicy | None = None,
        availability: DeploymentAvailability | None = None,
    ):
        super().__init__(handle, availability)
        self.policy = policy or ReplicaCallPolicy()
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
                result = await self.send(method, request, attempt)
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

    async def announce_demand(self, announcement: DemandAnnouncement) -> DemandAccepted:
        """Tell a replica what work a tenant expects (for the autoscaling policy; any replica will do)."""
        return await self._call("announce_demand", announcement, 0)
