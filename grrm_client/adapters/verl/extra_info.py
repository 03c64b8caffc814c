"""verl's per-row ``reward_extra_info``: the bridge's record of how each reward came about, and when.

Not the reward arithmetic (that is the core's, :mod:`cluster.rewards`): the row format verl collects
from every reward (:func:`extra_info`, the same keys and types for every row).

Every row carries its reward's times (:class:`RewardTiming`; Unix seconds, 0.0 for what did not happen),
so verl's own records say, per rollout: when its reward request reached the bridge (``sent_at``,
moments after the rollout finished), when it reached the replica that answered (``received_at``),
when its group's last member arrived (``complete_at``), when the group's scoring started and ended
(``scoring_started_at``, ``scoring_ended_at``), and when the answer was back (``answered_at``).
Bridge times come from the reward worker's clock, service times from the replica's: on one machine
they agree; across nodes they differ by the nodes' clock offset (NTP keeps it to milliseconds),
which is small next to the seconds these intervals span.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.rewards import RewardOutcome
from cluster.protocol.schema import MemberTiming
from cluster.protocol.members import components_of

__all__ = ["EXTRA_INFO_KEYS", "RewardTiming", "extra_info", "row_components"]


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

# The keys of every row's reward_extra_info, in this order (verl needs the same keys everywhere).
EXTRA_INFO_KEYS: tuple[str, ...] = (
    "valid",  # the reward came from a GRRM comparison (False: it is the default reward)
    "extracted",  # a translation was extracted from the rollout
    "raw_score",  # GRRM's integer score (None when there is none)
    "components",  # the recipe's parts behind the reward, as JSON text ({} for none; see row_components)
    "attempts",  # the service's generation attempts for the group
    "request_attempts",  # our transport attempts for this request
    "replica",  # the replica that scored the group ("" when none did)
    "failure",  # why the reward is the default ("" when it is not)
    "failed",  # the reward could not be obtained (a failure, not the reference semantics)
    "masked",  # failed and mask_failed is on: the trainer should drop the row from the loss
    "group_id",  # the group id the service knows the rollout's group by ("" when not sent)
    *TIMING_KEYS,  # when the reward went through the bridge and the service (RewardTiming)
)


def extra_info(
    outcome: RewardOutcome,
    *,
    extracted: bool,
    attempts: int = 0,
    request_attempts: int = 0,
    replica: str = "",
    mask_failed: bool = False,
    group_id: str = "",
    timing: RewardTiming | None = None,
) -> dict[str, Any]:
    """One row's ``reward_extra_info``: exactly :data:`EXTRA_INFO_KEYS`, same types for every row."""
    failed = outcome.failed
    info = {
        "valid": bool(outcome.valid),
        "extracted": bool(extracted),
        "raw_score": outcome.raw_score,
        # Text, not a dict: verl's validation metrics average every non-text value, and a row's parts vary.
        "components": json.dumps(dict(components_of(outcome)), sort_keys=True),
        "attempts": int(attempts),
        "request_attempts": int(request_attempts),
        "replica": str(replica or ""),
        "failure": outcome.failure or "",
        "failed": failed,
        "masked": bool(mask_failed and failed),
        "group_id": str(group_id),
        **(timing or _UNTIMED).as_extra_info(),
    }
    assert tuple(info) == EXTRA_INFO_KEYS
    return info


_UNTIMED = RewardTiming(sent_at=0.0)  # rows scored outside the per-rollout path (grrm_client.adapters.verl.batch)


def row_components(info: Mapping[str, Any]) -> dict[str, float]:
    """The recipe parts of one row's ``reward_extra_info`` (empty when it carries none)."""
    text = info.get("components") or "{}"
    return {str(name): float(value) for name, value in json.loads(str(text)).items()}
