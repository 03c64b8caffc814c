"""Rewards for a complete batch: group rows by ``uid``, score every group at once, place rewards.

For callers that hold a whole ``DataProto`` after generation (verl's older whole-batch reward
path, evaluation scripts, the sequential mode of ``examples/grpo_overlap.py``). Each group goes
to the cluster as one whole-group request (its members, when a rollout holds no translation: see
:func:`grrm_client.adapters.pipeline.reward_group`); all groups are in flight concurrently (at most
``max_concurrent_groups``). The result is verl's token-level
reward tensor (each row's reward on its last valid response token, like
``RewardManagerBase.assemble_rm_scores``) and the same per-row extra info the per-rollout
manager returns, so both paths give the same rewards for the same rollouts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cluster.protocol.calls import CallOutcome
from grrm_client import RewardClient
from grrm_client.adapters.pipeline import reward_group
from grrm_client.adapters.verl.config import BridgeConfig
from grrm_client.adapters.verl.metrics import step_metrics
from cluster.rewards import RewardOutcome, RewardSettings
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, extra_info
from grrm_client.adapters.verl.rollout import Rollout, read_rollout

__all__ = [
    "BatchRewards",
    "GroupScore",
    "compute_batch_rewards",
    "group_rows",
    "mask_failed_rows",
    "place_rewards",
    "read_rollouts",
    "score_group",
    "score_rollouts",
]


@dataclass
class GroupScore:
    """One group's outcomes, with the service call that produced them (None: nothing was sent)."""

    outcomes: list[RewardOutcome]
    infos: list[dict[str, Any]]
    call: CallOutcome | None


@dataclass
class BatchRewards:
    """Rewards of a whole batch, row-aligned with it."""

    reward_tensor: torch.Tensor  # (batch, response_length), float32, reward on the last valid token
    rewards: list[float]
    outcomes: list[RewardOutcome]
    extra_info: dict[str, list[Any]]  # EXTRA_INFO_KEYS -> one value per row
    metrics: dict[str, float] = field(default_factory=dict)

    def non_tensor_extra_info(self) -> dict[str, np.ndarray]:
        """The extra info as verl keeps it in ``non_tensor_batch`` (one array per key)."""
        return {key: np.array(values, dtype=object) for key, values in self.extra_info.items()}


def read_rollouts(data: Any, config: BridgeConfig, tokenizer: Any) -> list[Rollout]:
    """Every row of a ``DataProto`` as a :class:`Rollout`."""
    return [read_rollout(data[i], config, tokenizer) for i in range(len(data))]


