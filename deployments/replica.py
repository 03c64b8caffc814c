"""The scorer replica: one engine, a GroupScorer, and the assembler that collects members.

A replica is one Ray Serve actor (with its placement group of one GPU per tensor-parallel rank
on GPU machines). Callers reach it through the group-aware router (``deployments/router.py``).
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.assembly import GroupAssembler
from cluster.engines import make_engine
from cluster.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from cluster.scorer import GroupScorer
from deployments.config import AppConfig
from deployments.ledger import ServeLedger
from deployments.metrics import ReplicaMetrics
from deployments.router import OUTSTANDING_WORK

logger = logging.getLogger("ray.serve")


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:  # not Linux
        return None


def _replica_name() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside Serve (unit use) there is no replica context
        return "local"


class GRRMReplica:
    """Scores whole groups and assembles member-by-member groups on one engine."""

    async def __init__(self, config: AppConfig, ledger: DeploymentHandle | None = None):
        self.config = config
        self.name = _replica_name()
        if config.build_tiny_model_if_missing:
            from cluster.tiny_model import ensure_tiny_model

            ensure_tiny_model(config.engine.model)
        started = time.perf_counter()
        self.engine = make_engine(config.engine)
        await self.engine.start()
        logger.info("replica %s: %s engine ready in %.1f s", self.name, config.engine.kind, time.perf_counter() - started)
        self.scorer = GroupScorer(self.engine, config.scoring, replica=self.name)
        self.metrics = ReplicaMetrics()
        self.assembler = GroupAssembler(
            self._score,
            assembly_timeout_s=config.assembly_timeout_s,
            completed_ttl_s=config.completed_ttl_s,
            replica=self.name,
            ledger=ServeLedger(ledger) if ledger is not None else None,
        )
        self._outstanding_work = 0.0
        self._groups_scored = 0  # every GQM group this replica sent to its engine path

    async def score_group(self, group: GroupRequest, attempt: int = 0) -> GroupResult:
        """Score one whole group (``attempt`` is read by the router, not here)."""
        work = float(len(group.candidates))
        self._outstanding_work += work
        try:
            result = await self._score(group)
        finally:
            self._outstanding_work -= work
        return result

    async def score_member(self, member: MemberRequest, attempt: int = 0) -> MemberResult:
        """Add one member to its group; answers when the group is scored (or times out)."""
        self._outstanding_work += 1.0
        try:
            result = await self.assembler.submit(member)
        finally:
            self._outstanding_work -= 1.0
            self.metrics.members_waiting.set(self.assembler.members_waiting())
        if result.failure == "timeout":
            self.metrics.assembly_timeouts.inc()
        return result

    async def _score(self, group: GroupRequest) -> GroupResult:
        self._groups_scored += 1
        result = await self.scorer.score_group(group)
        self.metrics.record_group(result)
        return result

    def record_routing_stats(self) -> dict[str, Any]:
        """Outstanding work every router reads for bounded-load and least-work decisions."""
        return {OUTSTANDING_WORK: self._outstanding_work, "pending_groups": self.assembler.pending_groups()}

    async def check_health(self) -> None:
        """Serve calls this periodically; raising makes Serve replace the replica."""
        await self.engine.check_health()

    def info(self, target_replica: str | None = None) -> dict[str, Any]:
        """What this replica runs (``target_replica`` lets the router address one replica)."""
        return {
            "replica": self.name,
            "model": self.config.engine.model,
            "engine": self.config.engine.kind,
            "prompt_type": self.config.scoring.prompt_type,
            "tensor_parallel_size": self.config.engine.tensor_parallel_size,
            "groups_scored": self._groups_scored,
            # Resident memory of this replica process now, and its peak so far (Linux: KiB).
            "rss_bytes": _current_rss_bytes(),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "assembler": self.assembler.stats(),
        }

    async def __del__(self) -> None:
        await self.assembler.close()
        await self.engine.stop()
