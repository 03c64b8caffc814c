"""The plain Hugging Face engine: ``model.generate`` behind the :class:`~cluster.engines.base.Engine` interface.

It runs anywhere torch runs (a CPU included), which makes it the reference engine for tests and the
fallback where vLLM cannot run. Throughput is far below vLLM's: there is no paged KV cache and no
continuous batching, only a micro-batcher.

Batching: every prompt becomes a row in a queue. One worker task takes up to ``max_batch_size``
rows at a time (whatever has arrived from any number of concurrent :meth:`generate` calls, with any
sampling settings) and runs one ``generate`` over them in a worker thread; rows that arrive
meanwhile form the next batch. All settings are applied per row, so rows never need to match:

- greedy rows take the arg-max (``generate`` runs with ``do_sample=False``); sampled rows are drawn
  by :class:`_RowSampler` with temperature and top-p from per-row random streams seeded from
  ``sampling.seed``, so a seeded row's output does not depend on its batch-mates (up to
  floating-point noise from padding);
- regex constraints are enforced per row with xgrammar (:class:`_GrammarProcessor`);
- :class:`_FinishTracker` ends each row on its own eos (unless ``ignore_eos``), stop string,
  ``max_tokens`` or abort, and records why, which gives exact token counts and finish reasons.

Per step, sampling and finishing are whole-batch tensor operations on the model's device, with no
per-row Python and no device synchronisation of their own (``generate`` itself reads one flag per
step); only regex rows (xgrammar runs on the host) and stop strings (decoded every
:data:`STOP_CHECK_INTERVAL` steps) need tokens on the host. Attention is SDPA with backends chosen
per device (:func:`attention_backends`): on CUDA never cuDNN, which re-plans for every new batch
shape.

``engine_kwargs``: ``max_batch_size`` (default 32) is the engine's own; everything else goes to
``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.engines.base import EngineError, EngineUnsupportedError, FinishReason, Generation, SamplingSettings
from cluster.engines.config import EngineConfig
from cluster.engines.lifecycle import EngineBase

logger = logging.getLogger(__name__)

__all__ = ["TransformersEngine", "attention_backends", "attention_context", "xgrammar_available"]

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


def attention_backends(device_type: str) -> tuple[str, ...]:
    """The scaled-dot-product-attention backends ``generate`` may use on ``device_type``: names of
    ``torch.nn.attention.SDPBackend`` members, or ``()`` for torch's own choice.

    On CUDA, cuDNN attention is left out. With the mask that left padding needs, torch picks it in
    bf16, and it plans anew for every new batch shape: seconds per batch when every batch brings new
    shapes, as a service's batches do. Flash attention then serves unmasked calls, memory-efficient
    attention masked ones (left padding), math the rest. On CPU the choice is what the CPU has (flash
    and math), named so that the CPU runs the same selection code. Other devices: torch's choice.
    """
    if device_type == "cuda":
        return ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    if device_type == "cpu":
        return ("FLASH_ATTENTION", "MATH")
    return ()


def attention_context(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """A context in which SDPA uses only :func:`attention_backends` (torch's flags are process-wide:
    the engine runs one ``generate`` at a time, and the flags are restored afterwards)."""
    names = attention_backends(device_type)
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in names])


# Why a row ended (codes in the tracker's device tensor; 0 = still running).
_RUNNING, _ABORT, _EOS, _LENGTH, _STOP = 0, 1, 2, 3, 4
_REASONS: dict[int, FinishReason] = {_ABORT: "abort", _EOS: "stop", _LENGTH: "length", _STOP: "stop"}
# Stop strings are looked for every this many steps (and when generate ends), not at every step:
# decoding costs host time per row. A hit is placed at the exact token that completed the string,
# so texts and token counts are as with a check at every step; a row with a stop string may run
# up to this many steps longer than needed, tokens that are then dropped.
STOP_CHECK_INTERVAL = 8


@dataclass
class _Finish:
    reason: FinishReason
    tokens: int  # generated tokens that count (the eos token included, fill-in padding not)
    stop_reason: str | int | None = None


class _FinishTracker:
    """A stopping criterion that ends each row on its own terms and records how it ended.

    Its state lives on the model's device and each step is a few whole-batch tensor operations: no
    per-row Python and no device synchronisation, except for rows with stop strings (decoded on the
    host every :data:`STOP_CHECK_INTERVAL` steps). Precedence within one step: abort, eos, stop
    string, ``max_tokens``. ``generate`` gets no eos of its own: this tracker is the only judge, so a
    row with ``ignore_eos`` runs on past its eos tokens.
    """

    def __init__(
        self,
        *,
        prompt_width: int,
        limits: list[int],
        eos_ids: frozenset[int],
        rows: list[_Row],
        closing: Callable[[], bool],
        aborts: Callable[[], int],
        decode: Callable[[list[int]], str],
        device: Any,
    ):
        import torch

        self.prompt_width = prompt_width
        self.rows = rows
        self.closing = closing
        self.aborts = aborts
        self.decode = decode
        self.device = device
        size = len(rows)
        self.limits = torch.tensor(limits, dtype=torch.long, device=device)
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
        self.checks_eos = torch.tensor([not row.sampling.ignore_eos for row in rows], dtype=torch.bool, device=device)
        self.reason = torch.zeros(size, dtype=torch.uint8, device=device)
        self.ended_at = torch.zeros(size, dtype=torch.long, device=device)
        self.finished = torch.zeros(size, dtype=torch.bool, device=device)
        self._aborted: Any = None  # device mask of aborted rows, rebuilt when the abort count moves
        self._aborts_seen = aborts()
        # Stop strings: the rows that have some, how far back a hit can start, hits found.
        self.stops = [tuple(s for s in row.sampling.stop if s) for row in rows]
        self.stop_rows = [i for i, stops in enumerate(self.stops) if stops]
        # Enough trailing tokens to contain any stop string (each token decodes to >= 1 byte, and a
        # character is at most 4 bytes, hence the margin).
        self._windows = [max((len(s.encode()) for s in stops), default=0) + 4 for stops in self.stops]
        self.stop_hits: dict[int, str] = {}
        self._stops_checked = 0  # steps up to this one are checked for stop strings

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        step = input_ids.shape[1] - self.prompt_width
        code = torch.where(self.checks_eos & torch.isin(input_ids[:, -1], self.eos), _EOS, _RUNNING)
        code = torch.where((code == _RUNNING) & (self.limits <= step), _LENGTH, code)
        aborted = self._aborted_rows()
        if aborted is not None:
            code = torch.where(aborted, _ABORT, code)
        self._record(code.to(torch.uint8), step)
        if self.stop_rows and (step % STOP_CHECK_INTERVAL == 0):
            self.check_stops(input_ids)
        return self.finished.clone()

    def _record(self, code: Any, step: int) -> None:
        import torch

        new = ~self.finished & (code != _RUNNING)
        self.reason = torch.where(new, code, self.reason)
        self.ended_at = torch.where(new, step, self.ended_at)
        self.finished |= new

    def _aborted_rows(self) -> Any:
        import torch

        if self.closing():
            return torch.ones_like(self.finished)
        count = self.aborts()
        if count != self._aborts_seen:  # some call went away: which of ours?
            self._aborts_seen = count
            mask = [row.aborted for row in self.rows]
            self._aborted = torch.tensor(mask, dtype=torch.bool, device=self.device) if any(mask) else None
        return self._aborted

    def check_stops(self, input_ids: Any) -> None:
        """Look for stop strings in the steps not checked yet (host work, one transfer)."""
        step = input_ids.shape[1] - self.prompt_width
        first = self._stops_checked + 1
        rows = [i for i in self.stop_rows if i not in self.stop_hits]
        if first > step or not rows:
            return
        self._stops_checked = step
        start = max(0, first - max(self._windows[i] for i in rows))  # first generated index a window needs
        tails = input_ids[rows, self.prompt_width + start :].tolist()
        ended = self.ended_at[rows].tolist()
        reasons = self.reason[rows].tolist()
        for i, tail, ended_at, reason in zip(rows, tails, ended, reasons):
            last = step if ended_at == 0 else min(step, ended_at)
            if last < first:
                continue
            hit = self._first_stop(i, tail, start, first, last)
            if hit is None:
                continue
            at, stop = hit
            if ended_at == 0 or at < ended_at or (at == ended_at and reason == _LENGTH):
                self.stop_hits[i] = stop
                self.reason[i] = _STOP
                self.ended_at[i] = at
                self.finished[i] = True

    def _first_stop(self, i: int, tail: list[int], start: int, first: int, last: int) -> tuple[int, str] | None:
        """The first step in ``first..last`` whose trailing window holds a stop string of row ``i``.

        ``tail[k]`` is generated token ``start + k``; the window ending at step ``e`` is the last
        ``min(e, window)`` tokens up to generated index ``e - 1``.
        """
        window = self._windows[i]
        stops = self.stops[i]
        coarse = self.decode(tail[max(0, first - window) - start : last - start])
        if not any(s in coarse for s in stops):
            return None  # one decode per row and check, in the common case
        for at in range(first, last + 1):
            text = self.decode(tail[at - min(at, window) - start : at - start])
            stop = next((s for s in stops if s in text), None)
            if stop is not None:
                return at, stop
        return None

    def finishes(self, output_ids: Any, generated: list[list[int]]) -> list[_Finish]:
        """Each row's end once ``generate`` returned ``output_ids`` (``generated``: its new tokens on
        the host); the steps since the last stop-string check are checked first."""
        self.check_stops(output_ids)
        finishes = []
        for i, (reason, ended_at) in enumerate(zip(self.reason.tolist(), self.ended_at.tolist())):
            if reason == _RUNNING:  # generate stopped first (it cannot: its limit is the largest row's)
                finishes.append(_Finish("length", len(generated[i])))
                continue
            stop_reason: str | int | None = None
            if reason == _EOS:
                stop_reason = generated[i][ended_at - 1]
            elif reason == _STOP:
                stop_reason = self.stop_hits[i]
            finishes.append(_Finish(_REASONS[reason], ended_at, stop_reason))
        return finishes


class _RowSampler:
    """Samples the sampled rows (temperature > 0) itself and leaves a one-hot for the arg-max.

    ``generate`` runs greedy; for the sampled rows this processor applies temperature and top-p
    and draws one token each by inverse transform sampling, then masks every other token, so greedy
    decoding picks the drawn token. Greedy rows pass through untouched. All rows are processed as
    one batch on the device; each row's uniform draws come from its own ``random.Random(seed)`` on
    the host (one small copy per step, no synchronisation), so a seeded row's output does not
    depend on its batch-mates.
    """

    def __init__(self, rows: list[_Row], device: Any):
        import torch

        sampled = [i for i, row in enumerate(rows) if row.sampling.temperature > 0]
        self.device = device
        self.pinned = device.type == "cuda"
        self.index = torch.tensor(sampled, dtype=torch.long, device=device)
        self.temperature = torch.tensor(
            [[rows[i].sampling.temperature] for i in sampled], dtype=torch.float32, device=device
        )
        top_p = [rows[i].sampling.top_p for i in sampled]
        self.top_p = torch.tensor(top_p, dtype=torch.float32, device=device)[:, None] if min(top_p) < 1 else None
        self.generators = [random.Random(rows[i].seed) for i in sampled]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        uniform = torch.tensor([g.random() for g in self.generators], dtype=torch.float64, pin_memory=self.pinned)
        uniform = uniform.to(self.device, non_blocking=True)
        original = scores.index_select(0, self.index)
        probs = torch.softmax(original / self.temperature, dim=-1)
        order = None
        if self.top_p is not None:
            probs, order = torch.sort(probs, dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            probs = probs.masked_fill(torch.cumsum(probs, dim=-1) - probs >= self.top_p, 0.0)
        cumulative = torch.cumsum(probs, dim=-1, dtype=torch.float64)
        target = (uniform * cumulative[:, -1])[:, None]
        # The first token whose cumulative mass exceeds the target: never one of mass 0.
        token = torch.searchsorted(cumulative, target, right=True).clamp_(max=probs.shape[-1] - 1)
        if order is not None:
            token = order.gather(1, token)
        forced = torch.full_like(original, float("-inf")).scatter_(1, token, 0.0)
        # A row whose logits are all masked (-inf) has no distribution: left as it is.
        possible = torch.isfinite(original).any(dim=-1, keepdim=True)
        scores.index_copy_(0, self.index, torch.where(possible, forced, original))
        return scores


class _GrammarProcessor:
    """Masks each constrained row's logits to the tokens its xgrammar matcher allows next."""

    def __init__(self, grammars: list[Any | None], vocab_size: int, device: Any):
        import torch
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab_size = vocab_size
        self.constrained = [i for i, g in enumerate(grammars) if g is not None]
        self.constrained_index = torch.tensor(self.constrained, dtype=torch.long, device=device)
        self.matchers = {i: xgr.GrammarMatcher(grammars[i]) for i in self.constrained}
        bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
        # Pinned on CUDA: the copy to the device is then asynchronous. Reusing the buffer is safe:
        # reading the last tokens each step waits for the previous step's copy to be done.
        self.bitmask = bitmask.pin_memory() if device.type == "cuda" else bitmask
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        xgr = self.xgr
        if self.started:
            last = input_ids[:, -1].index_select(0, self.constrained_index).tolist()
            for i, token in zip(self.constrained, last):
                matcher = self.matchers.get(i)
                if matcher is not None and not matcher.is_terminated():
                    # A row that ended another way (stop string, length, abort) goes on with tokens
                    # the grammar may reject: stop following it.
                    if not matcher.accept_token(token):
                        del self.matchers[i]
        self.started = True
        xgr.reset_token_bitmask(self.bitmask)
        indices = []
        for i, matcher in self.matchers.items():
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.bitmask, i)
                indices.append(i)
        if indices:
            xgr.apply_token_bitmask_inplace(
                scores,
                self.bitmask.to(scores.device, non_blocking=True),
                vocab_size=self.vocab_size,
                indices=indices,
            )
        return scores