def group_rows(uids: Sequence[str]) -> dict[str, list[int]]:
    """Row indices per uid, groups in first-appearance order, rows in batch order."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(str(uid), []).append(row)
    return groups


async def score_group(
    rollouts: Sequence[Rollout], client: RewardClient, config: BridgeConfig, settings: RewardSettings | None = None
) -> GroupScore:
    """Score one group (rollouts of one uid, in rollout order) as a whole-group request."""
    first = rollouts[0]
    if any((r.source, r.src_lang, r.trg_lang, r.context) != (first.source, first.src_lang, first.trg_lang, first.context)
           for r in rollouts):
        raise ValueError(f"group {first.uid}: rows of one uid disagree on source, languages, reference or notes")
    scored = await reward_group(
        client,
        group_id=first.uid,
        source=first.source,
        src_lang=first.src_lang,
        trg_lang=first.trg_lang,
        completions=rollouts,
        settings=settings or config.reward_settings(),
        context=first.context,
    )
    infos = [
        extra_info(
            outcome,
            extracted=rollout.extracted,
            attempts=call.result.attempts if call is not None and call.result is not None else 0,
            request_attempts=call.attempts if call is not None else 0,
            replica=call.result.replica if call is not None and call.result is not None else "",
            mask_failed=config.mask_failed,
        )
        for outcome, rollout, call in zip(scored.outcomes, rollouts, scored.calls, strict=True)
    ]
    return GroupScore(outcomes=scored.outcomes, infos=infos, call=scored.call)


async def score_rollouts(
    rollouts: Sequence[Rollout], client: RewardClient, config: BridgeConfig
) -> tuple[list[RewardOutcome], list[dict[str, Any]]]:
    """Outcomes and extra info per rollout; all groups scored concurrently."""
    settings = config.reward_settings()
    groups = group_rows([rollout.uid for rollout in rollouts])
    limit = asyncio.Semaphore(config.max_concurrent_groups)

    async def one(rows: list[int]) -> GroupScore:
        async with limit:
            return await score_group([rollouts[row] for row in rows], client, config, settings)

    scored = await asyncio.gather(*(one(rows) for rows in groups.values()))
    outcomes: list[RewardOutcome | None] = [None] * len(rollouts)
    infos: list[dict[str, Any] | None] = [None] * len(rollouts)
    for rows, group in zip(groups.values(), scored, strict=True):
        for row, outcome, info in zip(rows, group.outcomes, group.infos, strict=True):
            outcomes[row], infos[row] = outcome, info
    return outcomes, infos  # type: ignore[return-value]


def place_rewards(data: Any, rewards: Sequence[float]) -> torch.Tensor:
    """verl's token-level reward tensor: each row's reward on its last valid response token.

    The valid response length comes from the response part of ``attention_mask`` (as in
    ``RewardManagerBase.assemble_rm_scores``). A row with an empty response keeps its reward on
    position 0, so it is not lost (verl's own helper would put it on the last column).
    """
    responses = data.batch["responses"]
    width = responses.shape[-1]
    valid_length = data.batch["attention_mask"][:, -width:].sum(dim=-1)
    if len(rewards) != responses.shape[0]:
        raise ValueError(f"rewards: {len(rewards)} rewards for {responses.shape[0]} rows")
    tensor = torch.zeros(responses.shape, dtype=torch.float32)
    positions = (valid_length - 1).clamp(min=0).long().cpu()
    tensor[torch.arange(tensor.shape[0]), positions] = torch.tensor(list(rewards), dtype=torch.float32)
    return tensor


def mask_failed_rows(data: Any, masked: Sequence[bool]) -> int:
    """Zero ``response_mask`` of rows whose reward could not be obtained; returns how many.

    ``masked`` is the ``masked`` extra-info column (``data.non_tensor_batch["masked"]`` after
    verl merged the reward loop's extra info). A missing ``response_mask`` is built from the
    attention mask first, as verl's ``compute_response_mask`` does.
    """
    flags = torch.as_tensor([bool(flag) for flag in masked], dtype=torch.bool)
    if not bool(flags.any()):
        return 0
    if "response_mask" not in data.batch.keys():
        width = data.batch["responses"].shape[-1]
        data.batch["response_mask"] = data.batch["attention_mask"][:, -width:].clone()
    mask = data.batch["response_mask"]
    mask[flags.to(mask.device)] = 0
    return int(flags.sum())


async def compute_batch_rewards(
    data: Any, config: BridgeConfig, tokenizer: Any, client: RewardClient | None = None
) -> BatchRewards:
    """Score a complete ``DataProto``: read, group by uid, score concurrently, place on tokens."""
    own_client = client is None
    client = client or RewardClient(config)
    try:
        rollouts = read_rollouts(data, config, tokenizer)
        outcomes, infos = await score_rollouts(rollouts, client, config)
    finally:
        if own_client:
            await client.aclose()
    rewards = [outcome.reward for outcome in outcomes]
    return BatchRewards(
        reward_tensor=place_rewards(data, rewards),
        rewards=rewards,
        outcomes=outcomes,
        extra_info={key: [info[key] for info in infos] for key in EXTRA_INFO_KEYS},
        metrics=step_metrics(infos),
    )
