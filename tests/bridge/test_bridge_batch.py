"""The whole-batch path on a padded verl batch: grouping by uid, one request per group, reward
placement on the last valid response token, extra info per row, masking, GRPO advantages, and
agreement with the per-rollout manager."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from grrm_client.adapters.verl.batch import compute_batch_rewards, group_rows, mask_failed_rows, place_rewards
from grrm_client import RewardClient
from grrm_client.adapters.verl.config import BridgeConfig
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, row_components

from .helpers import LocalTransport, agent_loop_row, codeblock, padded_batch, quality_text, recipe, row_fields


def grpo_batch(tokenizer, groups=3, n=4, seed=0):
    """A batch as verl holds it after generation, rows of a group NOT adjacent (balance_batch
    reorders rows), responses of different lengths, one invalid and one duplicate rollout."""
    rng = np.random.default_rng(seed)
    responses, fields, expected_q = [], [], []
    for g in range(groups):
        for j in range(n):
            q = int(rng.integers(0, 11))
            text = quality_text(g, j, q)
            thinking = "Hmm. " * int(rng.integers(0, 6))
            if (g, j) == (0, 3):
                responses.append("no code block at all")
                expected_q.append(None)
            elif (g, j) == (1, 2):
                dup_q = expected_q[-1]
                responses.append(codeblock(quality_text(g, 1, dup_q), thinking=thinking))
                expected_q.append(dup_q)
            else:
                responses.append(codeblock(text, thinking=thinking))
                expected_q.append(q)
            fields.append(row_fields(f"uid-{g}", g * n + j))
    order = list(range(groups * n))
    rng.shuffle(order)
    return (
        padded_batch(tokenizer, [responses[i] for i in order], [fields[i] for i in order], response_length=96),
        [expected_q[i] for i in order],
        [responses[i] for i in order],
        [fields[i] for i in order],
    )


def test_group_rows_keeps_first_appearance_order():
    assert group_rows(["b", "a", "b", "c", "a"]) == {"b": [0, 2], "a": [1, 4], "c": [3]}


def test_place_rewards_on_the_last_valid_token(tokenizer):
    data = padded_batch(
        tokenizer, ["short", "a somewhat longer response than that", ""], [row_fields("u", i) for i in range(3)], eos=False
    )
    tensor = place_rewards(data, [1.0, -2.0, 3.0])
    valid = data.batch["attention_mask"][:, -data.batch["responses"].shape[1]:].sum(-1)
    assert tensor.dtype == torch.float32 and tensor.shape == data.batch["responses"].shape
    assert int(valid[2]) == 0
    for row, reward in enumerate([1.0, -2.0, 3.0]):
        position = max(int(valid[row]) - 1, 0)
        assert tensor[row, position] == reward
        assert torch.count_nonzero(tensor[row]) == 1
    with pytest.raises(ValueError, match="rewards"):
        place_rewards(data, [1.0])


async def test_whole_batch_rewards(tokenizer):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    data, expected_q, _, _ = grpo_batch(tokenizer)
    transport = LocalTransport(recipe=recipe(default_reward=-0.5, scale=0.1))
    config = BridgeConfig()
    result = await compute_batch_rewards(data, config, tokenizer, RewardClient(config, transport))
    expected = [-0.5 if q is None else 0.1 * q for q in expected_q]
    assert result.rewards == pytest.approx(expected)
    assert result.reward_tensor.sum(-1).tolist() == pytest.approx(expected)
    valid_len = data.batch["attention_mask"][:, -data.batch["responses"].shape[1]:].sum(-1)
    assert result.reward_tensor[torch.arange(len(data)), valid_len - 1].tolist() == pytest.approx(expected)
    # Extra info: every key, one value per row, row-aligned.
    assert list(result.extra_info) == list(EXTRA_INFO_KEYS)
    assert all(len(values) == len(data) for values in result.extra_info.values())
    assert result.extra_info["raw_score"] == expected_q
    assert result.extra_info["failure"] == ["" if q is not None else "invalid_extraction" for q in expected_q]
    assert set(result.non_tensor_extra_info()) == set(EXTRA_INFO_KEYS)
    assert result.metrics["grrm/valid"] == 11 and result.metrics["grrm/default/invalid_extraction"] == 1
    # The recipe's one part, per row, and its mean over the batch (the invalid rollout has none: 0).
    assert [row_components({"components": text}) for text in result.extra_info["components"]] == [
        {} if q is None else {"grrm": pytest.approx(0.1 * q)} for q in expected_q]
    assert result.metrics["grrm/component/grrm/mean"] == pytest.approx(sum(0.1 * (q or 0) for q in expected_q) / 12)
    # One whole-group request per uid whose rollouts all hold a translation, every one in its order (the
    # service shows the duplicate once); uid-0's invalid rollout sends that group as members.
    assert sorted(r.group_id for r in transport.group_requests) == ["uid-1", "uid-2"]
    assert {r.group_id: len(r.candidates) for r in transport.group_requests} == {"uid-1": 4, "uid-2": 4}
    assert all(r.response_tokens is not None and min(r.response_tokens) > 0 for r in transport.group_requests)
    # verl's GRPO advantage: zero mean per uid, ordered like the rewards.
    advantages, _ = compute_grpo_outcome_advantage(
        result.reward_tensor, data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    per_row = advantages[:, 0]
    uids = data.non_tensor_batch["uid"]
    for uid in set(uids):
        rows = np.flatnonzero(uids == uid)
        assert abs(float(per_row[rows].mean())) < 1e-5
        rewards = np.array(result.rewards)[rows]
        assert np.array_equal(np.argsort(per_row[rows].numpy(), kind="stable"), np.argsort(rewards, kind="stable"))


async def test_batch_and_per_rollout_paths_agree(tokenizer):
    from .test_bridge_manager import load_manager

    data, _, responses, fields = grpo_batch(tokenizer, groups=4, seed=5)
    config = BridgeConfig(group_size=4)
    batch = await compute_batch_rewards(data, config, tokenizer, RewardClient(config, LocalTransport(recipe=recipe())))
    manager = load_manager(tokenizer, n=4, transport=LocalTransport(recipe=recipe()))
    answers = await asyncio.gather(
        *(manager.run_single(agent_loop_row(tokenizer, response, row)) for response, row in zip(responses, fields))
    )
    assert [a["reward_score"] for a in answers] == pytest.approx(batch.rewards)
    for key in ("valid", "raw_score", "failure", "failed", "components"):
        assert [a["reward_extra_info"][key] for a in answers] == batch.extra_info[key]


async def test_failed_groups_are_flagged_and_maskable(tokenizer):
    from cluster.engines import ScriptedEngineOptions

    data, expected_q, _, _ = grpo_batch(tokenizer, groups=2)
    transport = LocalTransport(scripted=ScriptedEngineOptions(error_rate=1.0), recipe=recipe(default_reward=0.25))
    config = BridgeConfig(mask_failed=True)
    result = await compute_batch_rewards(data, config, tokenizer, RewardClient(config, transport))
    assert result.rewards == [0.25] * len(data)  # the recipe's default, for failures and the invalid rollout
    masked = result.extra_info["masked"]
    assert masked == [q is not None for q in expected_q]  # the invalid rollout is a default, not a failure
    assert set(result.extra_info["failure"]) == {"engine_error", "invalid_extraction"}
    before = data.batch["response_mask"].sum(-1)
    assert mask_failed_rows(data, masked) == 7
    after = data.batch["response_mask"].sum(-1)
    assert all((after[i] == 0) == masked[i] for i in range(len(data))) and int(after.sum()) == int(before[~torch.tensor(masked)].sum())
    assert mask_failed_rows(data, [False] * len(data)) == 0
