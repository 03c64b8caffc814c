"""The retry policy: how many attempts one logical request gets, how long it may take in all,
how long to wait between attempts, and which failures are worth another attempt.

One object, one backoff formula, read by the one layer that retries (the client's
:class:`~grrm_client.RewardClient`) and by the Serve-side re-routing of calls whose replica died
(``deployments/client.py``'s ``ReplicaCallPolicy``). Pure: no I/O, no clock.
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

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {self.max_attempts}")
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(f"max_backoff_s ({self.max_backoff_s}) is less than backoff_s ({self.backoff_s})")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))

    @staticmethod
    def retryable(code: str | None) -> bool:
        """Whether a failure (a code of ``cluster/failures.py``, or a transport error) is worth another attempt."""
        kind = kind_of(code)
        return code == TRANSPORT_ERROR or (kind is not None and kind.retryable)
