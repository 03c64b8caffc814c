"""verl's reward-loop manager for GRRM: one rollout in, one reward out, scored as a group.

verl 0.9.1 asks for a reward per rollout as soon as that rollout finishes, from a randomly
chosen reward-loop worker (``RewardLoopWorker.compute_score`` -> ``manager.run_single(data)``).
GRRM needs the whole group in one prompt, so :meth:`GRRMRewardManager.run_single` sends the
rollout as a *member* of its group (``group_id`` = verl's ``uid``, ``group_size`` = rollout n,
``index`` = the rollout's position, see :mod:`trainer_bridge.rollout`); the cluster's router
brings all members of a group to one replica, which scores the group once its last member has
arrived and answers every member. Scoring of early groups therefore overlaps the generation of
later rollouts.

A rollout whose translation cannot be extracted is still sent, marked ``invalid``: it completes
its group without being shown to the model, so the other members never wait for a rollout that
has nothing to show. It gets the default reward.

Select it in verl with::

    reward.reward_manager.source=importlib
    reward.reward_manager.module.path=pkg://trainer_bridge.reward_manager
    reward.reward_manager.name=GRRMRewardManager

(a file path to this module works too). Its settings come from ``reward.reward_kwargs``
(:class:`trainer_bridge.config.BridgeConfig`).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, register

from cluster.schema import MemberRequest
from trainer_bridge.client import CallOutcome, RewardClient
from trainer_bridge.config import BridgeConfig
from trainer_bridge.metrics import RewardCounters
from trainer_bridge.rewards import (
    TOO_FEW_DISTINCT,
    RewardOutcome,
    default_outcome,
    extra_info,
    member_outcome,
)
from trainer_bridge.rollout import Rollout, group_size_of, read_rollout, rollout_index

__all__ = ["GRRMRewardManager"]

logger = logging.getLogger(__name__)


class GRRMRewardManager(RewardManagerBase):
    """Per-rollout GRRM rewards through the member API of the reward cluster."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        *,
        bridge_config: BridgeConfig | None = None,
        client: RewardClient | None = None,
    ):
        """Built by verl as ``cls(config=, tokenizer=, compute_score=, reward_router_address=,
        reward_model_tokenizer=)``; ``compute_score`` and the router address are unused (the
        reward comes from the cluster). Tests may pass ``bridge_config`` and ``client``."""
        super().__init__(config, tokenizer, compute_score)
        self.bridge = bridge_config or BridgeConfig.from_verl_config(config)
        self.settings = self.bridge.reward_settings()
        self.client = client or RewardClient(self.bridge)
        self.counters = RewardCounters()
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """The reward of one rollout (the last sequence of ``data``, as verl's own managers do)."""
        item = data[-1:][0]
        rollout = read_rollout(item, self.bridge, self.tokenizer)
        non_tensor = item.non_tensor_batch
        group_size = group_size_of(non_tensor, self.bridge)
        call: CallOutcome | None = None
        if group_size < 2:
            outcome = default_outcome(TOO_FEW_DISTINCT, self.settings)
        else:
            member = self._member(rollout, group_size, rollout_index(non_tensor, group_size, self.bridge.index_key))
            if member is None:
                outcome = default_outcome("rejected", self.settings)
            else:
                call = await self.client.score_member(member)
                outcome = self._outcome(rollout, call)
        return self._answer(rollout, outcome, call)

    def _member(self, rollout: Rollout, group_size: int, index: int) -> MemberRequest | None:
        try:
            return MemberRequest(
                group_id=rollout.uid,
                group_size=group_size,
                index=index,
                source=rollout.source,
                candidate=rollout.candidate or "",
                invalid=rollout.candidate is None,
                src_lang=rollout.src_lang,
                trg_lang=rollout.trg_lang,
            )
        except ValidationError as error:
            # Source or languages the service cannot take: every member of this group fails
            # the same way here, so none of them is left waiting on the cluster.
            logger.warning("grrm: group %s cannot be sent: %s", rollout.uid, error)
            return None

    def _outcome(self, rollout: Rollout, call: CallOutcome) -> RewardOutcome:
        result = call.result
        if result is None:
            logger.warning("grrm: no reward for group %s: %s (%s)", rollout.uid, call.failure, call.error)
            return member_outcome(
                extracted=rollout.candidate is not None,
                score=None,
                failure=rollout.invalid_reason or call.failure,
                length=rollout.length,
                settings=self.settings,
            )
        return member_outcome(
            extracted=rollout.candidate is not None,
            score=result.score if result.valid else None,
            failure=rollout.invalid_reason or result.failure,
            length=rollout.length,
            settings=self.settings,
        )

    def _answer(self, rollout: Rollout, outcome: RewardOutcome, call: CallOutcome | None) -> dict[str, Any]:
        result = call.result if call is not None else None
        info = extra_info(
            outcome,
            extracted=rollout.extracted,
            attempts=result.attempts if result is not None else 0,
            request_attempts=call.attempts if call is not None else 0,
            replica=result.replica if result is not None else "",
            mask_failed=self.bridge.mask_failed,
        )
        self.counters.record(outcome, masked=info["masked"], request_attempts=info["request_attempts"])
        return {"reward_score": outcome.reward, "reward_extra_info": info}

    def metrics(self) -> dict[str, float]:
        """This manager's counts since it was built (see :class:`trainer_bridge.metrics.RewardCounters`)."""
        return self.counters.as_metrics()


# Also selectable as `reward.reward_manager.name=grrm` with the default `source=register`,
# wherever this module is imported before verl validates its config. Loading this file by
# path defines the class a second time: the first registration stays.
if "grrm" not in REWARD_MANAGER:
    register("grrm")(GRRMRewardManager)