class TransformersEngine(EngineBase):
    """Hugging Face ``transformers`` generation with a micro-batcher (see the module docstring)."""

    name = "transformers"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        model_kwargs = dict(config.engine_kwargs)
        self.max_batch_size = int(model_kwargs.pop("max_batch_size", DEFAULT_MAX_BATCH_SIZE))
        if self.max_batch_size < 1:
            raise ValueError(f"engine_kwargs.max_batch_size: must be >= 1 (got {self.max_batch_size})")
        self._model_kwargs = model_kwargs
        self._model: Any = None
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
        self._aborts = 0  # calls that went away while their rows were queued or generating

    # -- lifecycle (EngineBase) ------------------------------------------------------------------

    async def _start(self) -> None:
        """Load the model and tokenizer in a thread, then start the batching worker."""
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
        # SDPA attention, with backends chosen per device for each batch (attention_backends);
        # engine_kwargs.attn_implementation overrides it.
        kwargs = {"dtype": config.dtype, "attn_implementation": "sdpa", **self._model_kwargs}
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
        # top_k, repetition_penalty, ...) may leak into generate, as vLLM ignores them too. Nor does
        # generate get the eos tokens: _FinishTracker ends rows (ignore_eos is per row).
        model.generation_config = GenerationConfig(pad_token_id=pad, bos_token_id=generation_config.bos_token_id)
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

    async def _stop(self) -> None:
        """End the worker (rows in flight end as "abort"), fail the queued rows, free the memory."""
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

    async def check_health(self) -> None:
        """Raise :class:`EngineError` when the engine is not started or its worker stopped."""
        self._require_started()
        assert self._worker is not None  # a started engine has its worker
        if self._worker.done():
            error = None if self._worker.cancelled() else self._worker.exception()
            raise EngineError(f"the engine's worker stopped: {error!r}")

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings, priority: int = 0) -> list[Generation]:
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
            self._aborts += 1
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
            # Left padding, built on the host in one piece and sent to the device once.
            input_ids = torch.tensor(
                [[self._pad_id] * (width - len(ids)) + ids for ids in encoded], dtype=torch.long
            )
            attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
            tracker = _FinishTracker(
                prompt_width=width,
                limits=limits,
                eos_ids=self._eos_ids,
                rows=rows,
                closing=lambda: self._closing,
                aborts=lambda: self._aborts,
                decode=self._decode,
                device=self._device,
            )
            processors = LogitsProcessorList()
            if any(g is not None for g in grammars):
                processors.append(_GrammarProcessor(grammars, self._vocab_size, self._device))
            if any(row.sampling.temperature > 0 for row in rows):
                processors.append(_RowSampler(rows, self._device))
            with torch.inference_mode(), attention_context(self._device.type):
                output = model.generate(
                    input_ids=input_ids.to(self._device),
                    attention_mask=attention_mask.to(self._device),
                    max_new_tokens=max(limits),
                    do_sample=False,
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([tracker]),
                    pad_token_id=self._pad_id,
                )
                generated = output[:, width:].tolist()
                finishes = tracker.finishes(output, generated)
            done = iter(range(len(rows)))
            for index in range(len(batch)):
                if results[index] is not None:
                    continue
                i = next(done)
                finish = finishes[i]
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
