"""Reaching the reward cluster: a Ray Serve handle or HTTP, same semantics, one retry layer.

:class:`RewardClient` sends one member (:meth:`~RewardClient.score_member`) or one whole group
(:meth:`~RewardClient.score_group`) and always returns a :class:`CallOutcome`; it never raises
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

This is the only retry loop: ``max_attempts`` bounds the sends of one logical request that failed,
over every layer below. The handle transport sends once per attempt. Over HTTP, the ingress runs this same
loop with a Serve-side policy (``deployments/client.py``: only a call whose replica died is sent
again) within the sends the attempt may take (``Grrm-Attempts-Left``), and says how many it took
(``sends`` of the answer, ``Grrm-Sends`` of an error), which count as attempts here. Importing this
module imports neither vLLM nor SGLang (nor Ray).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cluster.failures import kind_of
from cluster.retry import TRANSPORT_ERROR, RetryPolicy
from cluster.schema import (
    DEFAULT_TENANT,
    DemandAnnouncement,
    GroupRequest,
    GroupResult,
    MemberRequest,
    MemberResult,
)
from grrm_client.config import ClientConfig
from grrm_client.trace_file import TraceFile
from grrm_client.transports import FatalError, RetryableError, Transport, make_transport

__all__ = ["CallOutcome", "RewardClient", "group_incomplete", "retryable_result"]

R = TypeVar("R", MemberResult, GroupResult)
logger = logging.getLogger(__name__)
# An announcement is advisory: it must never hold up a trainer's step.
ANNOUNCE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CallOutcome(Generic[R]):
    """What one logical request ended with.

    ``result`` is the service's answer (possibly a flagged failure such as ``parse_failed``), or
    None when no answer was obtained; then ``failure`` says why (``deadline``, ``transport_error``,
    or a failure code of ``cluster/failures.py`` such as ``unavailable``, ``overloaded``,
    ``invalid_request``) and ``error`` describes it. ``attempts`` counts sends that
    failed or answered; ``overloaded``, those of them the service refused as back pressure (they
    spend none of ``max_attempts`` unless the policy says so); ``rejoins`` the re-sends of a member whose group was still
    incomplete; ``cause``, the last send's own error (a Serve handle's), for the service's callers.
    """

    result: R | None
    attempts: int
    failure: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    rejoins: int = 0
    cause: BaseException | None = field(default=None, repr=False, compare=False)
    overloaded: int = 0


def group_incomplete(result: MemberResult | GroupResult) -> bool:
    """Whether a member answer says its group did not complete in time (re-join it)."""
    kind = kind_of(result.failure)
    return isinstance(result, MemberResult) and kind is not None and kind.rejoin


def retryable_result(result: MemberResult | GroupResult) -> bool:
    """Whether an answer is worth another attempt (a transient refusal: overload, shutdown, a tenant
    over its limit of groups in flight)."""
    return RetryPolicy.retryable(result.failure)


class RewardClient:
    """Members and groups to the reward cluster with deadlines, bounded retries and backoff."""

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
        self.config = config
        self.policy = policy or config.retry_policy
        self.transport = transport if transport is not None else make_transport(config)
        self._sleep = sleep
        self._clock = clock
        self.requests = 0
        self.retries = 0  # attempts beyond the first, over all requests
        self.rejoins = 0  # re-sends of members whose group was still incomplete, over all requests
        self.reroutes = 0  # attempts lost with their replica, over all requests
        self.overloaded = 0  # sends refused as back pressure (overloaded), over all requests
        self.announcements = 0  # demand announcements taken
        self.announcements_failed = 0
        # The run's trace for grrm plan (config.trace_path), noted here, where every caller's requests pass
        # once per logical request: call's own re-sends are not new arrivals.
        self.trace = TraceFile.of(config)

    async def score_member(self, member: MemberRequest) -> CallOutcome[MemberResult]:
        """One rollout as a member of its group; answers when the group is scored."""
        member = self._for_tenant(member)
        key = self.trace.member_sent(member) if self.trace is not None else None
        return self._traced(key, await self.call(self.transport.member, member))

    async def score_group(self, group: GroupRequest) -> CallOutcome[GroupResult]:
        """One whole group."""
        group = self._for_tenant(group)
        key = self.trace.group_sent(group) if self.trace is not None else None
        return self._traced(key, await self.call(self.transport.group, group))

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

    async def call(self, send: Callable[..., Awaitable[R]], request: Any,
                   policy: RetryPolicy | None = None) -> CallOutcome[R]:
        """One logical request: ``send`` (one of the transport's attempt methods) as often as ``policy``
        (None: this client's) allows. Never raises for a service problem."""
        policy = policy or self.policy
        self.requests += 1
        call = _Call(started=self._clock())
        deadline = call.started + policy.deadline_s
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return self._outcome(call, "deadline", f"deadline_s {policy.deadline_s} ran out")
            retry_after: float | None = None
            try:
                result = await asyncio.wait_for(
                    send(request, remaining, attempt=call.reroutes, attempts_left=policy.max_attempts - call.spent),
                    timeout=remaining)
            except (asyncio.TimeoutError, TimeoutError):
                call.attempts += 1
                return self._outcome(call, "deadline", f"deadline_s {policy.deadline_s} ran out")
            except FatalError as refused:
                call.attempts, call.last = call.attempts + 1, None
                return self._outcome(call, refused.reason, str(refused))
            except RetryableError as transient:
                failure, error, retry_after = transient.reason, str(transient), transient.retry_after
                call.reroutes += transient.replica_lost
                self.reroutes += transient.replica_lost
                call.cause, sends = transient.cause, transient.sends
                if not policy.retries(failure, transient.replica_lost):
                    call.attempts += sends
                    return self._outcome(call, failure, error)
            except Exception as unexpected:  # noqa: BLE001 - a reward must not crash the trainer step
                call.attempts, call.last, call.cause = call.attempts + 1, None, unexpected
                return self._outcome(call, TRANSPORT_ERROR, f"{type(unexpected).__name__}: {unexpected}")
            else:
                call.last, sends = result, result.sends
                if group_incomplete(result) and (policy.max_rejoins is None or call.rejoins < policy.max_rejoins):
                    # Not a failed attempt: the group is still being generated. Re-join it at once
                    # (a short pause only, so that even a tiny assembly timeout makes no hot loop).
                    call.rejoins += 1
                    self.rejoins += 1
                    await self._sleep(min(policy.backoff_s, max(0.0, deadline - self._clock())))
                    continue
                if not retryable_result(result) or not policy.retry_transient:
                    call.attempts += sends
                    return self._outcome(call, None, None)
                failure, error = result.failure or "unavailable", result.error or ""
            call.attempts += sends
            if policy.back_pressure(failure):
                call.overloaded += 1
                self.overloaded += 1
            if policy.waits_out(failure):
                # Back pressure: the service is full now. Waited out until the deadline; of this answer's sends
                # only those before it (the HTTP ingress re-routing a call whose replica died) spend attempts.
                call.spent += sends - 1
                delay = policy.delay(call.overloaded)
            else:
                call.spent += sends
                delay = policy.delay(call.spent)
            if call.spent >= policy.max_attempts:
                return self._outcome(call, failure, error)
            delay = max(delay, retry_after or 0.0)
            if self._clock() + delay >= deadline:
                return self._outcome(call, "deadline", f"no time left to retry after: {error}")
            self.retries += 1
            await self._sleep(delay)

    def _outcome(self, call: _Call, failure: str | None, error: str | None) -> CallOutcome:
        result = call.last
        if result is not None and not retryable_result(result) and not group_incomplete(result):
            failure, error = None, None
        return CallOutcome(
            result=result,
            attempts=call.attempts,
            failure=failure,
            error=error,
            latency_s=self._clock() - call.started,
            rejoins=call.rejoins,
            cause=call.cause if result is None else None,
            overloaded=call.overloaded,
        )


@dataclass
class _Call:
    """The progress of one logical request."""

    started: float
    attempts: int = 0  # sends that failed or answered
    spent: int = 0  # of them, those that count against max_attempts (not back pressure)
    overloaded: int = 0  # of them, those refused as back pressure
    rejoins: int = 0
    reroutes: int = 0  # attempts whose replica died (the router's `attempt` of the next send)
    cause: BaseException | None = None  # the last send's own error
    last: Any = None  # the last answer (a flagged one, when the request ends without a good one)


