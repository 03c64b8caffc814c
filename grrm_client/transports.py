"""Transports: one attempt at a member or a group, over a Ray Serve handle or HTTP.

A transport never retries: it sends once and returns the service's answer, or raises
:class:`~cluster.protocol.calls.RetryableError` (overload, a replica gone, the network) or
:class:`~cluster.protocol.calls.FatalError` (the request itself refused), each with the failure's
code (``cluster/failures.py``). The retrying is the protocol's one loop
(:class:`~cluster.protocol.calls.RetryLoop`, which :class:`~grrm_client.reward_client.RewardClient`
is). ``attempt`` (0 first; the count of earlier sends whose replica died) is passed to the replicas'
router: a whole group re-sent after its replica died takes pure ring order and lands where its
members do, while a retry after overload keeps the load-bounded choice.

The handle transport is the one handle sender (:class:`grrm_handles.send.HandleSender`), which the
service's ingress sends with too. Both transports answer alike. Over HTTP every non-2xx answer is one
error body whose ``code`` is a failure kind; a member's failure that its group answered (``conflict``,
``rejected``, ``timeout``, ``moved``) comes back as the flagged :class:`MemberResult` a handle call
returns, decided by the status and the ``code`` alone.

Importing this module imports neither vLLM nor SGLang, nor Ray (the handle transport imports Ray
Serve when it is made).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx

from cluster.failures import RESULT_FAILURES, FailureKind, code_for_status, kind_of
from cluster.protocol.headers import ATTEMPTS_LEFT_HEADER, SENDS_HEADER, authorization
from cluster.protocol.calls import FatalError, RetryableError, Transport
from cluster.protocol.retry import TRANSPORT_ERROR
from cluster.protocol.schema import (DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest,
                                     MemberResult)
from grrm_client.config import ClientConfig

__all__ = ["HTTPTransport", "make_transport"]


def make_transport(config: ClientConfig) -> Transport:
    """The transport the config names."""
    if config.transport == "http":
        return HTTPTransport(config)
    from grrm_handles.send import HandleSender  # imports Ray Serve: only for a handle transport

    return HandleSender(app=config)


class HTTPTransport(Transport):
    """Calls the HTTP API (``POST /v1/score/member`` and ``POST /v1/score``) with httpx."""

    def __init__(self, config: ClientConfig, http: httpx.AsyncClient | None = None):
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

    def _headers(self, attempts_left: int | None) -> dict[str, str]:
        headers = authorization(os.environ.get(self.config.token_env, "") if self.config.token_env else "")
        if attempts_left is not None:
            headers[ATTEMPTS_LEFT_HEADER] = str(attempts_left)
        return headers

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float,
                    attempts_left: int | None = None) -> httpx.Response:
        try:
            return await self._client().post(
                f"{self.base_url}{path}", json=body, headers=self._headers(attempts_left),
                timeout=httpx.Timeout(timeout_s),
            )
        except httpx.TimeoutException:
            raise asyncio.TimeoutError from None
        except httpx.TransportError as error:
            raise RetryableError("unavailable", f"{type(error).__name__}: {error}") from None

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                     attempts_left: int = 1) -> MemberResult:
        response = await self._post("/v1/score/member", member.model_dump(), timeout_s, attempts_left)
        if response.status_code == 200:
            return MemberResult.model_validate(response.json())
        kind, message = _error_of(response, _json(response))
        if kind is not None and kind.code in RESULT_FAILURES and not kind.retryable:
            # The member's group answered it (a conflict, refused input, not complete yet, moved):
            # the flagged result a handle call returns, so that both transports read alike.
            return MemberResult(group_id=member.group_id, index=member.index, member_id=member.member_id,
                                failure=kind.code, error=message, sends=_sends(response))
        raise _status_error(response, kind, message)

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0,
                    attempts_left: int = 1) -> GroupResult:
        response = await self._post("/v1/score", {"groups": [group.model_dump()]}, timeout_s, attempts_left)
        if response.status_code == 200:
            return GroupResult.model_validate(response.json()["results"][0])
        raise _status_error(response, *_error_of(response, _json(response)))

    async def announce(self, announcement: DemandAnnouncement, timeout_s: float) -> DemandAccepted:
        response = await self._post("/v1/demand", announcement.model_dump(), timeout_s)
        if response.status_code == 200:
            return DemandAccepted.model_validate(response.json())
        raise _status_error(response, *_error_of(response, _json(response)))

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


def _error_of(response: httpx.Response, body: Any) -> tuple[FailureKind | None, str]:
    """The failure kind of a non-2xx answer and its message: by the error body's ``code`` (every
    error answer of the service carries one), else by its status (an answer of something in
    between, such as a proxy); None when neither names a kind of ours."""
    status = response.status_code
    body = body if isinstance(body, dict) else {}
    message = f"HTTP {status}: {str(body.get('error') or response.text)[:500]}"
    return kind_of(body.get("code")) or kind_of(code_for_status(status)), message


def _status_error(response: httpx.Response, kind: FailureKind | None, message: str) -> Exception:
    """The exception for an error answer of failure kind ``kind``: retry what the kind says is
    retryable (and a 5xx of no kind of ours), refuse the rest."""
    status = response.status_code
    if kind is not None and kind.retryable:
        return RetryableError(kind.code, message, retry_after=_retry_after(response), sends=_sends(response))
    if kind is None and status >= 500:
        return RetryableError(TRANSPORT_ERROR, message, retry_after=_retry_after(response), sends=_sends(response))
    return FatalError(kind.code if kind is not None else f"http_{status}", message)


def _sends(response: httpx.Response) -> int:
    """Sends to the replicas the service made for this answer (its ``Grrm-Sends`` header; 1 without)."""
    try:
        return max(1, int(response.headers.get(SENDS_HEADER, "1")))
    except ValueError:
        return 1


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
