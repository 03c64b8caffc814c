"""The SGLang engine: a thin adapter over SGLang's offline engine (``sglang.Engine``).

SGLang (and torch, CUDA) exist only on GPU nodes, so ``sglang`` and ``transformers`` are
imported when :meth:`SGLangEngine.start` runs; importing this module needs neither. The pure
conversions are module-level functions, tested without SGLang:

* :func:`sglang_engine_kwargs`: :class:`EngineConfig` -> ``sglang.Engine(**kwargs)``
  (the keyword arguments are ``sglang.srt.server_args.ServerArgs`` fields);
* :func:`sglang_sampling_params`: :class:`SamplingSettings` -> SGLang's sampling-params dict;
* :func:`generation_from_sglang_output`: one output dict of ``Engine.async_generate`` ->
  :class:`Generation`.

SGLang API this relies on (checked against sgl-project/sglang ``python/sglang/srt/
entrypoints/engine.py``, ``server_args.py``, ``sampling/sampling_params.py`` and the
finish-reason classes' ``to_json``; the pinned version is ``sglang==0.5.23``):

* ``sglang.Engine(**server_args)``, ``await engine.async_generate(prompt=[...],
  sampling_params=[...])`` returning one dict per prompt for a list prompt, and
  ``engine.shutdown()``;
* ``ServerArgs`` fields ``model_path``, ``tokenizer_path``, ``tp_size``, ``pp_size``, ``dtype``,
  ``mem_fraction_static``, ``context_length``, ``random_seed``, ``disable_radix_cache``;
* sampling-params keys ``temperature``, ``top_p``, ``max_new_tokens``, ``stop``, ``regex`` and
  ``sampling_seed`` (SGLang documents that a per-request seed makes non-greedy sampling
  reproducible with ``enable_deterministic_inference=True``; pass that through
  ``engine_kwargs`` where reproducible sampling matters);
* output ``{"text": str, "meta_info": {"prompt_tokens", "completion_tokens", "finish_reason":
  {"type": "stop" | "length" | "abort", ...}, "cached_tokens", ...}}``;
* ``engine.get_all_child_pids()`` (the scheduler, or data-parallel controller and its schedulers,
  and the detokenizer processes) and ``engine.tokenizer_manager``, whose ``async
  get_internal_state()`` and ``gracefully_exit`` the health checks use (:meth:`SGLangEngine.check_health`).

Threads (checked in SGLang 0.5.23's ``entrypoints/engine.py``, ``managers/scheduler.py`` and
``managers/detokenizer_manager.py``): the constructor returns once the model is loaded (minutes for a
7B), so it runs off the event loop, on a thread of the engine's own that lives until
:meth:`SGLangEngine.stop`, not on a shared pool's (``asyncio.to_thread``), whose threads are not
ours to keep: the scheduler and detokenizer processes ask for SIGKILL when their parent ends
(``kill_itself_when_parent_died``, Linux's PR_SET_PDEATHSIG), and Linux takes as that parent the
*thread* that started them. Signal handlers do not tie the constructor to the calling thread:
``_set_envs_and_config`` installs its SIGQUIT handler (``launch_phase_sigquit_handler``, which kills
this process and its children) only on the main thread, and a Ray async actor's event loop never
runs there (Ray 2.60: the thread "AsyncIO Thread: default"; Serve's user code: a thread of its
own), so it is skipped either way. SIGQUIT then keeps its default action: when a child fails, the
child or SGLang's ``SubprocessWatchdog`` (within a second) sends this process SIGQUIT, which ends
the replica's process at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cluster.engines.base import EngineDeadError, EngineError, FinishReason, Generation, SamplingSettings, Tokenizer
from cluster.engines.config import EngineConfig
from cluster.engines.lifecycle import EngineBase

__all__ = [
    "HEALTH_PROBE_TIMEOUT_S",
    "LIVENESS_POLL_S",
    "SGLangEngine",
    "generation_from_sglang_output",
    "sglang_engine_kwargs",
    "sglang_sampling_params",
]

# A health probe is a round trip to the scheduler, answered between two scheduler steps.
HEALTH_PROBE_TIMEOUT_S = 30.0
# How often a call waiting on SGLang looks whether SGLang's processes still live: an engine request
# waits without a limit for a scheduler that died (TokenizerManager._stream_one_response).
LIVENESS_POLL_S = 1.0

_T = TypeVar("_T")

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def sglang_engine_kwargs(config: EngineConfig) -> dict[str, Any]:
    """Keyword arguments for ``sglang.Engine`` (``ServerArgs`` fields) from an engine config.

    ``config.engine_kwargs`` is applied last, so it overrides anything derived here.
    ``gpu_memory_utilization`` maps to SGLang's ``mem_fraction_static`` (the fraction of GPU
    memory for weights plus KV cache pool; SGLang keeps the rest for activations).
    """
    if not config.model:
        raise EngineError("model: the SGLang engine needs a model path or Hugging Face id (got '')")
    kwargs: dict[str, Any] = {
        "model_path": config.model,
        "tp_size": config.tensor_parallel_size,
        "dtype": config.dtype,
        "mem_fraction_static": config.gpu_memory_utilization,
        "random_seed": config.seed,
        "disable_radix_cache": not config.enable_prefix_caching,
    }
    if config.pipeline_parallel_size > 1:
        kwargs["pp_size"] = config.pipeline_parallel_size
    if config.tokenizer:
        kwargs["tokenizer_path"] = config.tokenizer
    if config.max_model_len is not None:
        kwargs["context_length"] = config.max_model_len
    # The batch, under SGLang's names (0.5.23: srt/arg_groups/fields/schedule.py).
    if config.max_num_seqs is not None:
        kwargs["max_running_requests"] = config.max_num_seqs
    if config.max_num_batched_tokens is not None:
        kwargs["chunked_prefill_size"] = config.max_num_batched_tokens
    kwargs.update(config.engine_kwargs)
    return kwargs


def sglang_sampling_params(settings: SamplingSettings) -> dict[str, Any]:
    """SGLang's sampling-params dict for one request (temperature 0 is greedy in SGLang)."""
    params: dict[str, Any] = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_new_tokens": settings.max_tokens,
    }
    if settings.stop:
        params["stop"] = list(settings.stop)
    if settings.regex is not None:
        params["regex"] = settings.regex
    if settings.seed is not None:
        params["sampling_seed"] = settings.seed
    if settings.ignore_eos:
        params["ignore_eos"] = True
    return params


