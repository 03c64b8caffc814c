"""Error answers of the HTTP API: every non-2xx answer of every route is an ``ErrorResponse`` whose
``code`` is a failure kind (``cluster/failures.py``), whose status is that kind's, with
``Retry-After`` where it is retryable (a bug's exception too: ``internal_error``, 500), so that a
caller decides on the status and the ``code`` alone, like vLLM's one ``ErrorResponse``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from cluster.failures import KINDS, ErrorCode, code_for_status
from cluster.protocol.headers import SENDS_HEADER
from deployments.http.models import ErrorResponse
from grrm_handles.availability import ReplicasUnschedulableError
from grrm_handles.send import REPLICA_GONE_ERRORS, unanswered_code

logger = logging.getLogger("ray.serve")


class HTTPProblem(Exception):
    """An error answer of one failure kind (turned into an ErrorResponse with the kind's status);
    ``sends``: the sends to the replicas it took (the ``Grrm-Sends`` header when more than one)."""

    def __init__(self, code: ErrorCode, error: str, detail: Any = None, sends: int = 1):
        super().__init__(error)
        self.code = code
        self.error = error
        self.detail = detail
        self.sends = sends


def error_response(code: ErrorCode, error: str, detail: Any = None, retry_after_s: int = 1,
                   sends: int = 1) -> JSONResponse:
    """The HTTP answer for a failure kind: its status, an ErrorResponse, Retry-After where it is retryable,
    and the sends to the replicas it took when more than one (the caller's client counts them)."""
    kind = KINDS[code]
    headers = {"Retry-After": str(retry_after_s)} if kind.retry_after else {}
    if sends > 1:
        headers[SENDS_HEADER] = str(sends)
    body = ErrorResponse(code=code, error=error, detail=detail).model_dump(mode="json")
    return JSONResponse(status_code=kind.http_status, content=body, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` in the API's error shape (never a bare 400 or a 500 for bad input)."""
    app.add_exception_handler(HTTPProblem, _problem)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _internal)


async def _problem(request: Request, problem: HTTPProblem) -> JSONResponse:
    return error_response(problem.code, problem.error, problem.detail, request.app.state.config.http.retry_after_s,
                          problem.sends)


async def _http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
    # FastAPI answers a body it cannot decode (bad UTF-8, broken JSON) with a bare 400: report
    # it as the invalid input it is, in the API's error shape.
    if error.status_code == 400:
        return error_response("invalid_request", f"body: could not be parsed as UTF-8 JSON ({error.detail})")
    code = code_for_status(error.status_code) or "invalid_request"
    body = ErrorResponse(code=code, error=str(error.detail)).model_dump()
    return JSONResponse(status_code=error.status_code, content=body, headers=getattr(error, "headers", None))


async def _client_gone(request: Request, _: ClientDisconnect) -> Response:
    # The caller closed its connection before its body ended: nothing failed here, and nobody reads
    # the answer (499, "client closed request", as nginx logs it).
    logger.info("%s %s: the client went away before its request ended", request.method, request.url.path)
    return Response(status_code=499)


async def _internal(request: Request, error: Exception) -> JSONResponse:
    # A bug, not the caller's doing: the answer keeps the API's error shape (Starlette logs the
    # traceback after it), and says no more than the exception's type.
    logger.error("%s %s: %s", request.method, request.url.path, type(error).__name__)
    return error_response("internal_error", f"internal error ({type(error).__name__}); the service's log has the "
                                            "traceback")


async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
    # Echoing inputs back would return huge or invalid texts: report location and message only.
    problems = [
        {"field": ".".join(str(part) for part in item.get("loc", ())), "message": item.get("msg", "")}
        for item in error.errors()
    ]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5]) or "invalid request"
    return error_response("invalid_request", summary, problems)


def unanswered(error: Exception) -> HTTPProblem:
    """The problem for a call no replica answered (one of ``grrm_handles.send.UNANSWERED_ERRORS``):
    503 with Retry-After, never a 500."""
    code = unanswered_code(error)
    if isinstance(error, ReplicasUnschedulableError):  # not load: no replica can run; say what is missing
        return HTTPProblem(code, f"unavailable: {error}", detail=error.availability)
    if isinstance(error, REPLICA_GONE_ERRORS):  # the client's re-sends all met dying replicas
        return HTTPProblem(
            code, f"unavailable: the scorer replicas went away during the call ({type(error).__name__}); retry later"
        )
    if isinstance(error, BackPressureError):
        return HTTPProblem(code, f"overloaded: {type(error).__name__}; retry later")
    return HTTPProblem(code, f"unavailable: {type(error).__name__}: {error}; retry later")

