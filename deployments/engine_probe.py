"""A replica's health probe of its engine: one probe out at a time, hung after ``hang_probes`` missed checks.

Serve calls the replica's ``check_health`` every ``health_check_period_s`` and waits for it up to
``health_check_timeout_s``. Each check waits up to ``hang_timeout_s`` for the engine's answer to the probe
that is out, starting one only when none is: a probe still unanswered when the next check comes is waited
on again (and counted as missed again), never piled up behind a new one. ``hang_probes`` checks in a row
without an answer mean a hung engine; an answer, however late, starts the count again; a probe that raises
is a dead engine at once (docs/operations/faults.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cluster.engines import Engine, EngineDeadError
from cluster.hang_watch import HangWatch

__all__ = ["EngineProbe"]

logger = logging.getLogger("ray.serve")


class EngineProbe:
    """Probes one engine for a replica's health checks (see the module docstring)."""

    def __init__(self, engine: Engine, hang_timeout_s: float, hang_probes: int, replica: str = "local",
                 on_miss: Callable[[], None] | None = None):
        self.engine = engine
        self.hang_timeout_s = hang_timeout_s
        self.watch = HangWatch(hang_probes)
        self.replica = replica
        self._on_miss = on_miss
        self._probe: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Wait up to ``hang_timeout_s`` for the engine's answer; raise :class:`EngineDeadError` once it is
        hung, or the engine's own error when its probe raises (a dead engine)."""
        if self._probe is None:
            self._probe = asyncio.ensure_future(self.engine.check_health())
        probe = self._probe
        # asyncio.wait leaves the probe running past the timeout: the next check waits on the same one.
        await asyncio.wait({probe}, timeout=self.hang_timeout_s)
        if probe.done():
            self._probe = None
            probe.result()  # a probe that raised: the engine is dead, not late
            if self.watch.consecutive_misses:
                logger.info("replica %s: the engine answered its health probe after %d missed check(s)",
                            self.replica, self.watch.consecutive_misses)
            self.watch.answered()
            return
        hung = self.watch.missed()
        if self._on_miss is not None:
            self._on_miss()
        if not hung:
            logger.warning("replica %s: the engine did not answer its health probe within %s s (%d of %d missed "
                           "checks in a row before it counts as hung)", self.replica, self.hang_timeout_s,
                           self.watch.consecutive_misses, self.watch.probes)
            return
        self.close()
        raise EngineDeadError(f"the engine did not answer a health probe in {self.watch.probes} checks in a row, "
                              f"each waiting {self.hang_timeout_s} s: hung")

    def close(self) -> None:
        """Cancel the probe that is out, if any (the engine is lost or stopping)."""
        probe, self._probe = self._probe, None
        if probe is not None and not probe.done():
            probe.cancel()
