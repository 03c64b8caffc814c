"""Typed engine configuration, validated once at the boundary (deployment args, CLI, tests)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EngineKind = Literal["vllm", "sglang", "transformers", "scripted"]
# Which waiting prompt an engine serves first when it is saturated: "fifo", first come; or
# "largest_first", the longest prompt (the largest group), which shortens a step's tail when many
# groups complete together (bench/overlap.py). vLLM and the scripted engine only.
Scheduling = Literal["fifo", "largest_first"]
SCHEDULING_ENGINES = ("vllm", "scripted")
# How an engine starts its tensor/pipeline-parallel ranks: "mp", processes of the replica on its
# node (the replica holds every rank's device); "ray", Ray actors in the replica's placement group,
# which may span nodes; "auto", "mp" (single-node parallelism, what most replicas need).
ExecutorBackend = Literal["auto", "mp", "ray"]

# engine_kwargs keys that would bypass the typed fields below (and so the replica's resources,
# which follow from them): the field to set instead.
_PLACEMENT_KWARGS: dict[str, str] = {
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "distributed_executor_backend": "distributed_executor_backend",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
}


class ScriptedEngineOptions(BaseModel):
    """Behaviour of the deterministic scripted engine (tests and labelled simulations only)."""

    model_config = ConfigDict(extra="forbid")

    # Latency model: per_prompt_s + per_token_s * tokens (prompt tokens * prefill_token_s too),
    # scaled by a uniform factor in [1 - jitter, 1 + jitter].
    per_prompt_s: float = Field(0.0, ge=0)
    per_token_s: float = Field(0.0, ge=0)
    prefill_token_s: float = Field(0.0, ge=0)
    jitter: float = Field(0.0, ge=0, le=1)
    # Generations served at once (None: all at once). A real engine's throughput is bounded: with
    # a limit, groups queue for the engine as they would on a busy GPU.
    max_concurrent_prompts: int | None = Field(None, ge=1)
    # Length of the fake analysis before the verdict, in words (each counted as one token).
    analysis_words: int = Field(16, ge=0)
    # More analysis for larger groups, as a real model writes (0 = a fixed length).
    analysis_words_per_candidate: int = Field(0, ge=0)
    # Injected failures, drawn per generation from a seeded generator.
    malformed_rate: float = Field(0.0, ge=0, le=1)
    error_rate: float = Field(0.0, ge=0, le=1)
    hang_rate: float = Field(0.0, ge=0, le=1)
    # The engine dies (check_health fails, every call raises) after serving this many
    # generations: a crashed engine, for health-check and replacement tests.
    die_after_generations: int | None = Field(None, ge=0)
    # The engine hangs (generations and health probes never answer) after serving this many
    # generations: a hung engine, for hang-detection tests.
    stall_after_generations: int | None = Field(None, ge=0)
    # Add this many points to candidate A, fewer to later ones (a position bias to remove).
    position_bias: float = Field(0.0, ge=0)
    # Judgement noise (simulations of a fallible reward model). Each candidate's score in a group
    # prompt is off by a Gaussian draw of standard deviation `score_noise` (rounded), plus
    # `oversize_noise` more per candidate beyond `trained_group_size` (a model is worse on
    # groups larger than it was trained on), plus one shared draw per prompt of standard
    # deviation `prompt_shift_noise` (a model's scale is relative to the group it sees, so
    # scores from different prompts are not directly comparable). Draws are seeded by the
    # prompt and `seed`: the same prompt always gets the same verdict, another candidate order
    # or subgroup gets independent errors. All 0 = the exact marker scores.
    score_noise: float = Field(0.0, ge=0)
    oversize_noise: float = Field(0.0, ge=0)
    trained_group_size: int = Field(8, ge=2)
    prompt_shift_noise: float = Field(0.0, ge=0)
    seed: int = 0


class EngineConfig(BaseModel):
    """Which engine to run, on which model, with which engine-level settings."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    kind: EngineKind = "vllm"
    # A local directory or a Hugging Face hub id (hub downloads only where the network allows).
    model: str = ""
    tokenizer: str | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    distributed_executor_backend: ExecutorBackend = "auto"
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=16)
    dtype: str = "auto"
    # transformers engine only: "auto" picks cuda when available, else cpu.
    device: str = "auto"
    seed: int = 0
    scheduling: Scheduling = "fifo"
    # Passed through to the engine's own constructor (vLLM AsyncEngineArgs, sglang.Engine,
    # transformers from_pretrained; for transformers `max_batch_size` sets its micro-batch).
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    scripted: ScriptedEngineOptions = Field(default_factory=ScriptedEngineOptions)

    def request_priority(self, priority: int) -> int:
        """The priority an engine gives a request: the caller's with ``largest_first``, else 0
        (vLLM's first-come scheduler refuses any other)."""
        return priority if self.scheduling == "largest_first" else 0

    @model_validator(mode="after")
    def _scheduling_is_supported(self) -> EngineConfig:
        if "scheduling_policy" in self.engine_kwargs:  # the priorities the scorer passes follow engine.scheduling
            raise ValueError("engine.engine_kwargs.scheduling_policy: set engine.scheduling instead (fifo or largest_first)")
        if self.scheduling != "fifo" and self.kind not in SCHEDULING_ENGINES:
            raise ValueError(
                f"engine.scheduling: {self.scheduling!r} needs an engine that schedules by priority "
                f"({', '.join(SCHEDULING_ENGINES)}); the {self.kind} engine serves prompts first come, first served"
            )
        return self

    @model_validator(mode="after")
    def _placement_is_typed(self) -> EngineConfig:
        for key, field in _PLACEMENT_KWARGS.items():
            if key in self.engine_kwargs:
                raise ValueError(
                    f"engine.engine_kwargs.{key}: set engine.{field} instead "
                    "(the replica's devices and placement follow from it)"
                )
        if self.ranks > 1 and self.kind == "transformers":
            raise ValueError(
                f"engine.tensor_parallel_size / pipeline_parallel_size: the transformers engine runs one "
                f"process on one device (got {self.ranks} ranks); use kind vllm or sglang for parallel ranks"
            )
        if self.distributed_executor_backend == "ray" and self.kind == "sglang":
            raise ValueError(
                "engine.distributed_executor_backend: 'ray' is vLLM's; SGLang starts its ranks as "
                "processes of the replica ('mp' or 'auto')"
            )
        return self

    def batch_slots(self) -> int | None:
        """Generations the engine runs at once, where its settings say (None: unknown)."""
        if self.kind == "scripted":
            return self.scripted.max_concurrent_prompts
        key = {"vllm": "max_num_seqs", "sglang": "max_running_requests", "transformers": "max_batch_size"}[self.kind]
        value = self.engine_kwargs.get(key)
        return int(value) if value is not None else None

    @property
    def ranks(self) -> int:
        """Engine processes one replica runs: tensor-parallel x pipeline-parallel ranks."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def executor(self) -> Literal["mp", "ray"] | None:
        """How the engine starts its ranks (None: one rank, no distributed executor)."""
        if self.ranks == 1:
            return None
        return "mp" if self.distributed_executor_backend == "auto" else self.distributed_executor_backend

    def parallelism(self) -> dict[str, Any]:
        """The parallel layout as reported by ``/v1/info`` and a replica's ``info()``."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "distributed_executor_backend": self.executor,
        }
