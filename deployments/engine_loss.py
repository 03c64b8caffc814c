"""What a replica does once its engine is lost: take no more work, and end its own process.

A replica whose engine died or hung answers nothing more, not even an error: its callers then see a
replica's death (``RayActorError``), re-send their calls to a live replica, and Serve starts a new one
(why: docs/operations/faults.md). Before the process ends, the records of groups already answered
reach the ledger (bounded), for the members whose answers this end cuts off.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import NoReturn

from cluster.assembly import GroupAssembler
from cluster.engine_lane import EngineLane
from cluster.engines import Engine

__all__ = ["ENGINE_LOST_EXIT_CODE", "ENGINE_STOP_TIMEOUT_S", "EngineLoss"]

logger = logging.getLogger("ray.serve")

# A replica that lost its engine gives the engine this long to stop before its process ends.
ENGINE_STOP_TIMEOUT_S = 5.0
# Exit status of a replica process that ended because its engine died.
ENGINE_LOST_EXIT_CODE = 3


class EngineLoss:
    """One replica's engine loss: recorded once, then every call is held until the process ends."""

    def __init__(self, name: str, engine: Engine, lane: EngineLane, assembler: GroupAssembler):
        self.name = name
        self.engine = engine
        self.lane = lane
        self.assembler = assembler
        # Set once the engine is lost; never resolved: the process ends while calls wait on it.
        self._lost: asyncio.Future[None] | None = None
        self._ending: asyncio.Task[NoReturn] | None = None

    @property
    def lost(self) -> bool:
        """Whether the engine was lost (the process is ending)."""
        return self._lost is not None

    def lose(self, error: BaseException) -> None:
        """Take no more work and end this replica's process (the first loss counts; later ones are
        the same loss seen by other calls)."""
        if self._lost is not None:
            return
        self.lane.lose(error)
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        logger.error("replica %s: engine lost (%s: %s); ending the replica: its calls are re-sent to live "
                     "replicas and Serve starts a new one", self.name, type(error).__name__, error)
        self._ending = loop.create_task(self._end_process(), name="end-replica")

    async def ended_by(self, error: BaseException) -> NoReturn:
        """:meth:`lose` the engine to ``error``, then hold the calling request until the process ends."""
        self.lose(error)
        await self.answer_nothing()

    async def answer_nothing(self) -> NoReturn:
        """Hold a call until the process ends: a replica without an engine answers nothing, not even
        an error, so that its callers see a dead replica and re-send the call elsewhere."""
        assert self._lost is not None
        await asyncio.shield(self._lost)
        raise AssertionError("unreachable: the replica process ends first")

    async def _end_process(self) -> NoReturn:
        ledger_writes = asyncio.ensure_future(self.assembler.finish_ledger_writes(ENGINE_STOP_TIMEOUT_S))
        try:
            # Stopping the engine releases its processes and memory; the process guard kills what it leaves.
            await asyncio.wait_for(self.engine.stop(), ENGINE_STOP_TIMEOUT_S)
            await ledger_writes
        except BaseException as error:  # noqa: BLE001 - the process ends whatever happened
            logger.warning("replica %s: engine stop after its loss failed: %r", self.name, error)
        finally:
            for handler in logging.getLogger().handlers + logger.handlers:
                handler.flush()
            # The process ends, not just the actor's work: every call held here then fails as on a
            # replica's death (RayActorError), which callers know to re-send.
            os._exit(ENGINE_LOST_EXIT_CODE)
