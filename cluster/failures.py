"""The failure contract: every way a call can fail, with what it means to a caller, in one place.

Each kind has a stable machine-readable ``code``: a result's ``failure`` field (a group or a
member answered with a flagged failure) or an HTTP error body's ``code``. Every non-2xx HTTP
answer is one error body (``ErrorResponse``: ``code``, ``error``, ``detail``): a request refused
before any scoring, or a member whose failure's kind has a status other than 200 (its group
conflicts, is refused, timed out, moved, or its replica is overloaded or stopping); a member's
answer is either its result (200) or that error body, never both. With the code: whether another
attempt may succeed (``retryable``), whether it is the service's back pressure, waited out rather
than counted as a failed attempt (``back_pressure``), whether the caller's own input is at fault
(``bad_input``), and the HTTP status the ingress answers with.
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
    "wrong_language",  # the language gate: the candidate is not in the target language
    "engine_error",  # the engine raised
    "timeout",  # a generation or the group assembly ran past its deadline
    "rejected",  # the group's input is refused (too large a group, a text the prompt guard rejects)
    "conflict",  # a member disagrees with what its group already holds
    "overloaded",  # the replica holds too many groups assembling: retry later
    "shutting_down",  # the replica is stopping, or stopped before the group was scored: retry
    "moved",  # the replica set changed and another replica collects the member's group: send it again
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
    "internal_error",  # the service failed unexpectedly (a bug: its log has the traceback)
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
    # The service is full now, not failing: a caller waits it out with backoff until its deadline, and the
    # wait spends none of its attempts (those are for real failures: a replica lost, the network).
    back_pressure: bool = False
    meaning: str = ""  # what happened, for people: the failure reference (docs/reference/failures.md)

    @property
    def retry_after(self) -> bool:
        """Whether an HTTP answer of this kind carries ``Retry-After``."""
        return self.http_status == 503


KINDS: dict[str, FailureKind] = {
    kind.code: kind
    for kind in (
        # Flagged answers: the group was judged, without a usable verdict. Retrying is the
        # service's job (scoring.retries); the caller gets a default reward.
        FailureKind("parse_failed", 200, meaning="no parseable verdict after every allowed attempt"),
        FailureKind("prompt_too_long", 200, bad_input=True,
                    meaning="the GQM prompt exceeds scoring.max_prompt_tokens"),
        FailureKind("too_few_distinct", 200, bad_input=True,
                    meaning="fewer than 2 distinct candidates: nothing to compare"),
        FailureKind("wrong_language", 200, bad_input=True,
                    meaning="the candidate is not in the group's target language (the recipe's language gate): "
                            "it gets the default reward and is never shown to the model"),
        FailureKind("engine_error", 200, meaning="the engine raised on this group"),
        FailureKind("timeout", 504, rejoin=True,
                    meaning="a generation, or the group's assembly, ran past its deadline (a member: send it "
                            "again to keep waiting)"),
        FailureKind("rejected", 422, bad_input=True,
                    meaning="the group's input is refused (more prompts than max_prompts_per_group, a text the "
                            "prompt guard rejects)"),
        FailureKind("conflict", 409, bad_input=True,
                    meaning="a member disagrees with what its group already holds (source, languages, size, a text)"),
        FailureKind("overloaded", 503, retryable=True, back_pressure=True,
                    meaning="Serve's queue is full, the replica holds too many groups assembling, or the tenant "
                            "its max_groups_in_flight or max_waiting_members (back pressure: retried with backoff "
                            "until the caller's deadline)"),
        FailureKind("shutting_down", 503, retryable=True,
                    meaning="the replica is stopping, or stopped before the group was scored"),
        FailureKind("moved", 503, rejoin=True,
                    meaning="the replica set changed while the member's group assembled and another replica now "
                            "collects it (a member: send it again, it goes there)"),
        FailureKind("invalid_request", 422, bad_input=True,
                    meaning="the body does not validate (the error names each field and problem)"),
        FailureKind("too_large", 413, bad_input=True, meaning="over a configured limit (the limit is named)"),
        FailureKind("unauthorized", 401, meaning="missing or wrong bearer token"),
        FailureKind("forbidden", 403, meaning="the request claims a tenant its token may not act for"),
        FailureKind("not_found", 404, meaning="no such route"),
        FailureKind("method_not_allowed", 405, meaning="the route takes another HTTP method"),
        FailureKind("unavailable", 503, retryable=True,
                    meaning="no scorer replica can answer now (none placed: the missing resources are named; "
                            "all went away)"),
        FailureKind("internal_error", 500,
                    meaning="the service failed unexpectedly (a bug: the ingress's log has the traceback)"),
    )
}

# The codes a member's (or group's) result can carry as its ``failure``; over HTTP, a member's
# failure whose kind is not a 200 comes as an error body with this code (the client rebuilds it).
RESULT_FAILURES: frozenset[str] = frozenset(get_args(FailureReason))

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
