"""The one small interface every inference engine implements.

An engine turns already chat-templated prompt strings into generations. It owns a tokenizer
(so the scorer can apply the model's own chat template and count tokens), batches concurrent
calls itself, and knows nothing about GQM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort", "error"]


class EngineError(RuntimeError):
    """The engine failed to produce a generation (crashed, unloaded, bad constraint...)."""


class EngineUnsupportedError(EngineError):
    """The engine cannot honour a requested feature (e.g. a regex constraint)."""


class EngineDeadError(EngineError):
    """The engine can serve nothing more: its process died, it failed a health check, or it hung.

    Not an answer about one group: whoever holds the engine gives it up so that the work is
    scored on another engine, never answered with a failure (docs/operations/faults.md).
    """


class TokenizerNotReadyError(EngineError, AttributeError):
    """The tokenizer was asked for before the engine loaded it (before :meth:`Engine.start`).

    Also an :class:`AttributeError`: Python 3.11's ``isinstance(engine, Engine)`` probes the
    protocol's attributes with ``hasattr``, which must answer False here, not raise.
    """


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling for one generate call; engines translate it into their own parameter objects."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # A regular expression the whole output must match (structured outputs); None = free text.
    regex: str | None = None
    # Generate exactly max_tokens (benchmarks with fixed answer lengths). vLLM, SGLang and
    # transformers honour it; the scripted engine does not (its answer lengths are its own).
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1] (got {self.top_p})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1 (got {self.max_tokens})")


@dataclass(frozen=True)
class Generation:
    """One prompt's output and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Tokenizer(Protocol):
    """What the scorer needs from a tokenizer: the chat template and a token count.

    Hugging Face tokenizers satisfy it as they are.
    """

    def apply_chat_template(self, conversation: Any, *, tokenize: bool = ..., add_generation_prompt: bool = ...) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@runtime_checkable
class Engine(Protocol):
    """An inference engine: started once, asked for batches of generations, stopped once."""

    name: str

    async def start(self) -> None:
        """Load the model; idempotent."""

    async def stop(self) -> None:
        """Release the model and its memory; idempotent."""

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (available after :meth:`start`)."""

    async def generate(self, prompts: Sequence[str], sampling: SamplingSettings, priority: int = 0) -> list[Generation]:
        """Generate one output per prompt (prompts are final text: chat template applied).

        ``priority``: lower is served first while the engine is saturated, by engines configured
        with ``scheduling: largest_first``; the others ignore it."""

    async def check_health(self) -> None:
        """Raise :class:`EngineError` (preferably :class:`EngineDeadError`) when the engine can no
        longer serve."""


@runtime_checkable
class SleepingEngine(Protocol):
    """An engine that can sleep: its weights offloaded and its KV cache freed while it holds its
    devices, woken in seconds instead of a replica's cold start (vLLM's sleep mode level 1; the
    scripted engine for tests). An optional capability: the replica asks for it only under
    ``replicas.autoscaling.idle: sleep`` and wakes the engine before a group goes to it."""

    @property
    def sleeping(self) -> bool:
        """Whether the engine sleeps now (it generates nothing until :meth:`wake_up`)."""

    async def sleep(self) -> None:
        """Offload the weights and free the KV cache; only while nothing is generating."""

    async def wake_up(self) -> None:
        """Load the weights back and allocate the KV cache: the engine serves again."""


@dataclass(frozen=True)
class EngineStats:
    """What an engine's scheduler last reported, for the replica's metrics (docs/operations/metrics.md).

    ``None`` where the engine has no such figure (only vLLM reports its KV cache and preemptions)."""

    running: int  # requests the engine is generating for now
    waiting: int  # requests queued at the engine, not yet scheduled
    kv_cache_usage: float | None = None  # fraction of the KV cache's blocks in use, 0..1
    preemptions: int | None = None  # requests preempted (their KV cache given up) since the engine started


@runtime_checkable
class ReportingEngine(Protocol):
    """An engine that reports its scheduler's figures (every :class:`~cluster.engines.lifecycle.EngineBase`
    does; those without any report ``None``)."""

    def stats(self) -> EngineStats | None:
        """The latest figures, or ``None`` when the engine has none (yet)."""


class EngineStatsRecorder:
    """Keeps an engine's latest scheduler figures and its running total of preemptions; an engine's stats
    hook writes it on every engine step, the replica reads a snapshot now and then."""

    def __init__(self) -> None:
        self._latest: EngineStats | None = None
        self._preemptions = 0

    def scheduler(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        """One scheduler report: the queue lengths and the KV cache's use now."""
        self._latest = EngineStats(running=running, waiting=waiting, kv_cache_usage=kv_cache_usage,
                                   preemptions=self._preemptions)

    def preempted(self, requests: int) -> None:
        """``requests`` more requests were preempted."""
        self._preemptions += requests

    def snapshot(self) -> EngineStats | None:
        """The latest report with the preemptions so far; ``None`` before the first report."""
        latest = self._latest
        if latest is None:
            return None
        return EngineStats(running=latest.running, waiting=latest.waiting, kv_cache_usage=latest.kv_cache_usage,
                           preemptions=self._preemptions)


def apply_chat_template(tokenizer: Tokenizer, user_message: str) -> str:
    """The prompt as the model sees it: one user message through the model's own chat template."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str):  # transformers 5.x returns a BatchEncoding unless tokenize=False
        raise EngineError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """Tokens in an already templated prompt (special tokens are in the text already)."""
    return len(tokenizer.encode(text, add_special_tokens=False))
