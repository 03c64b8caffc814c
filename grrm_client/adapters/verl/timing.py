"""When one rollout's reward went through the bridge and the reward service: per-member timestamps.

Every reward carries them in its ``reward_extra_info`` (Unix seconds, 0.0 for what did not happen),
so verl's own records say, per rollout: when its reward request reached the bridge (``sent_at``,
moments after the rollout finished), when it reached the replica that answered (``received_at``),
when its group's last member arrived (``complete_at``), when the group's scoring started and ended
(``scoring_started_at``, ``scoring_ended_at``), and when the answer was back (``answered_at``).
Bridge times come from the reward worker's clock, service times from the replica's: on one machine
they agree; across nodes they differ by the nodes' clock offset (NTP keeps it to milliseconds),
which is small next to the seconds these intervals span. Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cluster.protocol.schema import MemberTiming

__all__ = ["RewardTiming"]


@dataclass(frozen=True, slots=True)
class RewardTiming:
    """One rollout's reward, timed (see the module docstring)."""

    sent_at: float
    worker_in_flight: int = 0  # reward calls running in this reward-loop worker when it arrived, itself included
    rejoins: int = 0  # times the member re-joined its still incomplete group
    received_at: float = 0.0
    complete_at: float = 0.0
    scoring_started_at: float = 0.0
    scoring_ended_at: float = 0.0
    answered_at: float = 0.0

    def answered(self, answered_at: float, service: MemberTiming | None = None, rejoins: int = 0) -> RewardTiming:
        """These times completed by the answer (``service``: the replica's times, when it answered)."""
        times = {}
        if service is not None:
            times = {
                "received_at": service.received_at,
                "complete_at": service.complete_at or 0.0,
                "scoring_started_at": service.scoring_started_at or 0.0,
                "scoring_ended_at": service.scoring_ended_at or 0.0,
            }
        return dataclasses.replace(self, answered_at=answered_at, rejoins=rejoins, **times)

    def as_extra_info(self) -> dict[str, float | int]:
        """The fields as ``reward_extra_info`` carries them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


# The reward_extra_info keys of a RewardTiming, in order.
TIMING_KEYS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(RewardTiming))
