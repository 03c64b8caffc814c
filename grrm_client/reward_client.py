"""Reaching the reward cluster: a Ray Serve handle or HTTP, same semantics, one retry layer.

:class:`RewardClient` sends one member (:meth:`~RewardClient.score_member`) or one whole group
(:meth:`~RewardClient.score_group`) and always returns a :class:`~cluster.protocol.calls.CallOutcome`; it never raises
for a service problem. Each logical request has a deadline (``deadline_s``, every attempt
included) and at most ``max_attempts`` attempts, with exponential backoff between them, on real
failures:

* no replica to answer: HTTP 503 ``unavailable`` or a handle's ``DeploymentUnavailableError``;
* replica death: the next send tells the router so (``attempt``), and a re-sent group takes pure
  ring order to land with its members on one live replica (the transports send once each);
* a member refused because its replica was shutting down;
* connection errors (HTTP).

Back pressure is not a failed attempt: an ``overloaded`` answer (Serve's queue full, a handle's
``BackPressureError``, a replica with too many groups assembling, a tenant at its bounds) is retried
with the same capped exponential backoff (a longer ``Retry-After`` wins) until ``deadline_s``, and
spends none of ``max_attempts`` (``ClientConfig.retry_overloaded_until_deadline``): a member refused
for a few seconds and then given a default reward would hold the rest of its group until the deadline.
Such sends are counted (``overloaded``) as well as attempts.

What is retried, and how, is decided by the failure's kind (``cluster/failures.py``: the ``failure``
of an answer, the ``code`` of an HTTP error body; ``retryable``, ``back_pressure``), never by a
message's wording.

A member whose group did not complete within the replica's ``assembly_timeout_s`` (HTTP 504, or
``failure == "timeout"``) is not a failed attempt: its group is still being generated (members of
one group finish minutes apart under long generations, and trainers pause generation for a
training phase or a weight sync). The member re-joins its group at once, as often as it takes,
until ``deadline_s``; every re-join lands in ring order, so a group split over two replicas by a
change of the replica set comes together again. Re-joins are counted (``rejoins``), not attempts.

Retries are safe: a replica keeps every scored group's answer for ``completed_ttl_s`` and treats
a member whose index and text it already holds as the same member, so a retried member joins
(or reads) the one verdict of its group and is never counted twice; a whole group is answered
once per call. Bad input (a conflicting member, an invalid or too large request) is not retried.

The loop is the protocol's one retry loop (``cluster/protocol/calls.py``): ``max_attempts`` bounds
the sends of one logical request that failed, over every layer below. The handle transport sends once
per attempt. Over HTTP, the ingress runs this same loop with a Serve-side policy
(``deployments/client.py``: only a call whose replica died is sent again) within the sends the attempt
may take (``Grrm-Attempts-Left``), and says how many it took (``sends`` of the answer, ``Grrm-Sends`` of
an error), which count as attempts here. Importing this module imports neither vLLM nor SGLang (nor
Ray).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from cluster.protocol.calls import CallOutcome, RetryLoop, Transport
from cluster.protocol.retry import RetryPolicy
from cluster.protocol.schema import (
    DEFAULT_TENANT,
    DemandAnnouncement,
    GroupRequest,
    GroupResult,
    MemberRequest,
    MemberResult,
)
from grrm_client.config import ClientConfig
from grrm_client.trace_file import TraceFile
from grrm_client.transports import make_transport

__all__ = ["RewardClient"]

R = TypeVar("R", MemberResult, GroupResult)
logger = logging.getLogger(__name__)
# An announcement is advisory: it must never hold up a trainer's step.
ANNOUNCE_TIMEOUT_S = 5.0


class RewardClient:
    """Members and groups to the reward cluster with deadlines, bounded retries and backoff: the
    protocol's one retry loop (:class:`~cluster.protocol.calls.RetryLoop`) over this client's transport."""

    def __init__(
        self,
        config: ClientConfig,
        transport: Transport | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        policy: RetryPolicy | None = None,
    ):
        """``policy``: the retry policy (None: the config's, :meth:`ClientConfig.retry_policy`)."""
        # Its counters (requests, retries, rejoins, reroutes, overloaded) are this client's.
        self.loop = RetryLoop(policy or config.retry_policy, sleep=sleep, clock=clock)
        self.config = config
        self.transport = transport if transport is not None else make_transport(config)
        self.announcements = 0  # demand announcements taken
        self.announcements_failed = 0
        # The run's trace for grrm plan (config.trace_path), noted here, where every caller's requests pass
        # once per logical request: call's own re-sends are not new arrivals.
        self.trace = TraceFile.of(config)

    async def score_member(self, member: MemberRequest) -> CallOutcome[MemberResult]:
        """One rollout as a member of its group; answers when the group is scored."""
        member = self._for_tenant(member)
        key = self.trace.member_sent(member) if self.trace is not None else None
        return self._traced(key, await self.loop.send_member(self.transport, member))

    async def score_group(self, group: GroupRequest) -> CallOutcome[GroupResult]:
        """One whole group."""
        group = self._for_tenant(group)
        key = self.trace.group_sent(group) if self.trace is not None else None
        return self._traced(key, await self.loop.send_group(self.transport, group))

    def _traced(self, key: Any, outcome: CallOutcome[R]) -> CallOutcome[R]:
        """``outcome``, its group's tokens noted in the trace (when one is recorded)."""
        if self.trace is not None:
            self.trace.answered(key, outcome.result)
        return outcome

    async def announce_demand(self, groups: int, lasts_s: float, starts_in_s: float = 0.0,
                              tenant: str | None = None, profile: Sequence[float] = ()) -> bool:
        """Announce the groups a tenant (None: this client's) is about to send (e.g. a GRPO step: its
        prompts, one group each) over the next ``lasts_s`` seconds, starting in ``starts_in_s``, so that
        the pool scales ahead of them; ``profile``, the share of them in each equal slice of that time
        (empty: evenly). Advisory: one attempt, never raises; returns whether it was taken."""
        announcement = DemandAnnouncement(tenant=tenant or self.config.tenant, groups=groups,
                                          starts_in_s=max(0.0, starts_in_s), lasts_s=max(1.0, lasts_s),
                                          profile=list(profile))
        try:
            await asyncio.wait_for(self.transport.announce(announcement, ANNOUNCE_TIMEOUT_S), ANNOUNCE_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - scoring goes on as without an announcement
            logger.warning("demand announcement of %d groups not taken: %s: %s", groups, type(error).__name__, error)
            self.announcements_failed += 1
            return False
        self.announcements += 1
        return True

    def _for_tenant(self, request: R) -> R:
        """The request under this client's tenant, unless it names one of its own."""
        tenant = self.config.tenant
        if request.tenant != DEFAULT_TENANT or tenant == DEFAULT_TENANT:
            return request
        return request.model_copy(update={"tenant": tenant})

    async def aclose(self) -> None:
        """Write the run's trace (when one is recorded) and release connections."""
        if self.trace is not None:
            self.trace.close()
        await self.transport.aclose()
