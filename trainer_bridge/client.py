"""Reaching the reward cluster from a trainer: a Ray Serve handle or HTTP, same semantics.

:class:`RewardClient` sends one member (:meth:`~RewardClient.score_member`) or one whole group
(:meth:`~RewardClient.score_group`) and always returns a :class:`CallOutcome`; it never raises
for a service problem. Each logical request has a deadline (``deadline_s``, every attempt
included) and at most ``max_attempts`` attempts, with exponential backoff between them, on:

* overload: HTTP 503 (its ``Retry-After`` is honoured) or a handle's ``BackPressureError`` /
  ``DeploymentUnavailableError``;
* replica death: the handle transport reuses :class:`deployments.client.ScorerClient`, which
  re-sends with ``attempt + 1`` so every member of the group lands on the same live replica;
  whatever still escapes it is retried here;
* a member refused because its replica was shutting down or had too many groups assembling;
* connection errors (HTTP).

What is retried is decided by the failure's kind (``cluster/failures.py``: the ``failure`` of an
answer, the ``code`` of an HTTP error body), never by a message's wording.

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

Importing this module imports neither vLLM nor SGLang (nor Ray: the handle transport imports
Ray Serve when it is first used).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import httpx

from cluster.failures import code_for_status, kind_of
from cluster.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from trainer_bridge.config import BridgeConfig

__all__ = [
    "CallOutcome",
    "FatalError",
    "HTTPTransport",
    "HandleTransport",
    "RetryableError",
    "RewardClient",
    "Transport",
    "make_transport",
]

R = TypeVar("R", MemberResult, GroupResult)


class RetryableError(Exception):
    """This attempt failed in a way another attempt may not (overload, lost replica, network).

    ``reason`` is a failure code (``cluster/failures.py``) or ``transport_error``."""

    def __init__(self, reason: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class FatalError(Exception):
    """The request itself is refused (bad input, authentication): no retry. ``reason``: its code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Transport(Protocol):
    """One attempt at a member or group call; raises RetryableError / FatalError."""

    async def member(self, member: MemberRequest, timeout_s: float) -> MemberResult: ...

    async def group(self, group: GroupRequest, timeout_s: float) -> GroupResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class CallOutcome(Generic[R]):
    """What one logical request ended with.

    ``result`` is the service's answer (possibly a flagged failure such as ``parse_failed``), or
    None when no answer was obtained; then ``failure`` says why (``deadline``, ``transport_error``,
    or a failure code of ``cluster/failures.py`` such as ``unavailable``, ``overloaded``,
    ``invalid_request``) and ``error`` describes it. ``attempts`` counts sends that
    failed or answered; ``rejoins`` the re-sends of a member whose group was still incomplete.
    """

    result: R | None
    attempts: int
    failure: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    rejoins: int = 0


def group_incomplete(result: MemberResult | GroupResult) -> bool:
    """Whether a member answer says its group did not complete in time (re-join it)."""
    kind = kind_of(result.failure)
    return isinstance(result, MemberResult) and kind is not None and kind.rejoin


def retryable_result(result: MemberResult | GroupResult) -> bool:
    """Whether a member answer is worth another attempt (a transient refusal: overload, shutdown)."""
    kind = kind_of(result.failure)
    return isinstance(result, MemberResult) and kind is not None and kind.retryable


class RewardClient:
    """Members and groups to the reward cluster with deadlines, bounded retries and backoff."""

    def __init__(
        self,
        config: BridgeConfig,
        transport: Transport | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.transport = transport if transport is not None else make_transport(config)
        self._sleep = sleep
        self._clock = clock
        self.requests = 0
        self.retries = 0  # attempts beyond the first, over all requests
        self.rejoins = 0  # re-sends of members whose group was still incomplete, over all requests

    async def score_member(self, member: MemberRequest) -> CallOutcome[MemberResult]:
        """One rollout as a member of its group; answers when the group is scored."""
        return await self._call(self.transport.member, member)

    async def score_group(self, group: GroupRequest) -> CallOutcome[GroupResult]:
        """One whole group."""
        return await self._call(self.transport.group, group)

    async def aclose(self) -> None:
        """Release connections."""
        await self.transport.aclose()

    async def _call(self, send: Callable[[Any, float], Awaitable[R]], request: Any) -> CallOutcome[R]:
        config = self.config
        self.requests += 1
        call = _Call(started=self._clock())
        deadline = call.started + config.deadline_s
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return self._outcome(call, "deadline", f"deadline_s {config.deadline_s} ran out")
            retry_after: float | None = None
            try:
                result = await asyncio.wait_for(send(request, remaining), timeout=remaining)
            except (asyncio.TimeoutError, TimeoutError):
                call.attempts += 1
                return self._outcome(call, "deadline", f"deadline_s {config.deadline_s} ran out")
            except FatalError as refused:
                call.attempts, call.last = call.attempts + 1, None
                return self._outcome(call, refused.reason, str(refused))
            except RetryableError as transient:
                failure, error, retry_after = transient.reason, str(transient), transient.retry_after
            except Exception as unexpected:  # noqa: BLE001 - a reward must not crash the trainer step
                call.attempts, call.last = call.attempts + 1, None
                return self._outcome(call, "transport_error", f"{type(unexpected).__name__}: {unexpected}")
            else:
                call.last = result
                if group_incomplete(result):
                    # Not a failed attempt: the group is still being generated. Re-join it at once
                    # (a short pause only, so that even a tiny assembly timeout makes no hot loop).
                    call.rejoins += 1
                    self.rejoins += 1
                    await self._sleep(min(config.backoff_s, max(0.0, deadline - self._clock())))
                    continue
                if not retryable_result(result):
                    call.attempts += 1
                    return self._outcome(call, None, None)
                failure, error = result.failure or "unavailable", result.error or ""
            call.attempts += 1
            if call.attempts >= config.max_attempts:
                return self._outcome(call, failure, error)
            delay = max(config.backoff(call.attempts), retry_after or 0.0)
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
        )