def _finish_reason(raw: Any) -> tuple[FinishReason, dict[str, Any]]:
    """SGLang's finish reason (a dict with ``type``; a bare string is tolerated) -> ours."""
    if raw is None:
        # Not finished: only a streamed chunk looks like this; treat it as cut off.
        return "abort", {"finish_detail": None}
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        detail = dict(raw)
    elif isinstance(raw, str):
        kind, detail = raw, {"type": raw}
    else:
        raise EngineError(f"SGLang output: unexpected finish_reason {raw!r}")
    if kind not in _FINISH_REASONS:
        raise EngineError(f"SGLang output: unknown finish_reason type {kind!r}")
    return _FINISH_REASONS[kind], {"finish_detail": detail}


def generation_from_sglang_output(output: Mapping[str, Any]) -> Generation:
    """One ``async_generate`` output dict -> :class:`Generation`.

    ``extra`` keeps SGLang's finish detail (the matched stop, or an abort's message) and, when
    reported, ``cached_tokens`` (prompt tokens served from the radix cache).
    """
    try:
        text = output["text"]
        meta = output["meta_info"]
        prompt_tokens = int(meta["prompt_tokens"])
        completion_tokens = int(meta["completion_tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"SGLang output: missing or malformed field ({exc!r}) in {output!r:.300}") from exc
    if not isinstance(text, str):
        raise EngineError(f"SGLang output: text must be a string, not {type(text).__name__}")
    finish_reason, extra = _finish_reason(meta.get("finish_reason"))
    if meta.get("cached_tokens") is not None:
        extra["cached_tokens"] = int(meta["cached_tokens"])
    return Generation(
        text=text,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
        extra=extra,
    )


def _start_sglang(kwargs: dict[str, Any], load_tokenizer: Callable[[], Tokenizer]) -> tuple[Any, list[Any], Tokenizer]:
    """Import SGLang, load the tokenizer, build ``sglang.Engine(**kwargs)`` and find its child
    processes (``psutil.Process``, which tells a recycled pid apart); runs on the engine's own
    thread (see the module docstring)."""
    try:
        import sglang
    except ImportError as exc:
        raise EngineError(
            "SGLang is not installed: the 'sglang' engine needs the sglang package on a GPU node "
            "(pip install 'grrm-cluster[sglang]'); use kind 'vllm' or 'transformers' elsewhere"
        ) from exc
    import psutil  # a dependency of SGLang

    tokenizer = load_tokenizer()  # first: a wrong path fails in seconds, not after the model loaded
    engine = sglang.Engine(**kwargs)
    try:
        return engine, [psutil.Process(pid) for pid in engine.get_all_child_pids()], tokenizer
    except Exception:  # a child gone already: this engine cannot serve
        engine.shutdown()
        raise


def _shutdown_if_built(build: concurrent.futures.Future[tuple[Any, list[Any], Tokenizer]]) -> None:
    """Shut down the engine of a start that was cancelled while SGLang loaded."""
    if not build.cancelled() and build.exception() is None:
        build.result()[0].shutdown()


@dataclass
class _Started:
    """A started ``sglang.Engine``, the thread that owns it, and its processes (``psutil.Process``)."""

    engine: Any
    owner: concurrent.futures.ThreadPoolExecutor
    children: list[Any]

    def raise_if_dead(self, cause: BaseException | None = None) -> None:
        """Raise :class:`EngineDeadError` when SGLang can serve nothing more: one of its processes
        ended (a zombie not yet reaped included), or its tokenizer manager is exiting
        (``gracefully_exit``: set on SIGTERM, after which it drains and shuts the schedulers down)."""
        import psutil

        reason = None
        for child in self.children:
            try:
                alive = child.is_running() and child.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                alive = False
            if not alive:
                reason = f"its process {child.pid} (scheduler or detokenizer) is gone"
                break
        if reason is None and getattr(self.engine.tokenizer_manager, "gracefully_exit", False):
            reason = "its tokenizer manager is exiting (gracefully_exit)"
        if reason is not None:
            detail = f" ({cause!r})" if cause is not None else ""
            raise EngineDeadError(f"the SGLang engine is dead: {reason}{detail}") from cause

    async def while_alive(self, call: Awaitable[_T]) -> _T:
        """Await a call to SGLang, or raise :class:`EngineDeadError` once SGLang's processes are
        gone: SGLang's own request would wait for a dead scheduler forever."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=LIVENESS_POLL_S)
                if done:
                    return task.result()
                self.raise_if_dead()
        finally:
            task.cancel()  # a no-op once done


class SGLangEngine(EngineBase):
    """An :class:`~cluster.engines.base.Engine` over ``sglang.Engine`` (SGLang batches itself)."""

    name = "sglang"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._running: _Started | None = None

    async def _start(self) -> None:
        """Load the tokenizer and build ``sglang.Engine`` on a thread of the engine's own (the event
        loop serves on meanwhile)."""
        kwargs = sglang_engine_kwargs(self.config)
        # One worker thread, kept until owner.shutdown(): the parent of SGLang's processes.
        owner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang-engine")
        build = owner.submit(_start_sglang, kwargs, self._load_tokenizer)
        try:
            engine, children, tokenizer = await asyncio.wrap_future(build)
        except BaseException as exc:
            # A cancelled start shuts its engine down once the constructor returns; then the owner
            # thread ends, and with it any process that a failed constructor left running.
            owner.submit(_shutdown_if_built, build)
            owner.shutdown(wait=False)
            if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                raise EngineError(f"SGLang failed to start for model {self.config.model!r}: {exc}") from exc
            raise
        self._tokenizer = tokenizer
        self._running = _Started(engine, owner, children)

    def _load_tokenizer(self) -> Tokenizer:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise EngineError("the SGLang engine needs transformers for its tokenizer") from exc
        path = self.config.tokenizer or self.config.model
        try:
            return AutoTokenizer.from_pretrained(
                path, trust_remote_code=bool(self.config.engine_kwargs.get("trust_remote_code", False))
            )
        except Exception as exc:
            raise EngineError(f"could not load the tokenizer {path!r}: {exc}") from exc

    async def _stop(self) -> None:
        """Shut SGLang down off the event loop, on the thread that started it."""
        started, self._running = self._running, None
        if started is None:
            return
        try:
            # Engine.shutdown() SIGKILLs every descendant of this process (kill_process_tree) and
            # waits up to 60 s for them; on the owner thread, which may end only after that.
            await asyncio.get_running_loop().run_in_executor(started.owner, started.engine.shutdown)
        finally:
            started.owner.shutdown(wait=False)

    def _require_running(self) -> _Started:
        """The started SGLang engine; :class:`EngineError` unless started."""
        self._require_started()
        assert self._running is not None  # set whenever started
        return self._running

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings, priority: int = 0) -> list[Generation]:
        started = self._require_running()
        if isinstance(prompts, str):
            raise TypeError("prompts: pass a list of prompt strings, not a string")
        prompts = list(prompts)
        if not prompts:
            return []
        started.raise_if_dead()
        params = sglang_sampling_params(sampling)
        try:
            outputs = await started.while_alive(
                started.engine.async_generate(prompt=prompts, sampling_params=[dict(params) for _ in prompts])
            )
        except EngineDeadError:
            raise
        except Exception as exc:
            started.raise_if_dead(exc)
            raise EngineError(f"SGLang generation failed: {exc}") from exc
        if isinstance(outputs, Mapping):  # defensive: a single dict for a one-prompt batch
            outputs = [outputs]
        outputs = list(outputs)
        if len(outputs) != len(prompts):
            raise EngineError(f"SGLang returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [generation_from_sglang_output(output) for output in outputs]

    async def check_health(self) -> None:
        """Raise :class:`EngineDeadError` when SGLang's scheduler or detokenizer process is gone or
        the scheduler does not answer a round trip.

        The round trip is ``tokenizer_manager.get_internal_state()``: the scheduler answers such
        control requests as it takes in new input, before each batch it runs
        (``Scheduler.event_loop_normal``/``event_loop_overlap`` -> ``ingest_requests`` ->
        ``process_input_requests``), so a probe waits at most one scheduler step, never behind the
        generations queued. Its answer does not pass the detokenizer, hence the process check too.
        """
        started = self._require_running()
        started.raise_if_dead()
        try:
            await asyncio.wait_for(
                started.while_alive(started.engine.tokenizer_manager.get_internal_state()), HEALTH_PROBE_TIMEOUT_S
            )
        except EngineDeadError:
            raise
        except Exception as exc:  # TimeoutError included
            raise EngineDeadError(f"SGLang's scheduler did not answer a health probe: {exc!r}") from exc
