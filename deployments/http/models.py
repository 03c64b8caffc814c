"""The HTTP API's request and answer bodies (member and group bodies are ``cluster/protocol/schema.py``'s)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cluster.failures import ErrorCode
from cluster.protocol.schema import GroupRequest, GroupResult


class ScoreRequest(BaseModel):
    """A batch of whole groups."""

    model_config = ConfigDict(extra="forbid")

    groups: list[GroupRequest] = Field(min_length=1, description="The groups to score; answered in this order.")


class ScoreResponse(BaseModel):
    """One result per group, in request order."""

    results: list[GroupResult]


class ErrorResponse(BaseModel):
    """Every non-2xx answer of every route, and nothing else: a stable ``code`` to decide on
    (``cluster/failures.py``: retryable or not, bad input or not) and a readable ``error`` that
    names the field or limit (for people: its wording may change). A member whose failure has a
    non-200 status (``conflict``, ``rejected``, ``timeout``, ``moved``, ``overloaded``,
    ``shutting_down``) is answered with this, its ``code`` the member's ``failure``."""

    code: ErrorCode = Field(description="The failure kind (cluster/failures.py): decide on this and the status.")
    error: str = Field(description="What went wrong, for people (names the field, limit or missing resource).")
    detail: Any = Field(None, description="More for people and tools, by code: invalid_request's problems "
                                          "(field, message), unavailable's replica states, a member's replica.")

