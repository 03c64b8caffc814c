"""The HTTP API: a thin FastAPI layer over scorer replicas (OpenAPI at /docs).

It validates and bounds requests, fans a batch out into one replica call per group (so groups
spread over replicas and fail independently), and maps outcomes to status codes by their failure
kind (``cluster/failures.py``): 422 invalid, 413 over a limit, 401 unauthenticated, 409
conflicting member, 503 overloaded, shutting down or unavailable (Retry-After), 504 assembly
timeout. Every error body carries the kind's stable ``code``. Bad input never yields a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from cluster.failures import ErrorCode, code_for_status, kind_of
from cluster.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from deployments.availability import Availability, ReplicasUnschedulableError
from deployments.client import REPLICA_GONE_ERRORS, ScorerClient
from deployments.config import AppConfig


class ScoreRequest(BaseModel):
    """A batch of whole groups."""

    model_config = ConfigDict(extra="forbid")

    groups: list[GroupRequest] = Field(min_length=1)


class ScoreResponse(BaseModel):
    """One result per group, in request order."""

    results: list[GroupResult]


class ErrorResponse(BaseModel):
    """Every non-2xx answer that is not a member's result: a stable ``code`` to decide on
    (``cluster/failures.py``: retryable or not, bad input or not) and a readable ``error`` that
    names the field or limit (for people: its wording may change)."""

    code: ErrorCode
    error: str
    detail: Any = None


class HTTPProblem(Exception):
    """An error answer of one failure kind (turned into an ErrorResponse with the kind's status)."""

    def __init__(self, code: ErrorCode, error: str, detail: Any = None):
        super().__init__(error)
        self.code = code
        self.error = error
        self.detail = detail


def error_response(code: ErrorCode, error: str, detail: Any = None, retry_after_s: int = 1) -> JSONResponse:
    """The HTTP answer for a failure kind: its status, an ErrorResponse, Retry-After where it is retryable."""
    kind = kind_of(code)
    headers = {"Retry-After": str(retry_after_s)} if kind.retry_after else None
    body = ErrorResponse(code=code, error=error, detail=detail).model_dump()
    return JSONResponse(status_code=kind.http_status, content=body, headers=headers)


app = FastAPI(
    title="GRRM Cluster",
    version="0.1.0",
    description="Group reward scoring with GRRM (GQM prompts) for GRPO training of translation models.",
)


def _settings(request: Request) -> AppConfig:
    return request.app.state.config


@app.exception_handler(HTTPProblem)
async def _problem(request: Request, problem: HTTPProblem) -> JSONResponse:
    return error_response(problem.code, problem.error, problem.detail, _settings(request).http.retry_after_s)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
    # FastAPI answers a body it cannot decode (bad UTF-8, broken JSON) with a bare 400: report
    # it as the invalid input it is, in the API's error shape.
    if error.status_code == 400:
        return error_response("invalid_request", f"body: could not be parsed as UTF-8 JSON ({error.detail})")
    code = code_for_status(error.status_code) or "invalid_request"
    body = ErrorResponse(code=code, error=str(error.detail)).model_dump()
    return JSONResponse(status_code=error.status_code, content=body, headers=getattr(error, "headers", None))


@app.exception_handler(RequestValidationError)
async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
    # Echoing inputs back would return huge or invalid texts: report location and message only.
    problems = [
        {"field": ".".join(str(part) for part in item.get("loc", ())), "message": item.get("msg", "")}
        for item in error.errors()
    ]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5]) or "invalid request"
    return error_response("invalid_request", summary, problems)


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
        if scope["type"] != "http" or "/v1/" not in scope.get("path", ""):
            return await self.app(scope, receive, send)
        config: AppConfig = scope["app"].state.config
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        declared = headers.get("content-length")

        async def refuse(response: JSONResponse, read: int = 0) -> None:
            await refuse_unread(response, receive, config.limits, declared, read)
            await response(scope, receive, send)

        token_env = config.http.auth_token_env
        expected = os.environ.get(token_env, "") if token_env else ""
        if expected:
            supplied = headers.get("authorization", "")
            if not hmac.compare_digest(supplied.encode(), f"Bearer {expected}".encode()):
                response = error_response("unauthorized", "authorization: missing or wrong bearer token")
                response.headers["WWW-Authenticate"] = "Bearer"
                return await refuse(response)
        limit = config.limits.max_request_bytes
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await refuse(_too_large(limit))
        messages = []
        size = 0
        while True:
            message = await receive()
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


async def refuse_unread(response: JSONResponse, receive, limits, declared: str | None, read: int = 0) -> None:
    """Before a refusal is sent on a request whose body is not fully read: read the rest and drop it.

    A server that answers and closes while the client is still sending leaves unread bytes in
    its socket, so the kernel resets the connection, and a client that sends its whole body
    before reading (urllib, which also asks for ``Connection: close``) gets that reset instead
    of the answer. Bodies of at most ``limits.max_discard_bytes`` in all (declared or counted;
    ``read`` bytes already read) that arrive within ``DISCARD_TIMEOUT_S`` are read to their end,
    never stored; beyond that the answer goes out at once with ``Connection: close``, so the
    server stops reading (clients that read while sending, like curl and httpx, still get it).
    """
    bound = limits.max_discard_bytes
    ended = False
    if declared is None or (declared.isdigit() and int(declared) <= bound):

        async def discard() -> bool:
            nonlocal read
            while read <= bound:
                message = await receive()
                if message["type"] != "http.request":
                    return False  # the client went away
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


