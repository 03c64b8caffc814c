"""The SGLang engine: a thin adapter over SGLang's offline engine (``sglang.Engine``).

SGLang (and torch, CUDA) exist only on GPU nodes, so ``sglang`` and ``transformers`` are
imported inside :meth:`SGLangEngine.start`; importing this module needs neither. The pure
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
  {"type": "stop" | "length" | "abort", ...}, "cached_tokens", ...}}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from cluster.engines.base import EngineError, FinishReason, Generation, SamplingSettings, Tokenizer
from cluster.engines.config import EngineConfig

__all__ = [
    "HEALTH_PROBE_TIMEOUT_S",
    "SGLangEngine",
    "generation_from_sglang_output",
    "sglang_engine_kwargs",
    "sglang_sampling_params",
]

# A health probe is one 1-token generation; it queues behind real work, hence the generous limit.
HEALTH_PROBE_TIMEOUT_S = 120.0
_HEALTH_PROBE_PROMPT = "Hello"



class _TokenizerNotReadyError(EngineError, AttributeError):
    """The tokenizer before start(). Also an AttributeError so that Python 3.11's
    ``isinstance(engine, Engine)`` (which probes attributes with ``hasattr``) does not raise."""


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


class SGLangEngine:
    """An :class:`~cluster.engines.base.Engine` over ``sglang.Engine`` (SGLang batches itself)."""

    name = "sglang"

    def __init__(self, config: EngineConfig):
        self.config = config
        self._engine: Any = None
        self._tokenizer: Tokenizer | None = None

    async def start(self) -> None:
        if self._engine is not None:
            return
        try:
            import sglang
        except ImportError as exc:
            raise EngineError(
                "SGLang is not installed: the 'sglang' engine needs the sglang package on a GPU node "
                "(pip install 'grrm-cluster[sglang]'); use kind 'vllm' or 'transformers' elsewhere"
            ) from exc
        kwargs = sglang_engine_kwargs(self.config)
        tokenizer = self._load_tokenizer()
        # sglang.Engine launches its scheduler and detokenizer processes and loads the model
        # synchronously; it installs signal handlers, so it is built on the calling thread.
        try:
            engine = sglang.Engine(**kwargs)
        except Exception as exc:
            raise EngineError(f"SGLang failed to start for model {self.config.model!r}: {exc}") from exc
        self._tokenizer = tokenizer
        self._engine = engine

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

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise _TokenizerNotReadyError("tokenizer: call start() first")
        return self._tokenizer

    def _require_engine(self) -> Any:
        if self._engine is None:
            raise EngineError("the SGLang engine is not started (or was stopped)")
        return self._engine

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings, priority: int = 0) -> list[Generation]:
        engine = self._require_engine()
        if isinstance(prompts, str):
            raise TypeError("prompts: pass a list of prompt strings, not a string")
        prompts = list(prompts)
        if not prompts:
            return []
        params = sglang_sampling_params(sampling)
        try:
            outputs = await engine.async_generate(prompt=prompts, sampling_params=[dict(params) for _ in prompts])
        except Exception as exc:
            raise EngineError(f"SGLang generation failed: {exc}") from exc
        if isinstance(outputs, Mapping):  # defensive: a single dict for a one-prompt batch
            outputs = [outputs]
        outputs = list(outputs)
        if len(outputs) != len(prompts):
            raise EngineError(f"SGLang returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [generation_from_sglang_output(output) for output in outputs]

    async def check_health(self) -> None:
        """A one-token generation must come back (SGLang's offline engine has no health call)."""
        engine = self._require_engine()
        try:
            output = await asyncio.wait_for(
                engine.async_generate(
                    prompt=_HEALTH_PROBE_PROMPT, sampling_params={"max_new_tokens": 1, "temperature": 0.0}
                ),
                timeout=HEALTH_PROBE_TIMEOUT_S,
            )
        except Exception as exc:  # TimeoutError included
            raise EngineError(f"SGLang health probe failed: {exc!r}") from exc
        if isinstance(output, list):
            output = output[0] if output else {}
        if generation_from_sglang_output(output).finish_reason == "abort":
            raise EngineError(f"SGLang health probe was aborted: {output.get('meta_info')!r:.300}")
