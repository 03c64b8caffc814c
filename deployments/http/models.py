"""The HTTP API's request and answer bodies (member and group bodies are ``cluster/schema.py``'s)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cluster.failures import ErrorCode
from cluster.schema import GroupRequest, GroupResult


class ScoreRequest(BaseModel):
    """A batch of whole groups."""

    model_config = ConfigDict(extra="forbid")

    groups: list[GroupRequest] = Field(min_length=1, description="The groups to score; answered in this order.")


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

