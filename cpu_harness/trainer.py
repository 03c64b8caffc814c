"""TEST SUPPORT: verl 0.9.1's unmodified trainer on this CPU, in each of its trainer modes.

:func:`main_ppo_command` is the command: GRPO with the GRRM bridge's documented ``reward.*``
overrides (:func:`bridge_overrides`, exactly what docs/trainers/verl.md tells users), the mode's entry point and
overrides (:data:`MODES`: what the mode needs on any hardware, kept apart from what only this CPU
machine needs), plus the flags and environment that only a CPU machine needs
(:data:`CPU_OVERRIDES`, :data:`CPU_ENV`; each one is explained in ``cpu_harness/README.md``).
:func:`read_metrics` reads the step metrics verl's own file logger wrote.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cpu_harness.ray_head import RAY_ENV

# Names only (importing cpu_harness.checkpoint_engine or verl_platform would import verl and Ray).
CHECKPOINT_BACKEND = "cpu_object_store"  # cpu_harness.checkpoint_engine.BACKEND
CHECKPOINT_MODULE = "cpu_harness.checkpoint_engine"
TRAINING_PHASES_ENV = "CPU_HARNESS_TRAINING_PHASES"  # cpu_harness.verl_platform.TRAINING_PHASES_ENV
MIN_TRAINING_PHASE_ENV = "CPU_HARNESS_MIN_TRAINING_PHASE_S"  # cpu_harness.verl_platform.MIN_TRAINING_PHASE_ENV

__all__ = [
    "CPU_CHECKPOINT_ENGINE",
    "CPU_ENV",
    "CPU_OVERRIDES",
    "FAKE_GPUS",
    "HEAD_CPUS",
    "MIN_TRAINING_PHASE_ENV",
    "MODES",
    "STEP_METRICS_PLUGIN",
    "TRAINING_PHASES_ENV",
    "TrainerMode",
    "TrainerRun",
    "bridge_overrides",
    "main_ppo_command",
    "read_metrics",
]

# The opt-in docs/trainers/verl.md tells users: the bridge's counters in verl's step metrics (grrm/...).
STEP_METRICS_PLUGIN = "trainer_bridge.verl_plugin"

# Environment of every verl process (set on the Ray head, so Ray's workers inherit it).
CPU_ENV: dict[str, str] = {
    # loaded by verl/__init__.py in that order: the CPU platform, then the step-metrics plugin
    "VERL_USE_EXTERNAL_MODULES": f"cpu_harness.verl_platform,{STEP_METRICS_PLUGIN}",
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
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override=1024",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "+ray_kwargs.ray_init.include_dashboard=False",
)


# Modes that sync weights to standalone rollout replicas use a checkpoint engine; verl's default
# (nccl) needs cupy and CUDA. On a CPU the weights go through Ray's object store instead
# (cpu_harness/checkpoint_engine.py, registered through verl's custom_backend_module).
CPU_CHECKPOINT_ENGINE: tuple[str, ...] = (
    f"actor_rollout_ref.rollout.checkpoint_engine.backend={CHECKPOINT_BACKEND}",
    f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={CHECKPOINT_MODULE}",
)


@dataclass(frozen=True)
class TrainerMode:
    """One of verl 0.9.1's trainer modes: its entry point and the overrides it needs.

    ``overrides`` is what the mode itself needs on any hardware (what a user sets on GPUs);
    ``cpu_overrides`` what only this CPU machine adds (or replaces) for it. ``{prompts}``,
    ``{steps}`` and ``{rollouts}`` (prompts x steps, fully_async's prompt budget) are filled in
    from the run.
    """

    entry: str
    overrides: tuple[str, ...] = ()
    cpu_overrides: tuple[str, ...] = ()
    gpus: int = 1  # GPUs the mode's resource pools ask Ray for (trainer pool + standalone rollout pool)
    description: str = ""


MAIN_PPO = "verl.trainer.main_ppo"

MODES: dict[str, TrainerMode] = {
    "sync": TrainerMode(MAIN_PPO, description="v1 trainer (default), rollout and training take turns"),
    "legacy": TrainerMode(MAIN_PPO, ("trainer.use_v1=False",), description="the legacy (v0) trainer"),
    "colocate_async": TrainerMode(
        MAIN_PPO,
        ("trainer.v1.trainer_mode=colocate_async",),
        description="v1, rollout replicas on the training GPUs, partial rollouts across weight updates",
    ),
    "separate_async": TrainerMode(
        MAIN_PPO,
        (
            "trainer.v1.trainer_mode=separate_async",
            "actor_rollout_ref.rollout.nnodes=1",  # the standalone rollout pool
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",  # anything but naive
            # train_batch_size must equal parameter_sync_step x ppo_mini_batch_size (both {prompts} here)
            "trainer.v1.separate_async.parameter_sync_step=1",
        ),
        CPU_CHECKPOINT_ENGINE,
        gpus=2,
        description="v1, standalone rollout replicas keep generating while the trainer trains",
    ),
    "one_step_off": TrainerMode(
        "verl.experimental.one_step_off_policy.main_ppo",
        (
            # Its config's searchpath is file://verl/trainer/config, relative to the working
            # directory (a verl source checkout): an installed verl needs the package path.
            "hydra.searchpath=[pkg://verl.trainer.config]",
            "actor_rollout_ref.hybrid_engine=False",
            "rollout.nnodes=1",  # the rollout pool (top-level rollout.*, copied to actor_rollout_ref.rollout)
            "rollout.n_gpus_per_node=1",
        ),
        CPU_CHECKPOINT_ENGINE,
        gpus=2,
        description="experimental one_step_off_policy: the next batch generates while this one trains",
    ),
    "fully_async": TrainerMode(
        "verl.experimental.fully_async_policy.fully_async_main",
        (
            "actor_rollout_ref.hybrid_engine=False",
            "data.train_batch_size=0",
            "data.gen_batch_size=1",
            "rollout.nnodes=1",
            "rollout.n_gpus_per_node=1",
            "rollout.total_rollout_steps={rollouts}",  # prompts; steps = this / (mini batch x sync step)
            "async_training.require_batches=1",
            "async_training.trigger_parameter_sync_step=1",  # one weight sync per training step
            # Up to (1 + staleness_threshold) x mini batch x sync step prompts in flight. The
            # default 0.1 gives int(4 x 1.1) = 4 here: nothing would generate (or be rewarded)
            # while the trainer trains. 1: the next batch generates during training.
            "async_training.staleness_threshold=1",
        ),
        CPU_CHECKPOINT_ENGINE,
        gpus=2,
        description="experimental fully_async_policy: a rollouter streams groups to a trainer through a queue",
    ),
}

# The head must offer as many (fake) GPUs as the most demanding mode asks for.
FAKE_GPUS = max(mode.gpus for mode in MODES.values())
# ... and enough logical CPUs (Ray's bookkeeping only, the machine has 2): besides verl's
# placement groups (3 CPUs per bundle) and TransferQueue actors, the experimental modes' actors
# reserve 10 CPUs each (OneStepTaskRunner; FullyAsyncRollouter and FullyAsyncTrainer, plus 2 for
# the MessageQueue).
HEAD_CPUS = 40


def bridge_overrides(
    *,
    transport: str = "handle",
    http_url: str | None = None,
    default_reward: float = 0.0,
    extractor: str = "codeblock",
    extra: dict[str, object] | None = None,
) -> list[str]:
    """The ``reward.*`` overrides docs/trainers/verl.md documents for the GRRM bridge."""
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
    # Two reward workers, so a group's members reach the service from different processes, as they do
    # at scale; one agent-loop worker: each is a process importing verl's agent loop (~5 s of CPU).
    reward_workers: int = 2
    agent_workers: int = 1
    bridge: list[str] = field(default_factory=bridge_overrides)
    mode: str = "sync"
    # Each actor update lasts at least this long (0: as long as it takes; see verl_platform).
    min_training_phase_s: float = 0.0

    @property
    def metrics_file(self) -> Path:
        """verl's file logger output: one JSON line per step."""
        return self.output_dir / "metrics.jsonl"

    @property
    def rollout_dir(self) -> Path:
        """verl's rollout dumps (``trainer.rollout_data_dir``): one JSONL file per step."""
        return self.output_dir / "rollouts"

    @property
    def training_phases_file(self) -> Path:
        """TEST SUPPORT: one JSON line per actor update, ``{"start", "end", ...}`` (``time.time()``)."""
        return self.output_dir / "training_phases.jsonl"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(*layers: tuple[str, ...] | list[str]) -> list[str]:
    """Hydra overrides, a later layer's value replacing an earlier one's for the same key."""
    merged: dict[str, str] = {}
    for layer in layers:
        for override in layer:
            merged[_override_key(override)] = override
    return list(merged.values())


def main_ppo_command(run: TrainerRun) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``run``'s mode: ``python -m <entry point> <overrides>``."""
    mode = MODES[run.mode]
    run.output_dir.mkdir(parents=True, exist_ok=True)
    fields = {"prompts": run.prompts_per_batch, "steps": run.steps, "rollouts": run.prompts_per_batch * run.steps}
    common = [
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
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{TRAINING_PHASES_ENV}={run.training_phases_file}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{MIN_TRAINING_PHASE_ENV}='{run.min_training_phase_s:g}'",  # quoted: a string to Ray
    ]
    overrides = merge_overrides(
        common,
        CPU_OVERRIDES,
        [override.format(**fields) for override in mode.overrides],
        [override.format(**fields) for override in mode.cpu_overrides],
        run.bridge,
    )
    argv = [sys.executable, "-m", mode.entry, *overrides]
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
