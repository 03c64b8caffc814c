"""When an engine that does not answer its health probes counts as hung: after ``probes`` missed in a row.

One late probe (a burst of tokenizing under a pod's CPU limit, a long engine step) must not cost a
replica's cold start; an engine that misses ``probes`` checks in a row is hung and is replaced
(docs/operations/faults.md). Pure bookkeeping: the caller times the probes and says what each check saw.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HangWatch"]


@dataclass
class HangWatch:
    """Counts consecutive missed health probes; an answered probe starts the count again."""

    probes: int
    consecutive_misses: int = 0
    missed_total: int = 0  # checks that found no answer, over the replica's life
    recovered_total: int = 0  # answers that came after one or more missed checks

    def __post_init__(self) -> None:
        if self.probes < 1:
            raise ValueError(f"probes: must be at least 1 (got {self.probes})")

    def answered(self) -> None:
        """A check found the engine's answer: the misses so far were a slow engine, not a hung one."""
        if self.consecutive_misses:
            self.recovered_total += 1
        self.consecutive_misses = 0

    def missed(self) -> bool:
        """A check found no answer within its time; whether the engine now counts as hung."""
        self.consecutive_misses += 1
        self.missed_total += 1
        return self.hung

    @property
    def hung(self) -> bool:
        """Whether ``probes`` checks in a row found no answer."""
        return self.consecutive_misses >= self.probes

    def as_dict(self) -> dict[str, int]:
        """The counts, for a replica's ``info()``."""
        return {"hang_probes": self.probes, "consecutive_misses": self.consecutive_misses,
                "missed_total": self.missed_total, "recovered_total": self.recovered_total}
