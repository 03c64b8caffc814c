"""Guards before a request reaches a route: the bearer token, the body size, and the limits of a
batch's groups and texts. A refused request is answered in the API's error shape, its name the
setting that refused it."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse

from cluster.protocol.schema import GroupRequest, MemberRequest
from deployments.config import AppConfig
from deployments.http.auth import CALLER, authenticate, bearer_credential
from deployments.http.errors import HTTPProblem, error_response


# Paths whose requests are guarded (token, size): the API and OpenRLHF's route.
OPENRLHF_PATH = "/openrlhf/"
GUARDED_PATHS = ("/v1/", OPENRLHF_PATH)


class RequestGuard:
    """ASGI middleware: bearer-token check and request-size limit, before the body is parsed.

    The body is read (at most ``limits.max_request_bytes``) and replayed to the app, so an
    oversized request is refused without ever being parsed. A request refused before its body
    was read (401, 413) is answered only after the rest of its body has been read and dropped
    (:func:`refuse_unread`): clients that send the whole body before reading the answer
    (Python's urllib and http.client) would otherwise see a connection reset, not the answer.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not any(prefix in path for prefix in GUARDED_PATHS):
            return await self.app(scope, receive, send)
        config: AppConfig = scope["app"].state.config
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        declared = headers.get("content-length")

        async def refuse(response: JSONResponse, read: int = 0, bound: int = config.limits.max_discard_bytes) -> None:
            if await refuse_unread(response, receive, bound, declared, read):
                await response(scope, receive, send)

        credential = bearer_credential(headers.get("authorization", ""))
        if not credential and OPENRLHF_PATH in path:
            # OpenRLHF's only setting is the URL: its token may ride in the query (?token=...).
            credential = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
        caller = authenticate(config, credential)
        if caller is None:
            response = error_response("unauthorized", "authorization: missing or wrong bearer token")
            response.headers["WWW-Authenticate"] = "Bearer"
            # Anyone can send these: at most UNAUTHENTICATED_DISCARD_BYTES of the body is read before the 401.
            return await refuse(response, bound=min(config.limits.max_discard_bytes, UNAUTHENTICATED_DISCARD_BYTES))
        # Whom the token names (its role, its tenant): read by the routes (deployments/http/auth.py).
        scope.setdefault("state", {})[CALLER] = caller
        limit = config.limits.max_request_bytes
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await refuse(_too_large(limit))
        messages = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before its body ended: there is nobody to answer
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            more_body = message.get("more_body", False)
            if size > limit:
                if more_body:
                    return await refuse(_too_large(limit), read=size)
                return await _too_large(limit)(scope, receive, send)
            if not more_body:
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)


# How long a refused request may take to send the rest of its body (see refuse_unread).
DISCARD_TIMEOUT_S = 30.0
# An unauthenticated request's body read before its 401: small, since anyone can send one (a client that
# sends more before it reads may see the connection closed instead of the 401).
UNAUTHENTICATED_DISCARD_BYTES = 64 * 1024


async def refuse_unread(response: JSONResponse, receive, bound: int, declared: str | None, read: int = 0) -> bool:
    """Before a refusal is sent on a request whose body is not fully read: read the rest and drop it.

    A server that answers and closes while the client is still sending leaves unread bytes in
    its socket, so the kernel resets the connection, and a client that sends its whole body
    before reading (urllib, which also asks for ``Connection: close``) gets that reset instead
    of the answer. Bodies of at most ``bound`` bytes in all (declared or counted; ``read`` bytes
    already read) that arrive within ``DISCARD_TIMEOUT_S`` are read to their end, never stored;
    beyond that the answer goes out at once with ``Connection: close``, so the server stops reading
    (clients that read while sending, like curl and httpx, still get it). False when the client
    went away meanwhile: there is nobody to answer.
    """
    ended = False
    gone = False
    if declared is None or (declared.isdigit() and int(declared) <= bound):

        async def discard() -> bool:
            nonlocal read, gone
            while read <= bound:
                message = await receive()
                if message["type"] != "http.request":
                    gone = True
                    return False
                read += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return read <= bound
            return False

        try:
            ended = await asyncio.wait_for(discard(), DISCARD_TIMEOUT_S)
        except TimeoutError:
            ended = False
    if not ended:
        response.headers["Connection"] = "close"
    return not gone


def _too_large(limit: int) -> JSONResponse:
    return error_response("too_large", f"request body exceeds limits.max_request_bytes ({limit} bytes)")



def check_group_limits(groups: list[GroupRequest], config: AppConfig) -> None:
    """Raise a 413 naming the limit when a batch is larger than the deployment allows."""
    limits = config.limits
    if len(groups) > limits.max_groups_per_request:
        raise HTTPProblem(
            "too_large", f"groups: {len(groups)} groups exceed limits.max_groups_per_request ({limits.max_groups_per_request})"
        )
    for index, group in enumerate(groups):
        if len(group.candidates) > limits.max_candidates_per_group:
            raise HTTPProblem(
                "too_large",
                f"groups[{index}].candidates: {len(group.candidates)} candidates exceed "
                f"limits.max_candidates_per_group ({limits.max_candidates_per_group})",
            )
        check_text_limits({"source": group.source, **context_texts(group)}, config, f"groups[{index}].")
        check_text_limits({f"candidates[{i}]": c for i, c in enumerate(group.candidates)}, config, f"groups[{index}].")


def context_texts(request: GroupRequest | MemberRequest) -> dict[str, str]:
    """A request's reference and notes, where given: texts the prompt carries, bounded like the source."""
    return {field: text for field in ("ref_text", "notes") if (text := getattr(request, field)) is not None}


def check_text_limits(texts: dict[str, str], config: AppConfig, prefix: str = "") -> None:
    """Raise a 413 naming the field when a text is longer than limits.max_text_chars."""
    limit = config.limits.max_text_chars
    for field, text in texts.items():
        if len(text) > limit:
            raise HTTPProblem("too_large", f"{prefix}{field}: {len(text)} characters exceed limits.max_text_chars ({limit})")

