"""verl's per-row ``reward_extra_info``: the bridge's record of how each reward came about.

Not the reward arithmetic (that is the core's, :mod:`cluster.rewards`): the row format verl collects
from every reward (:func:`extra_info`, the same keys and types for every row).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cluster.rewards import RewardOutcome
from cluster.protocol.members import components_of
from grrm_client.adapters.verl.timing import TIMING_KEYS, RewardTiming

__all__ = ["EXTRA_INFO_KEYS", "extra_info", "row_components"]

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
    *TIMING_KEYS,  # when the reward went through the bridge and the service (grrm_client/adapters/verl/timing.py)
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
