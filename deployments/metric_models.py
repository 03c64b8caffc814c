"""Second model deployments in the reward application: the metric models a recipe names as parts.

Each entry of ``metric_models`` in the config is a Serve deployment ``MetricModel-<name>`` in the same
application as the scorers (``deployments/app.py`` binds them to the scorer replicas). Its replicas hold an
engine through the engine interface (vLLM, SGLang, transformers, or the scripted one in tests) and score
candidates with :class:`~cluster.metric_judge.MetricJudge`: GQM's single-candidate prompt, the row's
reference in its notes, read to 0..10 and divided by 10. The scorer replica reaches them through
:func:`metric_model_clients`, whose clients answer the recipe's ``MetricModel`` protocol
(``cluster/recipe.py``): one value or None per item, never a made-up number.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from cluster.engines import EngineDeadError, make_engine, process_guard
from cluster.metric_judge import MetricJudge, MetricText
from deployments.config import AppConfig
from deployments.engine_probe import EngineProbe
from deployments.preflight import ensure_replica_can_start

__all__ = ["MetricModelClient", "MetricModelReplica", "metric_model_clients"]

logger = logging.getLogger("ray.serve")

# Errors of a call whose replica died or is not reachable now: sent once more, where Serve routes it next.
_REPLICA_GONE = (RayActorError, ActorUnavailableError)


class MetricModelReplica:
    """One replica of a metric model: its engine, a :class:`MetricJudge`, and Serve's health checks.

    Built from the metric model's own :meth:`AppConfig.metric_model_config` (its engine, scoring and
    replica settings), so the node's checks and the engine's start are the scorer replica's."""

    async def __init__(self, name: str, config: AppConfig):
        self.name = name
        self.config = config
        self.lost: BaseException | None = None
        self.items_scored = 0
        self.calls = 0
        started = time.monotonic()
        self.process_guard = await asyncio.to_thread(process_guard.arm)  # no engine process outlives this one
        try:
            await asyncio.to_thread(ensure_replica_can_start, config)
            self.engine = make_engine(config.engine)
            await self.engine.start()
        except BaseException:
            await self._release()
            raise
        self.judge = MetricJudge(self.engine, config.scoring)
        self.probe = EngineProbe(self.engine, config.replicas.hang_timeout_s, config.replicas.hang_probes,
                                 f"metric model {name}")
        self.cold_start_s = time.monotonic() - started
        logger.info("metric model %s: %s engine ready in %.1f s", name, config.engine.kind, self.cold_start_s)

    async def score(self, items: Sequence[MetricText]) -> list[float | None]:
        """Each item's value in 0..1 (None where the model gave no readable score), in order; one
        engine call per attempt for all of them. A lost engine raises (the caller's values are None)."""
        if self.lost is not None:
            raise EngineDeadError(f"metric model {self.name} lost its engine: {self.lost}")
        try:
            values = await self.judge.score(items)
        except EngineDeadError as error:
            self.lost = error  # the next health check ends this replica; Serve starts another
            raise
        self.calls += 1
        self.items_scored += len(items)
        return values

    async def check_health(self) -> None:
        """Serve's periodic check: the engine's probe (a dead or hung engine fails it, as a scorer's does)."""
        if self.lost is not None:
            raise EngineDeadError(f"metric model {self.name} lost its engine: {self.lost}")
        try:
            await self.probe.check()
        except Exception as error:
            self.lost = error
            raise

    def info(self) -> dict[str, Any]:
        """What this replica runs and what it scored so far."""
        return {"metric_model": self.name, "engine": self.config.engine.kind, "model": self.config.engine.model,
                "cold_start_s": self.cold_start_s, "calls": self.calls, "items_scored": self.items_scored}

    async def _release(self) -> None:
        """Stop the engine (if it started), then disarm the process guard; never raises."""
        probe, engine, guard = (getattr(self, name, None) for name in ("probe", "engine", "process_guard"))
        if probe is not None:
            probe.close()
        try:
            if engine is not None:
                await engine.stop()
        except Exception as error:  # noqa: BLE001 - an engine that failed to stop stays guarded
            logger.warning("metric model %s: could not stop the engine: %r", self.name, error)
            return
        if guard is not None:
            await asyncio.to_thread(guard.disarm)

    async def __del__(self) -> None:
        await self._release()


class MetricModelClient:
    """A metric model deployment through its Serve handle: the recipe's ``MetricModel``.

    A call whose replica died is sent once more (Serve routes it to a live one); any other failure, or a
    second one, is logged and gives None for every item: a part with no value, never a made-up one."""

    def __init__(self, name: str, handle: DeploymentHandle):
        self.name = name
        self.handle = handle

    async def score(self, items: Sequence[MetricText]) -> list[float | None]:
        """Each item's value in 0..1, or None, in order."""
        if not items:
            return []
        batch = list(items)
        try:
            return await self._call(batch)
        except Exception as error:  # noqa: BLE001 - a failed call is values missing, not a failed group
            logger.warning("metric model %s: no values for %d item(s): %s: %s", self.name, len(batch),
                           type(error).__name__, error)
            return [None] * len(batch)

    async def _call(self, batch: list[MetricText]) -> list[float | None]:
        try:
            return await self.handle.score.remote(batch)
        except _REPLICA_GONE:
            return await self.handle.score.remote(batch)


def metric_model_clients(config: AppConfig,
                         handles: Mapping[str, DeploymentHandle] | None = None) -> dict[str, MetricModelClient]:
    """A client per configured metric model (name -> client). ``handles``: the deployments' handles as
    Serve passes them to the scorer replica (``deployments/app.py`` binds them); without them each is
    looked up by its deployment's name in the calling replica's application."""
    clients = {}
    for name in config.metric_models:
        handle = (handles[name] if handles is not None else
                  serve.get_deployment_handle(config.metric_model_config(name).replica_deployment_name))
        clients[name] = MetricModelClient(name, handle)
    return clients
