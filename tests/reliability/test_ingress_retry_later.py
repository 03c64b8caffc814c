"""Calls whose replicas all went away (the client's re-sends exhausted) are a 503 with Retry-After,
never a 500: the HTTP caller is told to come back, as for overload."""

from __future__ import annotations

import pytest
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from deployments.config import AppConfig
from deployments.ingress import _RETRY_LATER, _overloaded


@pytest.mark.parametrize(
    ("error", "words"),
    [(RayActorError(), "went away"), (BackPressureError(num_queued_requests=3, max_queued_requests=2), "overloaded")],
)
def test_unanswered_calls_become_503_with_retry_after(error, words):
    assert isinstance(error, _RETRY_LATER)
    problem = _overloaded(AppConfig(engine={"kind": "scripted"}), error)
    assert problem.status_code == 503 and words in problem.error
    assert problem.headers["Retry-After"] == "1"
