"""The engine lane a replica's config asks for, and the loop that puts an idle engine to sleep.

The lane itself is pure (``cluster/engine_lane.py``); this module reads the app's config for it: the
engine's slots for the fair gate, and a sleeper under ``replicas.autoscaling.idle: sleep``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from cluster.announced_demand import AnnouncedDemands
from cluster.engine_lane import EngineLane, Scored
from cluster.engine_sleep import EngineSleeper
from cluster.engines import Engine, EngineDeadError, SleepingEngine
from cluster.fair_share import FairGate
from cluster.protocol.schema import GroupResult
from cluster.scorer import GroupScorer
from deployments.config import AppConfig

__all__ = ["SLEEP_CHECK_S", "engine_lane", "sleep_when_idle"]

logger = logging.getLogger("ray.serve")

# How often a replica whose idle engine sleeps (replicas.autoscaling.idle: sleep) looks whether it should
# sleep or wake; it wakes this much earlier than an announced phase needs (twice: a late tick).
SLEEP_CHECK_S = 1.0


def engine_lane(config: AppConfig, engine: Engine, replica: str, on_scored: Scored) -> EngineLane:
    """The lane of ``engine`` as ``config`` asks: its fair gate, and its sleeper under idle: sleep."""
    # A group sends `permutations` prompts at once, so the engine's batch holds that many fewer groups.
    tenants = config.tenants
    slots = tenants.engine_slots or max(1, (config.engine.batch_slots() or 256) // config.scoring.permutations)
    # The policy is asked on every pick: cached, as the config never changes in a replica's life.
    policy = functools.lru_cache(maxsize=4096)(config.tenant_policy)
    gate: FairGate[GroupResult] = FairGate(slots, policy, enabled=tenants.fair_share,
                                           return_credit=tenants.return_credit_tokens,
                                           reserved_slots=min(tenants.reserved_slots, slots - 1),
                                           window_s=tenants.window_s)
    sleeper = None
    if config.sleeps_when_idle:
        if not isinstance(engine, SleepingEngine):  # the config allows only engines that can
            raise TypeError(f"replicas.autoscaling.idle: the {config.engine.kind} engine cannot sleep")
        assert config.replicas.autoscaling is not None
        sleeper = EngineSleeper(engine, config.replicas.autoscaling.scaling_settings(), margin_s=2 * SLEEP_CHECK_S)
    return EngineLane(GroupScorer(engine, config.scoring, replica=replica), gate, sleeper, on_scored=on_scored)


async def sleep_when_idle(lane: EngineLane, demands: AnnouncedDemands, replica: str,
                          lose: Callable[[BaseException], None], on_change: Callable[[bool], None]) -> None:
    """Put the engine to sleep while its replica has nothing for it, and wake it for work: groups
    queued, or an announced phase known here about to send groups (cluster/engine_sleep.py). Ends
    when the engine is lost (``lose`` is told); ``on_change(sleeping)`` after every look."""
    sleeper = lane.sleeper
    assert sleeper is not None
    while lane.lost is None:
        await asyncio.sleep(SLEEP_CHECK_S)
        try:
            await lane.tend_sleep(demands)
        except EngineDeadError as error:
            lose(error)
            return
        except Exception as error:  # noqa: BLE001 - a failed sleep leaves the engine awake: it serves on
            logger.warning("replica %s: engine sleep/wake failed: %r", replica, error)
        on_change(sleeper.sleeping)
