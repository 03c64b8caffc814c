"""Whether verl's reward-loop workers can hold every rollout that waits for its group.

verl 0.9.1 sends each finished rollout's reward request to a randomly chosen ``RewardLoopWorker``
(``experimental/agent_loop/agent_loop.py`` ``_compute_score``), an async Ray actor created without
``max_concurrency`` (``experimental/reward_loop/reward_loop.py`` ``_init_reward_loop_workers``), so
each worker runs at most Ray's default of 1000 calls at once. A member waiting for the rest of its
group holds one of them. When more rollouts can wait at once than the workers hold, later
members queue behind members that wait for them: their groups never complete and time out, and
nothing says why. This module computes, from the trainer config, how many rollouts each trainer
mode can have waiting, and how many workers hold them. Pure logic.

Rollouts in flight per mode (read in verl 0.9.1's source):

* v1 ``sync``, legacy trainer: one generation batch (``data.train_batch_size`` prompts, or the
  larger ``data.gen_batch_size``) times ``rollout.n``;
* v1 ``colocate_async`` and ``separate_async``: the prefetch window, the batch being generated plus
  ``num_warmup_batches`` batches (``trainer_base._add_async_warmup_batches``);
* ``one_step_off_policy``: two batches (the next one is generated while the current one trains);
* ``fully_async_policy``: the samples its rollouter runs at once, ``min(rollout replicas x
  async_training.concurrent_samples_per_replica, required samples x (staleness_threshold + 1) x
  trigger_parameter_sync_step)`` (``fully_async_rollouter.set_max_required_samples``), times
  ``rollout.n``.

Validation batches are not counted (their size depends on the dataset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grrm_client.adapters.verl.config import lookup

__all__ = ["InFlight", "concurrency_problem", "rollouts_in_flight", "trainer_mode", "workers_needed"]

# How far above its mean share a worker's load is allowed to reach: rollouts pick workers at
# random, so a worker's load is binomial; 4 standard deviations is about a 3e-5 chance per worker.
_LOAD_SIGMAS = 4.0


def trainer_mode(config: Any) -> str:
    """Which of verl 0.9.1's trainers a trainer config runs.

    ``fully_async`` (``async_training`` section), ``one_step_off`` (a top-level ``rollout`` pool),
    ``legacy`` (``trainer.use_v1=False``), else the v1 mode (``trainer.v1.trainer_mode``:
    ``sync``, ``colocate_async``, ``separate_async``).
    """
    if lookup(config, "async_training") is not None:
        return "fully_async"
    if lookup(config, "rollout.n_gpus_per_node") is not None:
        return "one_step_off"
    if lookup(config, "trainer.use_v1", True) in (False, "false", "False"):
        return "legacy"
    return str(lookup(config, "trainer.v1.trainer_mode", "sync"))


@dataclass(frozen=True, slots=True)
class InFlight:
    """How many rollouts can wait for their rewards at once, and how that was counted."""

    mode: str
    rollouts: int
    reason: str


def rollouts_in_flight(config: Any) -> InFlight | None:
    """The most rollouts a trainer config can have waiting for rewards at once (None: unknown)."""
    mode = trainer_mode(config)
    n = _integer(lookup(config, "actor_rollout_ref.rollout.n"))
    batch = groups_per_step(config) or 0
    if n is None:
        return None
    if mode == "fully_async":
        samples = _fully_async_samples(config)
        if samples is None:
            return None
        return InFlight(mode, samples * n, f"{samples} samples in flight x rollout.n={n}")
    if not batch:
        return None
    if mode in ("sync", "legacy"):
        return InFlight(mode, batch * n, f"a batch of {batch} prompts x rollout.n={n}")
    if mode == "one_step_off":
        return InFlight(mode, 2 * batch * n, f"2 batches of {batch} prompts x rollout.n={n}")
    if mode in ("colocate_async", "separate_async"):
        warmup = float(lookup(config, f"trainer.v1.{mode}.num_warmup_batches", 1) or 0)
        batches = 1 + math.ceil(warmup)
        return InFlight(
            mode, batches * batch * n, f"{batches} batches (num_warmup_batches={warmup:g} + 1) of {batch} prompts x rollout.n={n}"
        )
    return None


def groups_per_step(config: Any) -> int | None:
    """The groups one generation phase sends: a prompt's rollouts are one group (None: unknown)."""
    batch = max(_integer(lookup(config, "data.train_batch_size")) or 0, _integer(lookup(config, "data.gen_batch_size")) or 0)
    return batch or None


def _fully_async_samples(config: Any) -> int | None:
    mini_batch = _integer(lookup(config, "actor_rollout_ref.actor.ppo_mini_batch_size"))
    if mini_batch is None:
        return None
    required = mini_batch * (_integer(lookup(config, "async_training.require_batches", 1)) or 1)
    staleness = float(lookup(config, "async_training.staleness_threshold", 1) or 0)
    sync_step = _integer(lookup(config, "async_training.trigger_parameter_sync_step", 1)) or 1
    max_required = int(required * (staleness + 1) * sync_step)
    gpus = (_integer(lookup(config, "rollout.nnodes", 1)) or 0) * (_integer(lookup(config, "rollout.n_gpus_per_node", 1)) or 0)
    parallel = _integer(lookup(config, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1)) or 1
    per_replica = _integer(lookup(config, "async_training.concurrent_samples_per_replica", 16)) or 16
    replicas = max(1, gpus // parallel)
    return max(1, min(replicas * per_replica, max_required))


def workers_needed(rollouts: int, concurrency: int) -> int:
    """The fewest workers that hold ``rollouts`` spread at random, with room for the spread."""
    workers = 1
    while True:
        mean = rollouts / workers
        if mean + _LOAD_SIGMAS * math.sqrt(mean * (1 - 1 / workers)) <= concurrency:
            return workers
        workers += 1


def concurrency_problem(config: Any, concurrency: int) -> str | None:
    """Why the trainer config's reward workers cannot hold its waiting members (None: they can)."""
    in_flight = rollouts_in_flight(config)
    workers = _integer(lookup(config, "reward.num_workers"))
    if in_flight is None or workers is None or workers < 1:
        return None
    needed = workers_needed(in_flight.rollouts, concurrency)
    if needed <= workers:
        return None
    return (
        f"reward.num_workers={workers}: verl's {in_flight.mode} trainer can have {in_flight.rollouts} rollouts "
        f"waiting for their rewards at once ({in_flight.reason}), and each reward-loop worker runs at most "
        f"{concurrency} calls (Ray's default max_concurrency for async actors): members would queue behind "
        f"members that wait for them and their groups would time out. Set reward.num_workers={needed} "
        f"(or more)."
    )


def _integer(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