@dataclass
class _Call:
    """The progress of one logical request."""

    started: float
    attempts: int = 0
    rejoins: int = 0
    last: Any = None  # the last answer (a flagged one, when the request ends without a good one)


def make_transport(config: BridgeConfig) -> Transport:
    """The transport the config names."""
    if config.transport == "http":
        return HTTPTransport(config)
    return HandleTransport(config)


class HandleTransport:
    """Calls the replica deployment through a Ray Serve handle (the trainer is on the same Ray cluster)."""

    def __init__(self, config: BridgeConfig, handle: Any = None):
        self.config = config
        self._handle = handle
        self._scorer: Any = None

    def _client(self) -> Any:
        if self._scorer is None:
            from deployments.client import ReplicaCallPolicy, ScorerClient

            handle = self._handle
            if handle is None:
                from ray import serve

                handle = serve.get_deployment_handle(self.config.replica_deployment, app_name=self.config.app_name)
            policy = ReplicaCallPolicy(
                max_attempts=self.config.max_attempts,
                backoff_s=self.config.backoff_s,
                max_backoff_s=self.config.max_backoff_s,
                resend_on_timeout=False,  # RewardClient re-joins incomplete groups itself
            )
            self._scorer = ScorerClient(handle, policy)
        return self._scorer

    async def member(self, member: MemberRequest, timeout_s: float) -> MemberResult:
        return await self._guard(self._client().score_member(member))

    async def group(self, group: GroupRequest, timeout_s: float) -> GroupResult:
        return await self._guard(self._client().score_group(group))

    @staticmethod
    async def _guard(call: Awaitable[R]) -> R:
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

        from deployments.client import REPLICA_GONE_ERRORS

        try:
            return await call
        except (BackPressureError, DeploymentUnavailableError) as overloaded:
            raise RetryableError("unavailable", f"{type(overloaded).__name__}: {overloaded}") from None
        except REPLICA_GONE_ERRORS as gone:
            raise RetryableError("unavailable", f"replica gone: {type(gone).__name__}: {gone}") from None

    async def aclose(self) -> None:
        self._scorer = None


class HTTPTransport:
    """Calls the HTTP API (``POST /v1/score/member`` and ``POST /v1/score``) with httpx."""

    def __init__(self, config: BridgeConfig, http: httpx.AsyncClient | None = None):
        self.config = config
        self.base_url = config.http_url.rstrip("/")
        self._given = http
        self._clients: dict[int, httpx.AsyncClient] = {}  # one per event loop (httpx is loop-bound)

    def _client(self) -> httpx.AsyncClient:
        if self._given is not None:
            return self._given
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            client = httpx.AsyncClient(timeout=None, limits=limits)
            self._clients = {loop: client}  # clients of finished loops cannot be reused
        return client

    def _headers(self) -> dict[str, str]:
        token = os.environ.get(self.config.token_env, "") if self.config.token_env else ""
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float) -> httpx.Response:
        try:
            return await self._client().post(
                f"{self.base_url}{path}", json=body, headers=self._headers(), timeout=httpx.Timeout(timeout_s)
            )
        except httpx.TimeoutException:
            raise asyncio.TimeoutError from None
        except httpx.TransportError as error:
            raise RetryableError("unavailable", f"{type(error).__name__}: {error}") from None

    async def member(self, member: MemberRequest, timeout_s: float) -> MemberResult:
        response = await self._post("/v1/score/member", member.model_dump(), timeout_s)
        body = _json(response)
        if isinstance(body, dict) and "group_id" in body and "code" not in body:
            # The member's own answer (whatever its status): its `failure` says what happened.
            return MemberResult.model_validate(body)
        raise _status_error(response, body)

    async def group(self, group: GroupRequest, timeout_s: float) -> GroupResult:
        response = await self._post("/v1/score", {"groups": [group.model_dump()]}, timeout_s)
        if response.status_code == 200:
            return GroupResult.model_validate(response.json()["results"][0])
        raise _status_error(response, _json(response))

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except RuntimeError:  # created on a loop that is gone
                pass


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _status_error(response: httpx.Response, body: Any) -> Exception:
    """The exception for an error answer, by its ``code`` (else by its status, for answers of
    something in between, such as a proxy): retry what its kind says is retryable (and other 5xx),
    refuse the rest."""
    status = response.status_code
    body = body if isinstance(body, dict) else {}
    message = f"HTTP {status}: {str(body.get('error') or response.text)[:500]}"
    code = body.get("code") if kind_of(body.get("code")) is not None else code_for_status(status)
    kind = kind_of(code)
    if kind is not None and kind.retryable:
        return RetryableError(kind.code, message, retry_after=_retry_after(response))
    if kind is None and status >= 500:
        return RetryableError("transport_error", message, retry_after=_retry_after(response))
    return FatalError(code or f"http_{status}", message)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
