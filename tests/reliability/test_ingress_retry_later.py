"""Calls whose replicas all went away (the client's re-sends exhausted) are a 503 with Retry-After,
never a 500: the HTTP caller is told to come back, as for overload. The error body's ``code``
says which (cluster/failures.py), and is what clients decide on."""

from __future__ import annotations

import json

import pytest
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from cluster.failures import kind_of
from deployments.http.errors import error_response, unanswered
from grrm_handles.send import UNANSWERED_ERRORS


@pytest.mark.parametrize(
    ("error", "code"),
    [(RayActorError(), "unavailable"), (BackPressureError(num_queued_requests=3, max_queued_requests=2), "overloaded")],
)
def test_unanswered_calls_become_503_with_retry_after(error, code):
    assert isinstance(error, UNANSWERED_ERRORS)
    problem = unanswered(error)
    assert problem.code == code and kind_of(code).retryable
    response = error_response(problem.code, problem.error, retry_after_s=1)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert json.loads(response.body)["code"] == code
