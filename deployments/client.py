"""Calling scorer replicas through a Ray Serve handle, for the service's own callers.

:class:`ScorerClient` is the one handle sender (:class:`~grrm_handles.send.HandleSender`) that runs
the protocol's one retry loop (:class:`~cluster.protocol.calls.RetryLoop`) over its own sends, under a
policy the caller chooses (``cluster/protocol/retry.py``):

* :data:`ROUTE_POLICY`, the HTTP routes' for a caller that says how many sends its attempt may take
  (``Grrm-Attempts-Left``, as ``RewardClient`` does): only a call whose replica died is sent again, with
  ``attempt + 1`` (the router then takes pure ring order, so every member of the group lands
  together on the same live replica), within the sends the HTTP caller's attempt may take. Nothing
  else is retried here: overload, a group that did not complete, a group that moved go back to the
  caller, whose client retries or re-joins, counting these sends as its attempts.
* :data:`SERVICE_POLICY`, the default (a caller that says nothing, such as curl; the OpenRLHF route,
  whose caller never retries, within its answer time; the benches): the same, and a member whose
  group did not complete is sent once more (a group split by a change of the replica set comes
  together; group-mates that never come do not hold it past two assembly timeouts).

A replica whose engine dies ends itself (``deployments/replica.py``), so engine death reaches
callers as replica death and is survived the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.serve.handle import DeploymentHandle

from cluster.protocol.calls import CallOutcome, RetryLoop
from cluster.protocol.retry import RetryPolicy
from cluster.protocol.schema import (DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest,
                                     MemberResult)
from grrm_handles.availability import DeploymentAvailability
from grrm_handles.send import HandleSender, OpenMembers

__all__ = ["ROUTE_POLICY", "SERVICE_POLICY", "ScorerClient", "answered"]

# The HTTP routes' policy: re-route after replica death only (see the module docstring). Its caller's
# deadline governs (the HTTP client's timeout): none of its own worth the name.
ROUTE_POLICY = RetryPolicy(max_attempts=4, deadline_s=7 * 24 * 3600.0, backoff_s=0.5, max_backoff_s=5.0,
                           retry_transient=False, max_rejoins=0)
# The service's own callers that answer for their caller (see the module docstring).
SERVICE_POLICY = dataclasses.replace(ROUTE_POLICY, max_rejoins=1)


class ScorerClient(HandleSender):
    """Group and member scoring through a handle to the replica deployment, on the protocol's retry loop."""

    def __init__(
        self,
        handle: DeploymentHandle,
        policy: RetryPolicy | None = None,
        availability: DeploymentAvailability | None = None,
    ):
        super().__init__(handle, availability)
        self.loop = RetryLoop(policy or SERVICE_POLICY)
        self.policy = self.loop.policy
        self.open_members = OpenMembers(self)

    @property
    def replica_failures(self) -> int:
        """Sends lost with their replica, each re-routed (over every call)."""
        return self.loop.reroutes

    @property
    def rejoins(self) -> int:
        """Members re-sent because their group was still incomplete (over every call)."""
        return self.loop.rejoins

    async def group_call(self, group: GroupRequest, attempts_left: int | None = None) -> CallOutcome[GroupResult]:
        """Score one whole group: the loop's outcome (``attempts_left``: the caller's budget of sends)."""
        return await self.loop.send_group(self, group, self._within(attempts_left))

    async def member_call(self, member: MemberRequest, attempts_left: int | None = None) -> CallOutcome[MemberResult]:
        """Score one member; its outcome once its whole group was scored (or why not)."""
        return await self.loop.send_member(self, member, self._within(attempts_left))

    async def open_member_call(self, member: MemberRequest, deadline_s: float) -> CallOutcome[MemberResult]:
        """A member of a keyed group without an id of its own (``GRRMReplica.add_open_member``), within
        ``deadline_s``."""
        policy = dataclasses.replace(self.policy, deadline_s=deadline_s)
        return await self.loop.send_member(self.open_members, member, policy)

    async def group_result(self, group: GroupRequest) -> GroupResult:
        """Score one whole group: its result, or the handle's error when no replica answered."""
        return answered(await self.group_call(group))

    async def member_result(self, member: MemberRequest) -> MemberResult:
        """Score one member: its result once its group was scored, or the handle's error."""
        return answered(await self.member_call(member))

    async def announce_demand(self, announcement: DemandAnnouncement) -> DemandAccepted:
        """Tell a replica what work a tenant expects (for the autoscaling policy; any replica will do).
        Advisory, so one send: a lost one is the caller's to log."""
        return await self.send("announce_demand", announcement)

    def _within(self, attempts_left: int | None) -> RetryPolicy:
        """A caller that says how many sends its attempt may take retries itself: :data:`ROUTE_POLICY`
        within them. One that does not (curl, a script) gets this client's own policy."""
        if attempts_left is None:
            return self.policy
        return dataclasses.replace(ROUTE_POLICY, max_attempts=max(1, min(ROUTE_POLICY.max_attempts, attempts_left)))


def answered(outcome: CallOutcome[Any]) -> Any:
    """An outcome's result with the sends it took, or the error that left it unanswered."""
    if outcome.result is not None:
        return outcome.result.model_copy(update={"sends": max(1, outcome.attempts)})
    if outcome.cause is not None:
        raise outcome.cause
    raise TimeoutError(f"{outcome.failure}: {outcome.error}")
