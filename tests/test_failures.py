"""The failure contract (cluster/failures.py): one table that every caller decides on."""

from __future__ import annotations

from typing import get_args

from cluster.failures import KINDS, FailureReason, RequestErrorCode, code_for_status, error_codes, kind_of
from deployments.ingress import app


def test_every_code_has_exactly_one_kind_and_the_openapi_schema_lists_them():
    assert set(error_codes()) == set(KINDS)
    assert len(error_codes()) == len(set(error_codes()))
    schema = app.openapi()["components"]["schemas"]
    assert set(schema["ErrorResponse"]["properties"]["code"]["enum"]) == set(KINDS)
    member_failures = schema["MemberResult"]["properties"]["failure"]["anyOf"][0]["enum"]
    assert set(member_failures) == set(get_args(FailureReason))


def test_retry_decisions_follow_the_kind():
    retryable = {code for code, kind in KINDS.items() if kind.retryable}
    assert retryable == {"overloaded", "shutting_down", "unavailable"}
    # Retry later is 503 with Retry-After; so is a member's group that moved (send it again, not a
    # failed attempt); nothing else is.
    assert all(KINDS[code].http_status == 503 and KINDS[code].retry_after for code in retryable)
    assert not any(kind.retry_after for code, kind in KINDS.items() if code not in retryable and code != "moved")
    assert KINDS["moved"].rejoin and not KINDS["moved"].retryable and KINDS["moved"].retry_after
    # A conflict is the caller's fault and final; overload is not a conflict (no 409 for it).
    assert KINDS["conflict"].http_status == 409 and KINDS["conflict"].bad_input and not KINDS["conflict"].retryable
    assert KINDS["timeout"].rejoin and not KINDS["timeout"].retryable
    assert {code for code, kind in KINDS.items() if kind.bad_input} >= {"invalid_request", "too_large", "rejected"}
    assert not KINDS["unauthorized"].bad_input  # every row would fail alike: grrm score stops


def test_statuses_without_a_code_are_read_conservatively():
    assert code_for_status(422) == "invalid_request" and code_for_status(413) == "too_large"
    assert kind_of(code_for_status(502)).retryable and kind_of(code_for_status(503)).retryable
    assert code_for_status(500) is None and kind_of(None) is None and kind_of("from_a_newer_version") is None
    assert set(get_args(RequestErrorCode)) <= set(KINDS)


def test_every_error_answer_of_every_route_is_documented_as_the_one_error_body():
    error_body = {"$ref": "#/components/schemas/ErrorResponse"}
    routes = app.openapi()["paths"]
    assert "/v1/score/member" in routes
    for path, methods in routes.items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                if status.startswith("2"):
                    continue
                schema = response["content"]["application/json"]["schema"]
                if status == "422" and schema == {"$ref": "#/components/schemas/HTTPValidationError"}:
                    continue  # FastAPI's default entry; the handler answers it as an ErrorResponse
                assert schema == error_body, (method, path, status, schema)


def test_errors_outside_the_routes_answer_the_one_error_body():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from deployments.http.errors import install_error_handlers

    bare = FastAPI()
    install_error_handlers(bare)

    @bare.get("/broken")
    async def broken():
        raise RuntimeError("a bug")

    client = TestClient(bare, raise_server_exceptions=False)
    answer = client.get("/broken")
    assert answer.status_code == 500 and answer.json()["code"] == "internal_error"
    assert "RuntimeError" in answer.json()["error"] and "a bug" not in answer.text  # no internals leak
    missing = client.get("/nowhere")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
