"""The retry policy: how many attempts one logical request gets, how long it may take in all,
how long to wait between attempts, and which failures are worth another attempt.

Back pressure (a failure kind with ``back_pressure``: ``overloaded``, the service full now) is not a
failed attempt: a trainer's client waits it out with capped exponential backoff until its deadline,
and only real failures (a replica lost, the network, no replica) spend ``max_attempts``. A member
refused for 5 s and then given a default reward would leave the rest of its group waiting for it
until the deadline.

One object, one backoff formula, read by the one retry loop (``cluster/protocol/calls.py``'s
:class:`~cluster.protocol.calls.RetryLoop`), whoever runs it: a trainer (every transient failure retried,
incomplete groups re-joined) or the service's HTTP ingress (``deployments/client.py``: only a call
whose replica died is re-routed, within the caller's attempts; its caller retries the rest). Pure:
no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.failures import kind_of

# A failure of the client's own (not a service answer): an unexpected error on the way.
TRANSPORT_ERROR = "transport_error"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts, deadline and exponential backoff of one logical request."""

    max_attempts: int = 4
    deadline_s: float = 1800.0
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    # False: only a call whose replica died is sent again; any other transient failure is the answer
    # (the ingress's caller retries it, counting the ingress's sends as its own attempts).
    retry_transient: bool = True
    # Re-joins of a member whose group did not complete (None: until the deadline); past them it is
    # answered so. 0: its caller re-joins (the ingress's routes).
    max_rejoins: int | None = None
    # True: back pressure is retried until the deadline without spending max_attempts (see the module
    # docstring); False: it spends them like any transient failure. Read only where retry_transient is.
    back_pressure_until_deadline: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {self.max_attempts}")
        if self.max_rejoins is not None and self.max_rejoins < 0:
            raise ValueError(f"max_rejoins: must be >= 0 or None, got {self.max_rejoins}")
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(f"max_backoff_s ({self.max_backoff_s}) is less than backoff_s ({self.backoff_s})")

    def waits_out(self, code: str | None) -> bool:
        """Whether this policy retries a failure with ``code`` as back pressure: until the deadline, without
        spending an attempt (never where it retries no transient failure, as the ingress's routes)."""
        return self.retry_transient and self.back_pressure_until_deadline and self.back_pressure(code)

    @staticmethod
    def back_pressure(code: str | None) -> bool:
        """Whether a failure with ``code`` is the service's back pressure (full now, not failing)."""
        kind = kind_of(code)
        return kind is not None and kind.back_pressure

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))

    def retries(self, code: str | None, replica_lost: bool) -> bool:
        """Whether this policy sends a call again after a send failed with ``code`` (``replica_lost``:
        its replica died holding it)."""
        return replica_lost or (self.retry_transient and self.retryable(code))

    @staticmethod
    def retryable(code: str | None) -> bool:
        """Whether a failure (a code of ``cluster/failures.py``, or a transport error) is worth another attempt."""
        kind = kind_of(code)
        return code == TRANSPORT_ERROR or (kind is not None and kind.retryable)
