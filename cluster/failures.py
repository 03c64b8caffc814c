"""The failure contract: every way a call can fail, with what it means to a caller, in one place.

Each kind has a stable machine-readable ``code``: a result's ``failure`` field (a group or a
member answered with a flagged failure) or an HTTP error body's ``code`` (a request refused
before any scoring). With it: whether another attempt may succeed (``retryable``), whether the
caller's own input is at fault (``bad_input``), and the HTTP status the ingress answers with.
Callers decide from these fields, never from a message text; messages are for people and may
be reworded freely.

Pure data, no I/O: the replica, the ingress, the bridge's client and ``grrm score`` all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# A result's `failure`: the service answered, with no usable score (or none at all for members).
FailureReason = Literal[
    "parse_failed",  # no parseable verdict after every allowed attempt
    "prompt_too_long",  # the GQM prompt exceeds the configured token limit
    "too_few_distinct",  # fewer than 2 distinct candidates: nothing to compare
    "engine_error",  # the engine raised
    "timeout",  # a generation or the group assembly ran past its deadline
    "rejected",  # the group's input is refused (too large a group, a text the prompt guard rejects)
    "conflict",  # a member disagrees with what its group already holds
    "overloaded",  # the replica holds too many groups assembling: retry later
    "shutting_down",  # the replica is stopping, or stopped before the group was scored: retry
]

# An HTTP error body's `code`: the request was refused or could not be served.
RequestErrorCode = Literal[
    "invalid_request",  # the body does not validate (field named in `error`)
    "too_large",  # over a limit of the deployment (limit named in `error`)
    "unauthorized",  # missing or wrong bearer token
    "forbidden",  # the request names a tenant its token may not act for
    "not_found",  # no such route
    "method_not_allowed",
    "unavailable",  # no scorer replica can answer now (none placed, all went away): retry later
]

ErrorCode = Literal[FailureReason, RequestErrorCode]


@dataclass(frozen=True, slots=True)
class FailureKind:
    """What one failure code means to a caller."""

    code: str
    http_status: int  # the status of an HTTP answer carrying this kind (200: a flagged answer)
    retryable: bool = False  # another attempt, later, may succeed
    bad_input: bool = False  # the request's own content is at fault: the same request fails again
    rejoin: bool = False  # a member's group is not complete yet: send it again to join it (not a retry)

    @property
    def retry_after(self) -> bool:
        """Whether an HTTP answer of this kind carries ``Retry-After``."""
        return self.http_status == 503


KINDS: dict[str, FailureKind] = {
    kind.code: kind
    for kind in (
        # Flagged answers: the group was judged, without a usable verdict. Retrying is the
        # service's job (scoring.retries); the caller gets a default reward.
        FailureKind("parse_failed", 200),
        FailureKind("prompt_too_long", 200, bad_input=True),
        FailureKind("too_few_distinct", 200, bad_input=True),
        FailureKind("engine_error", 200),
        FailureKind("timeout", 504, rejoin=True),
        FailureKind("rejected", 422, bad_input=True),
        FailureKind("conflict", 409, bad_input=True),
        FailureKind("overloaded", 503, retryable=True),
        FailureKind("shutting_down", 503, retryable=True),
        FailureKind("invalid_request", 422, bad_input=True),
        FailureKind("too_large", 413, bad_input=True),
        FailureKind("unauthorized", 401),
        FailureKind("forbidden", 403),
        FailureKind("not_found", 404),
        FailureKind("method_not_allowed", 405),
        FailureKind("unavailable", 503, retryable=True),
    )
}

# What an HTTP status means when an answer carries no code of ours (a proxy's 502, say).
_BY_STATUS: dict[int, str] = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
                              413: "too_large",
                              422: "invalid_request", 502: "unavailable", 503: "unavailable", 504: "unavailable"}


def kind_of(code: str | None) -> FailureKind | None:
    """The kind of a failure code; None for no failure or a code this version does not know."""
    return KINDS.get(code) if code is not None else None


def code_for_status(status: int) -> str | None:
    """The code an HTTP status stands for when the answer names none (None: no code of ours)."""
    return _BY_STATUS.get(status)


def error_codes() -> tuple[str, ...]:
    """Every code, result failures first."""
    return (*get_args(FailureReason), *get_args(RequestErrorCode))
