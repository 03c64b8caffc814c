"""One logical call to the service: the one retry loop, the seams it drives, and what a call ends with.

:class:`RetryLoop` sends one member or one whole group through an :class:`Attempts` (a transport:
one send per attempt, never a retry) under a :class:`~cluster.protocol.retry.RetryPolicy`, and
always returns a :class:`CallOutcome`; it never raises for a service problem. What an attempt raises
says what failed: :class:`RetryableError` (overload, a replica gone, the network) or
:class:`FatalError` (the request itself refused), each with the failure's code
(``cluster/failures.py``). What is retried, and how, is decided by the failure's kind
(``retryable``, ``back_pressure``, ``rejoin``), never by a message's wording.

A member whose group did not complete in time re-joins it until the deadline (or ``max_rejoins``):
re-joins are counted, not attempts. Back pressure waits until the deadline without spending
``max_attempts`` where the policy says so (``cluster/protocol/retry.py``).

One loop, whoever runs it: a trainer's client (:class:`~grrm_client.RewardClient`: every transient
failure retried, incomplete groups re-joined) or the service's HTTP ingress
(``deployments/client.py``: only a call whose replica died is re-routed, within the caller's
attempts; its caller retries the rest, counting the ingress's sends, ``sends`` of an answer, as its
attempts). No I/O of its own: the clock and the sleep are given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from cluster.failures import kind_of
from cluster.protocol.retry import TRANSPORT_ERROR, RetryPolicy
from cluster.protocol.schema import (DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest,
                                     MemberResult)

__all__ = ["Attempts", "CallOutcome", "FatalError", "RetryLoop", "RetryableError", "Transport", "group_incomplete",
           "retryable_result"]


class RetryableError(Exception):
    """This attempt failed in a way another attempt may not (overload, lost replica, network).

    ``reason`` is a failure code (``cluster/failures.py``) or ``transport_error``;
    ``replica_lost``: the replica died holding the call (the next attempt is routed in ring order);
    ``sends``: sends to the replicas the attempt took (the HTTP ingress re-routes a call whose replica
    died, within the caller's attempts); ``cause``: the handle's own error, for the service's callers."""

    def __init__(self, reason: str, message: str, retry_after: float | None = None, replica_lost: bool = False,
                 sends: int = 1, cause: BaseException | None = None):
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after
        self.replica_lost = replica_lost
        self.sends = sends
        self.cause = cause


class FatalError(Exception):
    """The request itself is refused (bad input, authentication): no retry. ``reason``: its code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Attempts(Protocol):
    """One attempt at a member or a group, once (no retry): what :class:`RetryLoop` drives. Raises
    :class:`RetryableError` / :class:`FatalError`. ``attempt``: earlier sends whose replica died (the
    router then takes pure ring order); ``attempts_left``: the sends this attempt may take (the HTTP
    ingress re-routes within them; a handle sends once)."""

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                     attempts_left: int = 1) -> MemberResult: ...

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0,
                    attempts_left: int = 1) -> GroupResult: ...


class Transport(Attempts, Protocol):
    """A client's way to the service: attempts at members and groups (:class:`Attempts`), a demand
    announcement (advisory: one attempt), and the release of its connections."""

    async def announce(self, announcement: DemandAnnouncement, timeout_s: float) -> DemandAccepted: ...

    async def aclose(self) -> None: ...


R = TypeVar("R", MemberResult, GroupResult)


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


class RetryLoop:
    """Members and groups through an :class:`Attempts` under a :class:`RetryPolicy` (see the module
    docstring), and what the calls so far took (over all requests)."""

    def __init__(self, policy: RetryPolicy, *, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._sleep = sleep
        self._clock = clock
        self.requests = 0
        self.retries = 0  # attempts beyond the first, over all requests
        self.rejoins = 0  # re-sends of members whose group was still incomplete, over all requests
        self.reroutes = 0  # attempts lost with their replica, over all requests
        self.overloaded = 0  # sends refused as back pressure (overloaded), over all requests

    async def send_member(self, attempts: Attempts, member: MemberRequest,
                          policy: RetryPolicy | None = None) -> CallOutcome[MemberResult]:
        """One member through ``attempts``, as often as ``policy`` (None: this loop's) allows."""
        return await self.call(attempts, member, policy)

    async def send_group(self, attempts: Attempts, group: GroupRequest,
                         policy: RetryPolicy | None = None) -> CallOutcome[GroupResult]:
        """One whole group through ``attempts``, as often as ``policy`` (None: this loop's) allows."""
        return await self.call(attempts, group, policy)

    @staticmethod
    def attempt(attempts: Attempts, request: MemberRequest | GroupRequest, timeout_s: float, attempt: int,
                attempts_left: int) -> Awaitable[MemberResult | GroupResult]:
        """One send of ``request``: a member's or a group's, by what it is."""
        if isinstance(request, GroupRequest):
            return attempts.group(request, timeout_s, attempt=attempt, attempts_left=attempts_left)
        return attempts.member(request, timeout_s, attempt=attempt, attempts_left=attempts_left)

    async def call(self, attempts: Attempts, request: MemberRequest | GroupRequest,
                   policy: RetryPolicy | None = None) -> CallOutcome:
        """One logical request: one send of ``request`` through ``attempts`` per attempt, as often as
        ``policy`` (None: this loop's) allows. Never raises for a service problem."""
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
                    self.attempt(attempts, request, remaining, call.reroutes, policy.max_attempts - call.spent),
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
