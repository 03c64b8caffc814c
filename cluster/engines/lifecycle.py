"""The engine lifecycle, written once for every engine.

:class:`EngineBase` serialises :meth:`~EngineBase.start` and :meth:`~EngineBase.stop`, makes both
idempotent, checks ``config.model`` before anything loads, and guards the calls that need a started
engine. An engine subclasses it and writes only what is its own: how it loads
(:meth:`~EngineBase._start`) and lets go (:meth:`~EngineBase._stop`), how it generates, checks its
health and sleeps.

Importing this module imports no engine package (no torch, vLLM, SGLang or Ray).
"""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

from cluster.engines.base import EngineError, EngineStats, Tokenizer, TokenizerNotReadyError

if TYPE_CHECKING:
    from cluster.engines.config import EngineConfig

__all__ = ["EngineBase", "TokenizerNotReadyError"]


class EngineBase(abc.ABC):
    """The start/stop lifecycle of an :class:`~cluster.engines.base.Engine`.

    - :meth:`start`: under the lifecycle lock, returns at once when started; else checks
      ``config.model`` (where :attr:`requires_model`) and runs :meth:`_start`. The engine counts as
      started only once :meth:`_start` returned: a start that failed or was cancelled leaves it
      not started, and a later :meth:`start` tries again.
    - :meth:`stop`: under the same lock, does nothing unless started; else marks the engine not
      started and runs :meth:`_stop`.
    - :attr:`tokenizer`: ``self._tokenizer``, which an engine sets when it loads one, or
      :class:`~cluster.engines.base.TokenizerNotReadyError`.
    - :meth:`_require_started`: the guard of every call that needs a started engine.
    """

    name: ClassVar[str]
    # Whether start() refuses a config without ``model``: a real engine has nothing to load
    # without one; the scripted engine needs none.
    requires_model: ClassVar[bool] = True

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # The model's tokenizer once loaded: Any, as engines use more of it than the Tokenizer protocol.
        self._tokenizer: Any = None
        self._started = False
        # Serialises start/stop (an asyncio.Lock binds to the loop of its first use, not this one).
        self._lifecycle_lock = asyncio.Lock()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` succeeded and :meth:`stop` has not run since."""
        return self._started

    async def start(self) -> None:
        """Load the model (:meth:`_start`); idempotent, and one at a time with :meth:`stop`."""
        async with self._lifecycle_lock:
            if self._started:
                return
            if self.requires_model and not self.config.model:
                raise EngineError("config.model: a model directory or hub id is required")
            await self._start()
            self._started = True

    async def stop(self) -> None:
        """Release the model and its memory (:meth:`_stop`); idempotent: an engine that is not
        started (never, or no longer) has nothing to release."""
        async with self._lifecycle_lock:
            if not self._started:
                return
            # Not started from here on, so that calls arriving while it stops are refused.
            self._started = False
            await self._stop()

    @abc.abstractmethod
    async def _start(self) -> None:
        """Load what the engine serves with (under the lifecycle lock, only while not started).

        Raise :class:`~cluster.engines.base.EngineError` on failure, having released whatever was
        built: the engine stays not started and :meth:`stop` will not be called for it."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Release what :meth:`_start` built (under the lifecycle lock, once per successful start)."""

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer; :class:`~cluster.engines.base.TokenizerNotReadyError` until loaded."""
        if self._tokenizer is None:
            raise TokenizerNotReadyError(
                f"tokenizer: call start() first (the {self.name} engine loads its tokenizer when it starts)"
            )
        return self._tokenizer

    def stats(self) -> EngineStats | None:
        """The scheduler's latest figures (:class:`~cluster.engines.base.ReportingEngine`); an engine without
        any (transformers, SGLang behind this interface) reports ``None``."""
        return None

    def _require_started(self) -> None:
        """Raise :class:`~cluster.engines.base.EngineError` unless the engine is started."""
        if not self._started:
            raise EngineError(f"the {self.name} engine is not started (not yet, or stopped since): call start() first")
