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
# Engines that can sleep (weights offloaded, KV cache freed, woken in seconds): vLLM's sleep mode
# (CUDA only), and the scripted engine for tests. SGLang's memory release and transformers have no
# counterpart behind this interface.
SLEEP_ENGINES = ("vllm", "scripted")
# How an engine starts its tensor/pipeline-parallel ranks: "mp", processes of the replica on its
# node (the replica holds every rank's device); "ray", Ray actors in the replica's placement group,
# which may span nodes; "auto", "mp" (single-node parallelism, what most replicas need).
ExecutorBackend = Literal["auto", "mp", "ray"]

# engine_kwargs keys that would bypass the typed fields below (the replica's resources and its engine
# slots follow from them): the field to set instead. vLLM's names and SGLang's.
_TYPED_KWARGS: dict[str, str] = {
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "distributed_executor_backend": "distributed_executor_backend",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "max_num_seqs": "max_num_seqs",
    "max_running_requests": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "chunked_prefill_size": "max_num_batched_tokens",
}
# Engines whose batch the typed max_num_seqs / max_num_batched_tokens size.
BATCHING_ENGINES = ("vllm", "sglang")
# vLLM 0.32's max_num_seqs when AsyncLLM.from_engine_args builds the engine: its larger per-GPU defaults
# apply to `LLM` and its API server only (vllm/engine/arg_utils.py); tests/engines/test_vllm_engine_args.py
# reads it back from vLLM's own create_engine_config.
VLLM_ENGINE_DEFAULT_MAX_NUM_SEQS = 128