def _too_large(limit: int) -> JSONResponse:
    return error_response("too_large", f"request body exceeds limits.max_request_bytes ({limit} bytes)")


app.add_middleware(RequestGuard)


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
        check_text_limits({"source": group.source}, config, f"groups[{index}].")
        check_text_limits({f"candidates[{i}]": c for i, c in enumerate(group.candidates)}, config, f"groups[{index}].")


def check_text_limits(texts: dict[str, str], config: AppConfig, prefix: str = "") -> None:
    """Raise a 413 naming the field when a text is longer than limits.max_text_chars."""
    limit = config.limits.max_text_chars
    for field, text in texts.items():
        if len(text) > limit:
            raise HTTPProblem("too_large", f"{prefix}{field}: {len(text)} characters exceed limits.max_text_chars ({limit})")


def _overloaded(error: Exception) -> HTTPProblem:
    if isinstance(error, ReplicasUnschedulableError):  # not load: no replica can run; say what is missing
        return HTTPProblem("unavailable", f"unavailable: {error}", detail=error.availability)
    if isinstance(error, REPLICA_GONE_ERRORS):  # the client's re-sends all met dying replicas
        return HTTPProblem(
            "unavailable",
            f"unavailable: the scorer replicas went away during the call ({type(error).__name__}); retry later",
        )
    if isinstance(error, BackPressureError):
        return HTTPProblem("overloaded", f"overloaded: {type(error).__name__}; retry later")
    return HTTPProblem("unavailable", f"unavailable: {type(error).__name__}: {error}; retry later")


# Errors that leave the request unanswered but worth sending again: 503 with Retry-After, never a 500.
_RETRY_LATER = (BackPressureError, DeploymentUnavailableError, *REPLICA_GONE_ERRORS)


@serve.deployment
@serve.ingress(app)
class GRRMIngress:
    """HTTP entry point of one reward application."""

    def __init__(self, replicas: DeploymentHandle, config: AppConfig):
        self.config = config
        self.client = ScorerClient(replicas)
        app.state.config = config

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses={413: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
    )
    async def score(self, body: ScoreRequest) -> ScoreResponse:
        """Score whole groups; results come back in request order."""
        check_group_limits(body.groups, self.config)
        try:
            results = await asyncio.gather(*(self.client.score_group(group) for group in body.groups))
        except _RETRY_LATER as error:
            raise _overloaded(error) from None
        if not self.config.http.include_answers:
            results = [result.model_copy(update={"answer": None}) for result in results]
        return ScoreResponse(results=results)

    @app.post(
        "/v1/score/member",
        response_model=MemberResult,
        responses={
            409: {"model": MemberResult, "description": "`failure: conflict`: the member disagrees with its group"},
            413: {"model": ErrorResponse},
            422: {"model": ErrorResponse | MemberResult,
                  "description": "invalid request (`code`), or the group's input refused (`failure: rejected`)"},
            503: {"model": ErrorResponse | MemberResult,
                  "description": "retry later (Retry-After): no replica can answer (`code`), or the replica is "
                                 "overloaded or shutting down (`failure`)"},
            504: {"model": MemberResult, "description": "`failure: timeout`: the group did not complete in time"},
        },
    )
    async def score_member(self, member: MemberRequest):
        """Score one member of a group; answers once the whole group has been scored.

        The answer is the member's result whatever happened to its group; its status is that of
        its ``failure`` kind (``cluster/failures.py``)."""
        check_text_limits({"source": member.source, "candidate": member.candidate}, self.config)
        if member.group_size > self.config.limits.max_candidates_per_group:
            raise HTTPProblem(
                "too_large",
                f"group_size: {member.group_size} exceeds limits.max_candidates_per_group "
                f"({self.config.limits.max_candidates_per_group})",
            )
        try:
            result = await self.client.score_member(member)
        except _RETRY_LATER as error:
            raise _overloaded(error) from None
        # A member's answer is its MemberResult whatever happened; the status is its failure kind's.
        kind = kind_of(result.failure)
        if kind is None:
            return JSONResponse(status_code=200, content=jsonable_encoder(result))
        headers = {"Retry-After": str(self.config.http.retry_after_s)} if kind.retry_after else None
        return JSONResponse(status_code=kind.http_status, content=jsonable_encoder(result), headers=headers)

    async def _availability(self, max_age_s: float | None = None) -> Availability | None:
        availability = self.client.availability
        return None if availability is None else await availability.current(max_age_s)

    @app.get("/healthz", responses={503: {"model": ErrorResponse}})
    async def healthz(self):
        """Whether this application can score: 200 while a scorer replica runs, else 503 and why."""
        verdict = await self._availability()
        if verdict is not None and not verdict.ready:
            body = {"status": "unavailable", "code": "unavailable", "error": verdict.describe(),
                    "detail": verdict.as_dict()}
            return JSONResponse(status_code=503, content=body)
        return {"status": "ok"}

    @app.get("/v1/info")
    async def info(self) -> dict[str, Any]:
        """Model, engine, prompt type and scorer replicas of this application (by state; with none
        running, why: ``unschedulable`` names the missing resources)."""
        verdict = await self._availability(max_age_s=0)
        return {
            "model": self.config.engine.model,
            "engine": self.config.engine.kind,
            "prompt_type": self.config.scoring.prompt_type,
            **self.config.engine.parallelism(),
            "replicas": verdict.replica_states if verdict else {},
            "replicas_running": verdict.running if verdict else None,
            "unschedulable": verdict.unschedulable if verdict else None,
            "limits": self.config.limits.model_dump(),
        }
