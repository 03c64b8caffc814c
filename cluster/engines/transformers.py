"""The plain Hugging Face engine: ``model.generate`` behind the :class:`~cluster.engines.base.Engine` interface.

It runs anywhere torch runs (a CPU included), which makes it the reference engine for tests and the
fallback where vLLM cannot run. Throughput is far below vLLM's: there is no paged KV cache and no
continuous batching, only a micro-batcher.

Batching: every prompt becomes a row in a queue. One worker task takes up to ``max_batch_size``
rows at a time (whatever has arrived from any number of concurrent :meth:`generate` calls, with any
sampling settings) and runs one ``generate`` over them in a worker thread; rows that arrive
meanwhile form the next batch. All settings are applied per row, so rows never need to match:

- greedy rows take the arg-max (``generate`` runs with ``do_sample=False``); sampled rows are drawn
  by :class:`_RowSampler` with temperature and top-p and a per-row ``torch.Generator`` seeded
  from ``sampling.seed``, so a seeded row's output does not depend on its batch-mates (up to
  floating-point noise from padding);
- regex constraints are enforced per row with xgrammar (:class:`_GrammarProcessor`);
- :class:`_FinishTracker` ends each row on its own eos, stop string, ``max_tokens`` or abort, and
  records why, which gives exact token counts and finish reasons.

``engine_kwargs``: ``max_batch_size`` (default 32) is the engine's own; everything else goes to
``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.engines.base import (
    EngineError,
    EngineUnsupportedError,
    FinishReason,
    Generation,
    SamplingSettings,
    Tokenizer,
)
from cluster.engines.config import EngineConfig

logger = logging.getLogger(__name__)

__all__ = ["TransformersEngine", "xgrammar_available"]

DEFAULT_MAX_BATCH_SIZE = 32


def xgrammar_available() -> bool:
    """Whether regex constraints can be honoured (the ``xgrammar`` package imports)."""
    try:
        import xgrammar  # noqa: F401
    except Exception:  # ImportError, or a broken native extension
        return False
    return True


@dataclass(eq=False)
class _Row:
    """One prompt waiting for (or in) a batch."""

    prompt: str
    sampling: SamplingSettings
    seed: int
    future: asyncio.Future[Generation]
    # Set from the event loop when the caller goes away; read by the worker thread.
    aborted: bool = False


@dataclass
class _Finish:
    reason: FinishReason
    tokens: int  # generated tokens that count (the eos token included, fill-in padding not)
    stop_reason: str | int | None = None


@dataclass(eq=False)
class _FinishTracker:
    """A stopping criterion that ends each row on its own terms and records how it ended."""

    prompt_width: int
    limits: list[int]
    eos_ids: frozenset[int]
    stops: list[tuple[str, ...]]
    rows: list[_Row]
    closing: Callable[[], bool]
    decode: Callable[[list[int]], str]
    finish: list[_Finish | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.finish = [None] * len(self.limits)
        # Enough trailing tokens to contain any stop string (each token decodes to >= 1 byte, and a
        # character is at most 4 bytes, hence the margin).
        self._windows = [max((len(s.encode()) for s in stops), default=0) + 4 for stops in self.stops]

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        step = input_ids.shape[1] - self.prompt_width
        last = input_ids[:, -1].tolist()
        closing = self.closing()
        for i, finish in enumerate(self.finish):
            if finish is not None:
                continue
            if closing or self.rows[i].aborted:
                self.finish[i] = _Finish("abort", step)
            elif last[i] in self.eos_ids:
                self.finish[i] = _Finish("stop", step, last[i])
            elif self.stops[i] and (hit := self._stop_hit(input_ids, i, step)) is not None:
                self.finish[i] = _Finish("stop", step, hit)
            elif step >= self.limits[i]:
                self.finish[i] = _Finish("length", step)
        return torch.tensor([f is not None for f in self.finish], dtype=torch.bool, device=input_ids.device)

    def _stop_hit(self, input_ids: Any, i: int, step: int) -> str | None:
        window = min(step, self._windows[i])
        tail = self.decode(input_ids[i, input_ids.shape[1] - window :].tolist())
        return next((s for s in self.stops[i] if s in tail), None)


class _RowSampler:
    """Samples sampled rows (temperature > 0) itself and leaves a one-hot for the arg-max.

    ``generate`` runs greedy; for each sampled row this processor applies temperature and top-p,
    draws from the row's own generator and masks every other token, so greedy decoding picks the
    drawn token. Greedy rows pass through untouched.
    """

    def __init__(self, rows: list[_Row], device: Any, tracker: _FinishTracker):
        import torch

        self.tracker = tracker
        self.sampled = [i for i, row in enumerate(rows) if row.sampling.temperature > 0]
        self.temperature = {i: rows[i].sampling.temperature for i in self.sampled}
        self.top_p = {i: rows[i].sampling.top_p for i in self.sampled}
        self.generators = {
            i: torch.Generator(device=device).manual_seed(rows[i].seed) for i in self.sampled
        }

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        for i in self.sampled:
            if self.tracker.finish[i] is not None:
                continue
            logits = scores[i].float() / self.temperature[i]
            if not torch.isfinite(logits).any():
                continue
            probs = torch.softmax(logits, dim=-1)
            top_p = self.top_p[i]
            if top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                # Keep the smallest prefix whose mass reaches top_p (always at least one token).
                drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            token = int(torch.multinomial(probs, 1, generator=self.generators[i]).item())
            scores[i].fill_(float("-inf"))
            scores[i, token] = 0.0
        return scores


class _GrammarProcessor:
    """Masks each constrained row's logits to the tokens its xgrammar matcher allows next."""

    def __init__(self, grammars: list[Any | None], vocab_size: int):
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab_size = vocab_size
        self.matchers = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]
        self.bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        xgr = self.xgr
        if self.started:
            last = input_ids[:, -1].tolist()
            for i, matcher in enumerate(self.matchers):
                if matcher is not None and not matcher.is_terminated():
                    # A row that ended another way (stop string, length, abort) is fed padding
                    # that the grammar rejects: stop following it.
                    if not matcher.accept_token(last[i]):
                        self.matchers[i] = None
        self.started = True
        xgr.reset_token_bitmask(self.bitmask)
        indices = []
        for i, matcher in enumerate(self.matchers):
            if matcher is not None and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.bitmask, i)
                indices.append(i)
        if indices:
            xgr.apply_token_bitmask_inplace(
                scores, self.bitmask.to(scores.device), vocab_size=self.vocab_size, indices=indices
            )
        return scores


