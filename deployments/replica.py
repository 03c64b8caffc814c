"""The scorer replica: one engine, a GroupScorer, and the assembler that collects members.

A replica is one Ray Serve actor; with tensor/pipeline-parallel ranks it holds their devices
(or a placement group for them), as ``deployments/placement.py`` decides. Callers reach it
through the group-aware router (``deployments/router.py``).

A replica whose engine dies or hangs ends its own process, so that its callers see a replica's
death and re-send their calls to a live replica (why and how: docs/operations/faults.md).

This class keeps Serve's surface and the engine's life; its parts live apart: the engine lane
(fair gate, work meter, sleep, scorer: ``cluster/engine_lane.py``, built by
``deployments/replica_lane.py``), the assembler (``cluster/assembly.py``) and its scored groups
(``cluster/completed_groups.py``), the ring and its hand-offs
(``deployments/hand_off.py``), the engine's loss (``deployments/engine_loss.py``) and the reports
(``deployments/replica_report.py``). Routing hints (a re-send's attempt, a replica addressed by id,
hand-offs so far) come as the call's session id, never as method arguments (``cluster.routing.RouteHint``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any

from ray import serve
from ray.serve import context as serve_context
from ray.serve.handle import DeploymentHandle

from cluster.admission import GroupsInFlight
from cluster.assembly import AssemblySettings, GroupAssembler
from cluster.assembly_observers import RecentGroups
from cluster.announced_demand import AnnouncedDemands, demand_of
from cluster.autoscaling import Demand
from cluster.completed_groups import CompletedGroups
from cluster.engines import EngineDeadError, make_engine, process_guard
from cluster.open_groups import OpenGroups
from cluster.routing import RouteHint
from cluster.protocol.schema import (
    DemandAccepted,
    DemandAnnouncement,
    GroupRequest,
    GroupResult,
    MemberRequest,
    MemberResult,
    scoped_group_id,
    unscoped_group_id,
)
from deployments.autoscaling_policy import autoscaling_stats
from deployments.config import AppConfig
from deployments.engine_loss import EngineLoss
from deployments.engine_probe import EngineProbe
from deployments.hand_off import HandOffMetric, RingFollower
from deployments.ledger import ServeLedger
from deployments.metrics import ReplicaMetrics, export_engine_stats
from deployments.preflight import ensure_replica_can_start
from deployments.replica_lane import engine_lane, sleep_when_idle
from deployments.replica_report import recent_group_rows, replica_info, tenant_rows
from deployments.rewarding import recipe_runner
from deployments.router import OUTSTANDING_WORK

logger = logging.getLogger("ray.serve")


def _route_hint() -> RouteHint:
    """The routing hint of the call being served (its Serve session id; Ray 2.60's request context)."""
    return RouteHint.decode(serve_context._get_serve_request_context().session_id)


def _replica_name() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside Serve (unit use) there is no replica context
        return "local"


class GRRMReplica:
    """Scores whole groups and assembles member-by-member groups on one engine."""

    async def __init__(self, config: AppConfig, ledger: DeploymentHandle | None = None,
                       metric_models: Mapping[str, DeploymentHandle] | None = None):
        """``metric_models``: the handles of the metric model deployments the recipes' model parts name."""
        constructed = time.monotonic()
        self.config = config
        self.name = _replica_name()
        self.cold_start_s: float | None = None  # set once serving
        try:
            # Before the engine starts: no engine process outlives this one, even one of an engine
            # still loading (cluster/engines/process_guard.py).
            self.process_guard = await asyncio.to_thread(process_guard.arm)
            await self._build(config, ledger, metric_models)
            # This replica's cold start (mostly its engine's load), for the autoscaling policy's lead time.
            self.cold_start_s = time.monotonic() - constructed
        except BaseException as error:
            # Serve retries a failed constructor in a new actor: nothing started here may linger.
            logger.error("replica %s: construction failed (%s: %s); releasing what it started",
                         self.name, type(error).__name__, error)
            await self._release()
            raise

    async def _build(self, config: AppConfig, ledger: DeploymentHandle | None,
                     metric_models: Mapping[str, DeploymentHandle] | None) -> None:
        # Each tenant's recipe (the language gate, rule parts in threads, the metric models): both paths use it.
        self.rewards = await recipe_runner(config, self.name, metric_models)
        if config.build_tiny_model_if_missing:
            from cluster.tiny_model import ensure_tiny_model

            ensure_tiny_model(config.engine.model)
        # A node that cannot run the engine (too few GPUs, a GPU held by another process, no /dev/shm for
        # its ranks, an untested engine, no such model) fails here in seconds, in grrm check's words.
        await asyncio.to_thread(ensure_replica_can_start, config)
        started = time.perf_counter()
        self.engine = make_engine(config.replica_engine())
        await self.engine.start()
        logger.info("replica %s: %s engine ready in %.1f s", self.name, config.engine.kind, time.perf_counter() - started)
        self.metrics = ReplicaMetrics(max_tenant_labels=config.tenants.max_metric_labels)
        self.probe = EngineProbe(self.engine, config.replicas.hang_timeout_s, config.replicas.hang_probes,
                                 self.name, on_miss=self.metrics.engine_probes_missed.inc)
        self.lane = engine_lane(config, self.engine, self.name, self._scored)
        self.recent = RecentGroups()  # the groups scored lately, for recent_groups()
        settings = AssemblySettings(assembly_timeout_s=config.assembly_timeout_s, replica=self.name,
                                    max_pending_groups=config.replicas.max_assembling_groups,
                                    waiting_limit=config.waiting_members_limit)
        completed = CompletedGroups(ttl_s=config.completed_ttl_s, ledger=ServeLedger(
            ledger, copies=config.ledger.num_replicas) if ledger is not None else None)
        self.assembler = GroupAssembler(self.lane.assembled, settings, completed=completed, rewards=self.rewards,
                                        observers=(self.recent, HandOffMetric(self.metrics)))
        # Members of keyed groups without ids of their own (OpenRLHF's samples), remembered long
        # enough for a re-send after an assembly timeout.
        self.open_groups = OpenGroups(ttl_s=2 * config.assembly_timeout_s + 60)
        # Each tenant's groups here, bounded by its max_groups_in_flight (cluster/admission.py).
        self.in_flight = GroupsInFlight(lambda tenant: config.tenant(tenant).max_groups_in_flight, self.name)
        self.demands = AnnouncedDemands()  # the work tenants announced (autoscaling forecast)
        # The routers' ring: a group it places on another replica is handed there (deployments/hand_off.py).
        self.ring = RingFollower(self.name, config.routing.virtual_nodes, self.assembler, self.lane.queued,
                                 self.demands)
        self._outstanding_work = 0.0
        self.loss = EngineLoss(self.name, self.engine, self.lane, self.assembler)
        self._sleep_loop: asyncio.Task[None] | None = None
        # The engine scheduler's figures (KV cache, queue, preemptions) into the replica's metrics.
        self._stats_loop = asyncio.get_running_loop().create_task(export_engine_stats(self.engine, self.metrics),
                                                                  name="engine-stats")
        if self.lane.sleeper is not None:
            sleeping = self.metrics.engine_sleeping.set
            self._sleep_loop = asyncio.get_running_loop().create_task(
                sleep_when_idle(self.lane, self.demands, self.name, self.loss.lose,
                                lambda asleep: sleeping(1.0 if asleep else 0.0)), name="engine-sleep")

    def _scored(self, group: GroupRequest, result: GroupResult, waited_s: float) -> None:
        self.metrics.record_group(result)
        self.metrics.record_tenant(group.tenant, result, waited_s)

    async def run_group(self, group: GroupRequest) -> GroupResult:
        """Score one whole group through its tenant's recipe: every candidate's reward and components."""
        key = scoped_group_id(group.tenant, group.group_id or uuid.uuid4().hex)
        refusal = self._admit(group.tenant, key)
        if refusal is not None:
            return self.rewards.refused(group, GroupResult(group_id=group.group_id, valid=False, failure="overloaded",
                                                           error=refusal, replica=self.name))
        work = float(len(group.candidates))
        self._outstanding_work += work
        try:
            result = (await self.rewards.run(group, self.lane)).group_result(group)
        except EngineDeadError as error:
            await self.loss.ended_by(error)
        finally:
            self._outstanding_work -= work
            self.in_flight.settle(group.tenant, key)
        return result

    async def add_member(self, member: MemberRequest) -> MemberResult:
        """Add one member to its group; answers when the group is scored (or times out). Its group is
        kept under its tenant's scope: two tenants' equal group ids never meet.

        A member of a group the routers' ring now places on another replica (the replica set changed)
        is handed to that replica, and its answer passed back (the call's routing hint counts the
        hand-offs so far: replicas whose views of the ring differ pass a member on a few times at most)."""
        scoped, hint = scoped_group_id(member.tenant, member.group_id), _route_hint()
        elsewhere = await self.ring.hand_on(member, scoped, hint)
        if elsewhere is not None:
            return elsewhere
        return await self.ring.follow_moved(member, await self._join(member, scoped, route_key=member.group_id), hint)

    async def add_open_member(self, member: MemberRequest) -> MemberResult:
        """A member whose ``group_id`` is only a key shared by the samples of one prompt (and whose
        ``member_id`` is its own): it joins the key's group that takes members now, in arrival order
        (``cluster/open_groups.py``), and answers as :meth:`add_member` once that group is scored."""
        if member.member_id is None:
            raise ValueError("member_id: required for a member of an open group")
        scoped = self.open_groups.group_of(scoped_group_id(member.tenant, member.group_id), member.group_size,
                                           member.member_id)
        return await self._join(member.model_copy(update={"group_id": unscoped_group_id(scoped)[1]}), scoped)

    async def _join(self, member: MemberRequest, scoped: str, route_key: str | None = None) -> MemberResult:
        """Add a member to its group's assembly here; its answer once the group is scored (or not)."""
        if self.loss.lost:
            await self.loss.answer_nothing()
        refusal = self._admit(member.tenant, scoped)
        if refusal is not None:
            default = self.rewards.unscored(member.tenant, member.invalid)
            return MemberResult(group_id=member.group_id, index=member.index, member_id=member.member_id,
                                valid=False, failure="overloaded", error=refusal, replica=self.name,
                                reward=default.reward, components=dict(default.components))
        self._outstanding_work += 1.0
        try:
            result = await self.assembler.submit(member.model_copy(update={"group_id": scoped}), route_key)
        except EngineDeadError as error:
            await self.loss.ended_by(error)
        finally:
            self._outstanding_work -= 1.0
            self.in_flight.settle(member.tenant, scoped)
            self.metrics.members_waiting.set(self.assembler.members_waiting())
        if result.failure == "timeout":
            self.metrics.assembly_timeouts.inc()
            self.metrics.record_tenant_failure(member.tenant, "timeout")
        return result.model_copy(update={"group_id": member.group_id})

    def _admit(self, tenant: str, group: str) -> str | None:
        refusal = self.in_flight.admit(tenant, group)
        if refusal is not None:
            self.metrics.record_tenant_failure(tenant, "overloaded")
        return refusal

    def record_routing_stats(self) -> dict[str, Any]:
        """Outstanding work every router reads for bounded-load and least-work decisions."""
        return {OUTSTANDING_WORK: self._outstanding_work, "pending_groups": self.assembler.pending_groups()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What the autoscaling policy decides on (``deployments/autoscaling_policy.py``): this engine's
        queued and running work, members that only wait (apart), and the demand announced here."""
        load = self.lane.work.load(time.monotonic(), self.assembler.members_waiting(),
                                   self.config.replicas.max_ongoing_requests)
        sleeper = self.lane.sleeper
        load = dataclasses.replace(load, cold_start_s=self.cold_start_s, sleeping=sleeper is not None and sleeper.sleeping)
        now, grace_s = time.time(), self.config.replicas.demand_grace_s()
        return autoscaling_stats(load, self.demands.current(now, grace_s), now, grace_s)

    def announce_demand(self, announcement: DemandAnnouncement) -> DemandAccepted:
        """Remember work a tenant expects to send (its next generation phase), for the autoscaling
        policy. A tenant's announcements go to one replica (its ring owner) and the latest counts
        wherever earlier ones are kept; one of 0 groups withdraws them (kept as such for a minute:
        ``cluster/announced_demand.py``)."""
        self.keep_demand(demand_of(announcement, time.time()))
        return DemandAccepted(replica=self.name, tenant=announcement.tenant, groups=announcement.groups)

    def keep_demand(self, demand: Demand) -> None:
        """Keep a tenant's announced demand unless a later one is kept already (a replica handing on
        the demands the new ring places here calls this)."""
        self.demands.keep(demand)

    async def check_health(self) -> None:
        """Serve calls this periodically; raising makes Serve replace the replica.

        Each check waits up to ``hang_timeout_s`` for the engine's answer to its probe (one probe out
        at a time: ``deployments/engine_probe.py``); ``hang_probes`` checks in a row without an answer
        mean a hung engine. A hung or dead engine is the engine's loss: the replica ends at once
        instead of serving on until Serve has seen enough failed checks in a row.
        """
        if self.loss.lost:
            raise EngineDeadError(f"replica {self.name} lost its engine")
        try:
            await self.probe.check()
        except Exception as error:
            self.loss.lose(error)
            raise

    async def takes_members(self) -> str:
        """A peer's probe before it hands this replica members: a replica that lost its engine answers
        nothing (as to members), so its peer keeps them rather than hand them to a process about to
        end (they would come back ``moved`` and cost their callers an attempt)."""
        if self.loss.lost:
            await self.loss.answer_nothing()
        return self.name

    def info(self) -> dict[str, Any]:
        """What this replica runs, what it did so far, and its memory."""
        stats = self.engine.stats()
        return {**replica_info(self.name, self.config, self.lane, self.assembler, self.cold_start_s),
                "health_probes": self.probe.watch.as_dict(),
                "engine_stats": None if stats is None else dataclasses.asdict(stats)}

    def recent_groups(self, since: float | None = None) -> list[dict[str, Any]]:
        """The groups this replica scored lately, oldest first, with their tenant and times (Unix seconds
        on this replica's clock): when the first member was sent and arrived, when the group was
        complete, when its scoring started and ended (``since``: scoring ended at or after)."""
        return recent_group_rows(self.recent, since)

    def tenants(self) -> dict[str, dict[str, Any]]:
        """Each active tenant's work on this replica now and what the engine served it lately."""
        return tenant_rows(self.lane, self.in_flight, self.assembler)

    async def _release(self) -> None:
        """Close the assembler, stop the engine and then disarm the process guard, whichever exist (a
        construction may have failed before either); never raises: a failed step is logged and the
        next one still runs."""
        assembler = getattr(self, "assembler", None)
        engine = getattr(self, "engine", None)
        ring = getattr(self, "ring", None)
        if ring is not None:
            ring.stop()
        for loop_name in ("_sleep_loop", "_stats_loop"):
            task = getattr(self, loop_name, None)
            if task is not None:
                task.cancel()
        probe = getattr(self, "probe", None)
        if probe is not None:
            probe.close()
        if assembler is not None:
            await self._logged("close the assembler", assembler.close())
        stopped = engine is None or await self._logged("stop the engine", engine.stop())
        guard = getattr(self, "process_guard", None)
        if guard is not None and stopped:
            # An engine that failed to stop stays guarded: its processes then end with this one. The
            # watcher takes a moment to end: off the event loop.
            await asyncio.to_thread(guard.disarm)

    async def _logged(self, step: str, call: Awaitable[None]) -> bool:
        """Await ``call``; whether it succeeded (a failure is logged, not raised)."""
        try:
            await call
            return True
        except Exception as error:  # noqa: BLE001 - release the rest regardless
            logger.warning("replica %s: could not %s: %r", getattr(self, "name", "?"), step, error)
            return False

    async def __del__(self) -> None:
        await self._release()
