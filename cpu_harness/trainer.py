"""TEST SUPPORT: verl 0.9.1's unmodified trainer (``python -m verl.trainer.main_ppo``) on this CPU.

:func:`main_ppo_command` is the command: GRPO with the GRRM bridge's documented ``reward.*``
overrides (:func:`bridge_overrides`, exactly what README tells users), plus the flags and
environment that only a CPU machine needs (:data:`CPU_OVERRIDES`, :data:`CPU_ENV`; each one is
explained in ``cpu_harness/README.md``). :func:`read_metrics` reads the step metrics verl's own
file logger wrote.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cpu_harness.ray_head import RAY_ENV

__all__ = [
    "CPU_ENV",
    "CPU_OVERRIDES",
    "TrainerRun",
    "bridge_overrides",
    "main_ppo_command",
    "read_metrics",
]

# Environment of every verl process (set on the Ray head, so Ray's workers inherit it).
CPU_ENV: dict[str, str] = {
    "VERL_USE_EXTERNAL_MODULES": "cpu_harness.verl_platform",  # loaded by verl/__init__.py
    "VERL_PLATFORM": "cpu",  # the platform registered there
    "VERL_ENGINE_DEVICE": "cuda",  # FSDP engine is registered for cuda/npu only
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Trainer flags a CPU needs (see README.md in this folder for what each works around).
CPU_OVERRIDES: tuple[str, ...] = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.model.use_remove_padding=False",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.free_cache_engine=False",
    "+actor_rollout_ref.rollout.enable_sleep_mode=False",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "+ray_kwargs.ray_init.include_dashboard=False",
)


def bridge_overrides(
    *,
    transport: str = "handle",
    http_url: str | None = None,
    default_reward: float = 0.0,
    extractor: str = "codeblock",
    extra: dict[str, object] | None = None,
) -> list[str]:
    """The ``reward.*`` overrides README documents for the GRRM bridge."""
    overrides = [
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.module.path=pkg://trainer_bridge.reward_manager",
        "reward.reward_manager.name=GRRMRewardManager",
        f"+reward.reward_kwargs.transport={transport}",
        "+reward.reward_kwargs.app_name=grrm",
        f"+reward.reward_kwargs.extractor={extractor}",
        "+reward.reward_kwargs.source_key=extra_info.source",
        "+reward.reward_kwargs.src_lang_key=extra_info.src_lang",
        "+reward.reward_kwargs.trg_lang_key=extra_info.trg_lang",
        f"+reward.reward_kwargs.default_reward={default_reward}",
    ]
    if transport == "http":
        overrides.append(f"+reward.reward_kwargs.http_url={http_url}")
    for key, value in (extra or {}).items():
        overrides.append(f"+reward.reward_kwargs.{key}={value}")
    return overrides


@dataclass
class TrainerRun:
    """One small GRPO training: where its inputs are and where verl writes what it records."""

    policy_dir: Path
    train_file: Path
    val_file: Path
    output_dir: Path
    ray_address: str
    steps: int = 2
    prompts_per_batch: int = 4
    rollout_n: int = 4
    max_response_length: int = 16
    reward_workers: int = 2
    agent_workers: int = 2
    bridge: list[str] = field(default_factory=bridge_overrides)

    @property
    def metrics_file(self) -> Path:
        """verl's file logger output: one JSON line per step."""
        return self.output_dir / "metrics.jsonl"

    @property
    def rollout_dir(self) -> Path:
        """verl's rollout dumps (``trainer.rollout_data_dir``): one JSONL file per step."""
        return self.output_dir / "rollouts"


def main_ppo_command(run: TrainerRun) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``python -m verl.trainer.main_ppo`` for ``run``."""
    run.output_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={run.train_file}",
        f"data.val_files={run.val_file}",
        f"data.train_batch_size={run.prompts_per_batch}",
        "data.max_prompt_length=96",
        f"data.max_response_length={run.max_response_length}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={run.policy_dir}",
        f"actor_rollout_ref.rollout.n={run.rollout_n}",
        f"actor_rollout_ref.rollout.agent.num_workers={run.agent_workers}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={run.prompts_per_batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        f"reward.num_workers={run.reward_workers}",
        f"trainer.total_training_steps={run.steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=grrm-cpu-harness",
        "trainer.experiment_name=grpo",
        f"trainer.rollout_data_dir={run.rollout_dir}",
        f"trainer.default_local_dir={run.output_dir / 'checkpoints'}",
        f"+ray_kwargs.ray_init.address={run.ray_address}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={run.metrics_file}",
        *CPU_OVERRIDES,
        *run.bridge,
    ]
    env = {**os.environ, **RAY_ENV, **CPU_ENV, "PYTHONUNBUFFERED": "1"}
    return argv, env


def read_metrics(path: Path) -> list[dict]:
    """The step metrics verl's file logger wrote (``[{"step": n, "data": {...}}, ...]``).

    Readable while the trainer runs: a missing file is no steps, a line still being written is skipped.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip().endswith("}")]