class TransformersEngine:
    """Hugging Face ``transformers`` generation with a micro-batcher (see the module docstring)."""

    name = "transformers"

    def __init__(self, config: EngineConfig):
        self.config = config
        model_kwargs = dict(config.engine_kwargs)
        self.max_batch_size = int(model_kwargs.pop("max_batch_size", DEFAULT_MAX_BATCH_SIZE))
        if self.max_batch_size < 1:
            raise ValueError(f"engine_kwargs.max_batch_size: must be >= 1 (got {self.max_batch_size})")
        self._model_kwargs = model_kwargs
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: Any = None
        self._eos_ids: frozenset[int] = frozenset()
        self._pad_id: int = 0
        self._vocab_size: int = 0
        self._max_model_len: int | None = None
        self._grammar_compiler: Any = None
        self._grammar_lock = threading.Lock()
        self._seeds = random.Random(config.seed)  # seeds for rows without one: reproducible per engine
        self._pending: deque[_Row] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closing = False
        # Serializes start/stop (an asyncio.Lock binds to the loop of its first use).
        self._lifecycle_lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._lifecycle_lock:
            if self._model is not None:
                return
            if not self.config.model:
                raise EngineError("config.model: a model directory or hub id is required")
            try:
                await asyncio.to_thread(self._load)
            except EngineError:
                raise
            except Exception as exc:
                raise EngineError(f"transformers could not load {self.config.model!r}: {exc}") from exc
            self._closing = False
            self._wakeup = asyncio.Event()
            self._worker = asyncio.create_task(self._run(), name=f"{self.name}-engine-worker")

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        config = self.config
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
        kwargs = {"dtype": config.dtype, **self._model_kwargs}
        model = AutoModelForCausalLM.from_pretrained(config.model, **kwargs)
        if "device_map" not in kwargs:  # a device map places the model itself
            model.to(device)
        model.eval()
        device = str(model.device)

        generation_config = model.generation_config
        eos: set[int] = set()
        for value in (generation_config.eos_token_id, tokenizer.eos_token_id):
            if value is not None:
                eos.update(value if isinstance(value, (list, tuple)) else [value])
        if not eos:
            raise EngineError(f"{config.model}: neither the tokenizer nor the generation config names an eos token")
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = generation_config.pad_token_id
        if isinstance(pad, (list, tuple)):
            pad = pad[0] if pad else None
        if pad is None:
            pad = min(eos)
        # Our settings are the only ones: none of the checkpoint's sampling defaults (Qwen ships
        # top_k, repetition_penalty, ...) may leak into generate, as vLLM ignores them too.
        model.generation_config = GenerationConfig(
            eos_token_id=sorted(eos), pad_token_id=pad, bos_token_id=generation_config.bos_token_id
        )
        output_embeddings = model.get_output_embeddings()
        vocab_size = (
            output_embeddings.weight.shape[0] if output_embeddings is not None else model.config.vocab_size
        )
        max_len = config.max_model_len or getattr(model.config, "max_position_embeddings", None)

        self._model, self._tokenizer, self._device = model, tokenizer, torch.device(device)
        self._eos_ids, self._pad_id, self._vocab_size = frozenset(eos), int(pad), int(vocab_size)
        self._max_model_len = int(max_len) if max_len else None
        self._grammar_compiler = None
        logger.info("transformers engine: loaded %s on %s (vocab %d)", config.model, device, vocab_size)

    async def stop(self) -> None:
        async with self._lifecycle_lock:
            if self._model is None and self._worker is None:
                return
            self._closing = True  # in-flight rows end at their next token as "abort"
            worker, self._worker = self._worker, None
            if worker is not None:
                if self._wakeup is not None:
                    self._wakeup.set()
                await asyncio.wait([worker])  # its batch in flight ends at the next token
                if not worker.cancelled() and worker.exception() is not None:
                    logger.warning("transformers engine: worker had died: %r", worker.exception())
            self._fail_pending(EngineError("engine stopped"))
            self._model = self._tokenizer = self._grammar_compiler = None
            await asyncio.to_thread(self._free_memory)

    @staticmethod
    def _free_memory() -> None:
        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _fail_pending(self, error: EngineError) -> None:
        while self._pending:
            row = self._pending.popleft()
            if not row.future.done():
                row.future.set_exception(error)

    # -- interface -------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise EngineError("the engine is not started")
        return self._tokenizer

    async def check_health(self) -> None:
        if self._model is None or self._worker is None:
            raise EngineError("the engine is not started")
        if self._worker.done():
            error = None if self._worker.cancelled() else self._worker.exception()
            raise EngineError(f"the engine's worker stopped: {error!r}")

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings) -> list[Generation]:
        if isinstance(prompts, str):
            raise TypeError("prompts: a sequence of strings, not a single string")
        if not prompts:
            return []
        await self.check_health()
        if sampling.regex is not None and not xgrammar_available():
            raise EngineUnsupportedError(
                "regex constraints (SamplingSettings.regex) need the xgrammar package, which does not import here"
            )
        loop = asyncio.get_running_loop()
        rows = []
        for prompt in prompts:
            seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)
            rows.append(_Row(prompt, sampling, seed, loop.create_future()))
        self._pending.extend(rows)
        assert self._wakeup is not None
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*(row.future for row in rows)))
        except BaseException:
            for row in rows:  # cancelled, or one row failed: nobody waits for the others any more
                row.aborted = True
                if not row.future.done():
                    row.future.cancel()
            raise

    # -- the worker ------------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wakeup is not None
        while not self._closing:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending and not self._closing:
                batch: list[_Row] = []
                while self._pending and len(batch) < self.max_batch_size:
                    row = self._pending.popleft()
                    if not (row.aborted or row.future.done()):
                        batch.append(row)
                if not batch:
                    continue
                try:
                    results = await asyncio.to_thread(self._generate_batch, batch)
                except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
                    logger.exception("transformers engine: generate failed")
                    error = exc if isinstance(exc, EngineError) else EngineError(f"generate failed: {exc!r}")
                    results = [error] * len(batch)
                for row, result in zip(batch, results):
                    if row.future.done():
                        continue
                    if isinstance(result, BaseException):
                        row.future.set_exception(result)
                    else:
                        row.future.set_result(result)

    def _compile_grammar(self, regex: str) -> Any:
        import xgrammar as xgr

        with self._grammar_lock:
            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=sorted(self._eos_ids)
                )
                self._grammar_compiler = xgr.GrammarCompiler(info)  # caches compiled grammars
            return self._grammar_compiler.compile_regex(regex)

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    def _generate_batch(self, batch: list[_Row]) -> list[Generation | EngineError]:
        """Runs in a worker thread: one ``generate`` over the valid rows of ``batch``."""
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        tokenizer, model = self._tokenizer, self._model
        results: list[Generation | EngineError | None] = [None] * len(batch)
        rows: list[_Row] = []
        encoded: list[list[int]] = []
        grammars: list[Any | None] = []
        limits: list[int] = []
        for index, row in enumerate(batch):
            # Plain encode without padding/truncation options never mutates the shared tokenizer,
            # so the scorer may use engine.tokenizer concurrently.
            ids = tokenizer.encode(row.prompt, add_special_tokens=False)
            if not ids:
                results[index] = EngineError("prompt: empty (no tokens)")
                continue
            limit = row.sampling.max_tokens
            if self._max_model_len is not None:
                if len(ids) >= self._max_model_len:
                    results[index] = EngineError(
                        f"prompt: {len(ids)} tokens, the model's context is {self._max_model_len} tokens"
                    )
                    continue
                limit = min(limit, self._max_model_len - len(ids))
            grammar = None
            if row.sampling.regex is not None:
                try:
                    grammar = self._compile_grammar(row.sampling.regex)
                except Exception as exc:  # noqa: BLE001 - a bad constraint fails its own row only
                    results[index] = EngineError(f"regex: cannot compile {row.sampling.regex!r}: {exc}")
                    continue
            rows.append(row)
            encoded.append(ids)
            grammars.append(grammar)
            limits.append(limit)

        if rows:
            width = max(len(ids) for ids in encoded)
            input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, ids in enumerate(encoded):  # left padding
                input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[i, width - len(ids) :] = 1
            tracker = _FinishTracker(
                prompt_width=width,
                limits=limits,
                eos_ids=self._eos_ids,
                stops=[tuple(s for s in row.sampling.stop if s) for row in rows],
                rows=rows,
                closing=lambda: self._closing,
                decode=self._decode,
            )
            processors = LogitsProcessorList()
            if any(g is not None for g in grammars):
                processors.append(_GrammarProcessor(grammars, self._vocab_size))
            if any(row.sampling.temperature > 0 for row in rows):
                processors.append(_RowSampler(rows, self._device, tracker))
            with torch.inference_mode():
                output = model.generate(
                    input_ids=input_ids.to(self._device),
                    attention_mask=attention_mask.to(self._device),
                    max_new_tokens=max(limits),
                    do_sample=False,
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([tracker]),
                    pad_token_id=self._pad_id,
                    eos_token_id=sorted(self._eos_ids),
                )
            generated = output[:, width:].tolist()
            done = iter(range(len(rows)))
            for index in range(len(batch)):
                if results[index] is not None:
                    continue
                i = next(done)
                finish = tracker.finish[i] or _Finish("length", len(generated[i]))
                results[index] = self._make_generation(
                    rows[i], len(encoded[i]), generated[i][: finish.tokens], finish
                )
        return results  # type: ignore[return-value]

    def _make_generation(self, row: _Row, prompt_tokens: int, token_ids: list[int], finish: _Finish) -> Generation:
        text = self._decode(token_ids)
        reason = finish.reason
        stop_reason = finish.stop_reason
        hits = [(text.find(s), s) for s in row.sampling.stop if s and s in text]
        if hits:  # like vLLM: the text ends before the first stop string, which is left out
            position, stop_reason = min(hits)
            text = text[:position]
            reason = "stop"
        extra = {} if stop_reason is None else {"stop_reason": stop_reason}
        return Generation(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(token_ids),
            finish_reason=reason,
            extra=extra,
        )