class ScriptedEngineOptions(BaseModel):
    """Behaviour of the deterministic scripted engine (tests and labelled simulations only)."""

    model_config = ConfigDict(extra="forbid")

    per_prompt_s: float = Field(
        0.0, ge=0, description="Latency model: per_prompt_s + per_token_s * tokens (prompt tokens * prefill_token_s "
                               "too), in seconds, scaled by a uniform factor in [1 - jitter, 1 + jitter].")
    per_token_s: float = Field(0.0, ge=0, description="Latency per generated token, in seconds (see per_prompt_s).")
    prefill_token_s: float = Field(0.0, ge=0, description="Latency per prompt token, in seconds (see per_prompt_s).")
    jitter: float = Field(0.0, ge=0, le=1, description="Each generation's latency is scaled by a uniform factor "
                                                       "in [1 - jitter, 1 + jitter].")
    start_s: float = Field(0.0, ge=0, le=3600, description="Seconds the engine takes to start (a real one loads "
                                                           "weights and warms up): a replica's cold start.")
    # A real engine's throughput is bounded: with a limit, groups queue for the engine as they
    # would on a busy GPU.
    max_concurrent_prompts: int | None = Field(None, ge=1, description="Generations served at once (None: all "
                                                                       "at once).")
    wake_s: float = Field(0.0, ge=0, le=3600, description="Seconds the engine takes to wake from sleep (a real one "
                                                          "loads its weights back from CPU memory).")
    analysis_words: int = Field(16, ge=0, description="Length of the fake analysis before the verdict, in words "
                                                      "(each counted as one token).")
    analysis_words_per_candidate: int = Field(0, ge=0, description="More analysis words per candidate of a group "
                                                                   "prompt, as a real model writes (0 = a fixed "
                                                                   "length).")
    # Injected failures, drawn per generation from a seeded generator.
    malformed_rate: float = Field(0.0, ge=0, le=1, description="Probability that a generation's verdict is "
                                                               "malformed (an injected failure).")
    error_rate: float = Field(0.0, ge=0, le=1, description="Probability that a generation raises an engine error "
                                                           "(an injected failure).")
    hang_rate: float = Field(0.0, ge=0, le=1, description="Probability that a generation hangs, never answering "
                                                          "(an injected failure).")
    die_after_generations: int | None = Field(
        None, ge=0, description="The engine dies (check_health fails, every call raises) after serving this many "
                                "generations: a crashed engine, for health-check and replacement tests.")
    stall_after_generations: int | None = Field(
        None, ge=0, description="The engine hangs (generations and health probes never answer) after serving "
                                "this many generations: a hung engine, for hang-detection tests.")
    # A test knob: a probe late under load (a burst of tokenizing under a CPU limit), not a hang.
    slow_probes_after_generations: int | None = Field(
        None, ge=0, description="Test knob: once the engine has served this many generations, its next "
                                "`slow_probes` health probes each answer only after `slow_probe_s` seconds (a "
                                "late probe, not a hang; None: every probe answers at once).")
    slow_probes: int = Field(1, ge=1, description="Test knob: how many health probes are late (see "
                                                  "slow_probes_after_generations).")
    slow_probe_s: float = Field(0.0, ge=0, le=3600, description="Test knob: seconds a late health probe takes "
                                                                "(see slow_probes_after_generations).")
    position_bias: float = Field(0.0, ge=0, description="Points added to candidate A, fewer to later ones (a "
                                                        "position bias to remove).")
    # Judgement noise (simulations of a fallible reward model). Draws are seeded by the prompt and
    # `seed`: the same prompt always gets the same verdict, another candidate order or subgroup
    # gets independent errors. All 0 = the exact marker scores.
    score_noise: float = Field(0.0, ge=0, description="Standard deviation of the Gaussian error (rounded) on each "
                                                      "candidate's score in a group prompt.")
    # A model is worse on groups larger than it was trained on.
    oversize_noise: float = Field(0.0, ge=0, description="Added to score_noise's standard deviation per candidate "
                                                         "beyond trained_group_size.")
    trained_group_size: int = Field(8, ge=2, description="Group size beyond which oversize_noise applies.")
    # A model's scale is relative to the group it sees, so scores from different prompts are not
    # directly comparable.
    prompt_shift_noise: float = Field(0.0, ge=0, description="Standard deviation of one Gaussian draw per prompt "
                                                             "added to all of its scores.")
    seed: int = Field(0, description="Seed of the injected failures, the latency jitter, the analysis text of "
                                     "unseeded sampled requests and the judgement noise.")

    @model_validator(mode="after")
    def _slow_probes_take_time(self) -> ScriptedEngineOptions:
        if self.slow_probes_after_generations is not None and self.slow_probe_s <= 0:
            raise ValueError("slow_probe_s: must be above 0 when slow_probes_after_generations is set "
                             "(a late probe takes time)")
        return self


