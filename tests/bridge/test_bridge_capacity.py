"""The start-time check that verl's reward-loop workers can hold every member waiting for its group
(grrm_client/adapters/verl/capacity.py): per trainer mode, from the trainer config verl hands the manager."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from grrm_client.adapters.verl.capacity import concurrency_problem, rollouts_in_flight, trainer_mode, workers_needed

from .helpers import verl_config


def config(n=16, batch=64, workers=8, **sections):
    base = OmegaConf.to_container(verl_config(n=n))
    base["data"]["train_batch_size"] = batch
    base["reward"]["num_workers"] = workers
    base["actor_rollout_ref"]["actor"] = {"ppo_mini_batch_size": batch}
    for dotted, value in sections.items():
        node = base
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return OmegaConf.create(base)


@pytest.mark.parametrize(
    ("sections", "mode", "rollouts"),
    [
        ({}, "sync", 64 * 16),
        ({"trainer__use_v1": False}, "legacy", 64 * 16),
        ({"trainer__v1__trainer_mode": "colocate_async"}, "colocate_async", 2 * 64 * 16),  # + 1 warm-up batch (default)
        ({"trainer__v1__trainer_mode": "separate_async", "trainer__v1__separate_async__num_warmup_batches": 2},
         "separate_async", 3 * 64 * 16),
        ({"rollout__nnodes": 1, "rollout__n_gpus_per_node": 8}, "one_step_off", 2 * 64 * 16),
        # fully_async: min(8 replicas x 16 samples, 64 x 1.1 x 4 = 281 samples) x n
        ({"rollout__nnodes": 1, "rollout__n_gpus_per_node": 8, "async_training__staleness_threshold": 0.1,
          "async_training__trigger_parameter_sync_step": 4, "async_training__concurrent_samples_per_replica": 16},
         "fully_async", 128 * 16),
    ],
)
def test_rollouts_in_flight_per_trainer_mode(sections, mode, rollouts):
    trainer_config = config(**sections)
    assert trainer_mode(trainer_config) == mode
    assert rollouts_in_flight(trainer_config).rollouts == rollouts


def test_workers_needed_leaves_room_for_the_random_spread():
    assert workers_needed(900, 1000) == 1
    assert workers_needed(1000, 1000) == 1  # one worker gets every call: no spread
    assert workers_needed(1001, 1000) == 2
    # 1024 prompts x n=16: 16.4 workers' worth of slots, 19 with room for 4 standard deviations.
    assert workers_needed(16_384, 1000) == 19
    needed = [workers_needed(rollouts, 1000) for rollouts in range(500, 50_000, 250)]
    assert needed == sorted(needed)  # more waiting rollouts never need fewer workers


def test_a_config_whose_workers_cannot_hold_its_waiting_members_names_the_setting():
    # A large run: 1024 prompts x n=16 on 8 workers.
    problem = concurrency_problem(config(n=16, batch=1024, workers=8), 1000)
    assert "reward.num_workers=8" in problem and "16384 rollouts" in problem and "reward.num_workers=19" in problem
    assert concurrency_problem(config(n=16, batch=1024, workers=19), 1000) is None
    assert concurrency_problem(config(n=16, batch=1024, workers=8), 4000) is None  # actors with more slots
    assert concurrency_problem(config(n=8, batch=64, workers=1), 1000) is None  # 512 rollouts fit one worker


def test_the_manager_refuses_to_start_with_too_few_reward_workers(tokenizer):
    from verl.trainer.ppo.reward import load_reward_manager

    with pytest.raises(ValueError, match=r"grrm: reward.num_workers=2: .* Set reward.num_workers=4"):
        load_reward_manager(config(n=16, batch=192, workers=2), tokenizer)
    manager = load_reward_manager(config(n=16, batch=192, workers=2, reward__reward_kwargs__reward_worker_concurrency=2000), tokenizer)
    assert manager.bridge.reward_worker_concurrency == 2000
