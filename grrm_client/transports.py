"""Transports: one attempt at a member or a group, over a Ray Serve handle or HTTP.

A transport never retries: it sends once and returns the service's answer, or raises
:class:`RetryableError` (overload, a replica gone, the network) or :class:`FatalError` (the request
itself refused), each with the failure's code (``cluster/failures.py``). The retrying is
:class:`~grrm_client.reward_client.RewardClient`'s. ``attempt`` (0 first; the count of earlier
sends whose replica died) is passed to the replicas' router: a whole group re-sent after its
replica died takes pure ring order and lands where its members do, while a retry after overload
keeps the load-bounded choice.

Both transports answer alike. Over HTTP every non-2xx answer is one error body whose ``code`` is a
failure kind; a member's failure that its group answered (``conflict``, ``rejected``, ``timeout``,
``moved``) comes back as the flagged :class:`MemberResult` a handle call returns, decided by the
status and the ``code`` alone.

Importing this module imports neither vLLM nor SGLang, nor Ray (the handle transport imports Ray
Serve when it is given a handle or first used).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Protocol

import httpx

from cluster.failures import RESULT_FAILURES, FailureKind, code_for_status, kind_of
from cluster.retry import TRANSPORT_ERROR
from cluster.schema import DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest, MemberResult
from grrm_client.config import ClientConfig

__all__ = ["ATTEMPTS_LEFT_HEADER", "SENDS_HEADER", "FatalError", "HTTPTransport", "HandleTransport", "RetryableError",
           "Transport", "make_transport"]

# The HTTP ingress re-routes a call whose replica died within the caller's attempts: the caller says how
# many sends its attempt may take, and the answer says how many it took (RewardClient counts them).
ATTEMPTS_LEFT_HEADER = "Grrm-Attempts-Left"
SENDS_HEADER = "Grrm-Sends"


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


class Transport(Protocol):
    """One attempt at a member or group call; raises RetryableError / FatalError. ``attempts_left``:
    the sends this attempt may take (the HTTP ingress re-routes within them; a handle sends once)."""

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                     attempts_left: int = 1) -> MemberResult: ...

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0,
                    attempts_left: int = 1) -> GroupResult: ...

    async def announce(self, announcement: DemandAnnouncement, timeout_s: float) -> DemandAccepted: ...

    async def aclose(self) -> None: ...


def make_transport(config: ClientConfig) -> Transport:
    """The transport the config names."""
    if config.transport == "http":
        return HTTPTransport(config)
    return HandleTransport(config)


class HandleTransport:
    """Calls the replica deployment through a Ray Serve handle (the trainer is on the same Ray cluster):
    one :class:`~grrm_handles.send.HandleSender` send per attempt."""

    def __init__(self, config: ClientConfig, handle: Any = None, sender: Any = None):
        """``handle``: the replica deployment's (None: looked up from ``config`` at the first call);
        ``sender``: a :class:`~grrm_handles.send.HandleSender` of the caller's own (the service's)."""
        self.config = config
        self._handle = handle
        self._sender: Any = sender
        self._announce_to: tuple[Any, str] | None = None  # the sender and method that take announcements
        if handle is not None:
            self._send_with()  # its router set up now, not at a first call that may meet a GCS outage

    def _send_with(self) -> Any:
        if self._sender is None:
            from grrm_handles.send import HandleSender  # imports Ray Serve: only when a handle is used

            handle = self._handle
            if handle is None:
                from ray import serve

                handle = serve.get_deployment_handle(self.config.replica_deployment, app_name=self.config.app_name)
            self._sender = HandleSender(handle)
        return self._sender

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                     attempts_left: int = 1) -> MemberResult:
        return await self._send("add_member", member, attempt)

    async def open_member(self, member: MemberRequest, timeout_s: float, attempt: int = 0,
                          attempts_left: int = 1) -> MemberResult:
        """A member of a keyed group without an id of its own (OpenRLHF's samples; the service's route)."""
        return await self._send("add_open_member", member, attempt)

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0,
                    attempts_left: int = 1) -> GroupResult:
        return await self._send("run_group", group, attempt)

    async def announce(self, announcement: DemandAnnouncement, timeout_s: float) -> DemandAccepted:
        sender, method = self._announce_with()
        return await self._send(method, announcement, 0, sender)

    def _announce_with(self) -> tuple[Any, str]:
        """The application's ingress, which keeps announcements where the autoscaling policy reads them
        while no scorer replica runs; a scorer replica where the application has no such ingress."""
        if self._announce_to is None:
            from ray import serve

            from grrm_handles.send import HandleSender

            try:
                ingress = serve.get_deployment_handle(self.config.ingress_deployment, app_name=self.config.app_name)
                self._announce_to = (HandleSender(ingress), "take_demand")
            except Exception:  # noqa: BLE001 - no such deployment (an application of scorers only)
                self._announce_to = (self._send_with(), "announce_demand")
        return self._announce_to

    async def _send(self, method: str, request: Any, attempt: int, sender: Any = None) -> Any:
        from grrm_handles.send import REPLICA_GONE_ERRORS, UNANSWERED_ERRORS, unanswered_code

        sender = sender or self._send_with()
        try:
            return await sender.send(method, request, attempt)
        except UNANSWERED_ERRORS as error:
            # The same kinds as the HTTP ingress answers for these errors (overloaded / unavailable).
            lost = isinstance(error, REPLICA_GONE_ERRORS)
            message = f"{'replica gone: ' if lost else ''}{type(error).__name__}: {error}"
            raise RetryableError(unanswered_code(error), message, replica_lost=lost, cause=error) from None

    async def aclose(self) -> None:
        self._sender = None
        self._announce_to = None


class HTTPTransport:
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
        token = os.environ.get(self.config.token_env, "") if self.config.token_env else ""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
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