class EngineConfig(BaseModel):
    """Which engine to run, on which model, with which engine-level settings."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    kind: EngineKind = Field("vllm", description="The engine: `vllm`, `sglang`, `transformers` or `scripted` "
                                                 "(the deterministic test engine).")
    model: str = Field("", description="A local directory or a Hugging Face hub id (hub downloads only where the "
                                       "network allows).")
    tokenizer: str | None = Field(None, description="Tokenizer directory or hub id (None: the model's).")
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor-parallel ranks of the engine (more than one: "
                                                           "vllm or sglang); the replica's GPUs follow from it.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline-parallel ranks of the engine (more than "
                                                             "one: vllm or sglang); the replica's GPUs follow from "
                                                             "it.")
    distributed_executor_backend: ExecutorBackend = Field(
        "auto", description="How the engine starts its tensor/pipeline-parallel ranks: `mp`, processes of the "
                            "replica on its node; `ray` (vLLM only), Ray actors in the replica's placement group, "
                            "which may span nodes; `auto`, `mp`.")
    enable_prefix_caching: bool = Field(True, description="Reuse the KV cache of shared prompt prefixes (vLLM's "
                                                          "prefix caching, SGLang's radix cache).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory the engine may "
                                                                       "use (SGLang: mem_fraction_static).")
    max_model_len: int | None = Field(None, ge=16, description="Context length in tokens (None: the model's own).")
    max_num_seqs: int | None = Field(
        None, ge=1, description="Sequences the engine runs at once (vLLM max_num_seqs, SGLang max_running_requests; "
                                "vllm and sglang only). The replica's engine slots follow from it. None: the "
                                "engine's default, for vLLM built as the replica builds it 128 whatever the GPU.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="Tokens one engine step processes, prefill chunks included (vLLM "
                                 "max_num_batched_tokens, SGLang chunked_prefill_size; vllm and sglang only). None: "
                                 "the engine's default, for vLLM built as the replica builds it 2048, which splits "
                                 "a long GQM prompt's prefill over many steps.")
    dtype: str = Field("auto", description="Model dtype passed to the engine (`auto`: the engine picks it from the "
                                           "model).")
    device: str = Field("auto", description="transformers engine only: the torch device; `auto` picks cuda when "
                                            "available, else cpu.")
    seed: int = Field(0, description="Engine-level random seed (the transformers engine seeds requests that carry "
                                     "no seed from it).")
    scheduling: Scheduling = Field(
        "fifo", description="Which waiting prompt the engine serves first when it is saturated: `fifo`, first "
                            "come; or `largest_first`, the longest prompt (the largest group). vLLM and the "
                            "scripted engine only.")
    sleep_mode: bool = Field(
        False, description="Build the engine so that it can sleep: weights offloaded to CPU memory and KV cache "
                           "freed while idle (vLLM's enable_sleep_mode, CUDA only; the scripted engine). Set for "
                           "the replicas by `replicas.autoscaling.idle: sleep`; vllm and scripted only.")
    allow_untested_version: bool = Field(
        False, description="Start on an engine package at another version than the project is tested with "
                           "(`grrm check` and a replica's start refuse it otherwise; see "
                           "cluster/engines/versions.py).")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Passed through to the engine's own constructor (vLLM AsyncEngineArgs, "
                                          "sglang.Engine, transformers from_pretrained; for transformers "
                                          "`max_batch_size` sets its micro-batch).")
    scripted: ScriptedEngineOptions = Field(default_factory=ScriptedEngineOptions,
                                            description="Options of the scripted engine (kind `scripted`).")

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
    def _sleep_is_supported(self) -> EngineConfig:
        if "enable_sleep_mode" in self.engine_kwargs:  # the replica's sleeping follows engine.sleep_mode
            raise ValueError("engine.engine_kwargs.enable_sleep_mode: set replicas.autoscaling.idle: sleep "
                             "(or engine.sleep_mode) instead")
        if self.sleep_mode and self.kind not in SLEEP_ENGINES:
            raise ValueError(f"engine.sleep_mode: the {self.kind} engine cannot sleep (engines that can: "
                             f"{', '.join(SLEEP_ENGINES)})")
        return self

    @model_validator(mode="after")
    def _placement_is_typed(self) -> EngineConfig:
        for key, field in _TYPED_KWARGS.items():
            if key in self.engine_kwargs:
                raise ValueError(
                    f"engine.engine_kwargs.{key}: set engine.{field} instead "
                    "(the replica's devices, placement and engine slots follow from it)"
                )
        for field in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, field) is not None and self.kind not in BATCHING_ENGINES:
                raise ValueError(
                    f"engine.{field}: sizes the batch of the {' and '.join(BATCHING_ENGINES)} engines; the "
                    f"{self.kind} engine has its own setting (transformers: engine_kwargs.max_batch_size; "
                    "scripted: scripted.max_concurrent_prompts)"
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
        if self.kind == "transformers":
            value = self.engine_kwargs.get("max_batch_size")
            return int(value) if value is not None else None
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        # SGLang sizes its running batch from the memory it finds: unknown here.
        return VLLM_ENGINE_DEFAULT_MAX_NUM_SEQS if self.kind == "vllm" else None

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
