"""The scorer replica: one engine, a GroupScorer, and the assembler that collects members.

A replica is one Ray Serve actor; with tensor/pipeline-parallel ranks it holds their devices
(or a placement group for them), as ``deployments/placement.py`` decides. Callers reach it
through the group-aware router (``deployments/router.py``).

A replica whose engine dies or hangs ends its own process, so that its callers see a replica's
death and re-send their calls to a live replica (why and how: docs/operations/faults.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import resource
import time
import uuid
from collections.abc import Awaitable
from typing import Any, NoReturn

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.admission import GroupsInFlight
from cluster.assembly import GroupAssembler
from cluster.announced_demand import AnnouncedDemands, demand_of
from cluster.autoscaling import Demand
from cluster.engine_lane import EngineLane
from cluster.engine_sleep import EngineSleeper
from cluster.engines import EngineDeadError, SleepingEngine, make_engine, process_guard
from cluster.fair_share import FairGate, GateStats
from cluster.open_groups import OpenGroups
from cluster.schema import (
    DemandAccepted,
    DemandAnnouncement,
    GroupRequest,
    GroupResult,
    MemberRequest,
    MemberResult,
    scoped_group_id,
    unscoped_group_id,
)
from cluster.scorer import GroupScorer
from deployments.autoscaling_policy import autoscaling_stats
from deployments.config import AppConfig
from deployments.hand_off import RingFollower
from deployments.ledger import ServeLedger
from deployments.metrics import ReplicaMetrics
from deployments.preflight import ensure_replica_can_start
from deployments.router import OUTSTANDING_WORK

logger = logging.getLogger("ray.serve")

# A replica that lost its engine gives the engine this long to stop before its process ends.
ENGINE_STOP_TIMEOUT_S = 5.0
# Exit status of a replica process that ended because its engine died.
ENGINE_LOST_EXIT_CODE = 3
# How often a replica whose idle engine sleeps (replicas.autoscaling.idle: sleep) looks whether it should
# sleep or wake; it wakes this much earlier than an announced phase needs (twice: a late tick).
SLEEP_CHECK_S = 1.0


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
        constructed = time.monotonic()
        self.config = config
        self.name = _replica_name()
        self.cold_start_s: float | None = None  # set once serving
        try:
            # Before the engine starts: no engine process outlives this one, even one of an engine
            # still loading (cluster/engines/process_guard.py).
            self.process_guard = await asyncio.to_thread(process_guard.arm)
            await self._build(config, ledger)
            # This replica's cold start (mostly its engine's load), for the autoscaling policy's lead time.
            self.cold_start_s = time.monotonic() - constructed
        except BaseException as error:
            # Serve retries a failed constructor in a new actor: nothing started here may linger.
            logger.error("replica %s: construction failed (%s: %s); releasing what it started",
                         self.name, type(error).__name__, error)
            await self._release()
            raise

    async def _build(self, config: AppConfig, ledger: DeploymentHandle | None) -> None:
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
        self.lane = self._engine_lane(config)
        self.assembler = GroupAssembler(
            self.lane.assembled,
            assembly_timeout_s=config.assembly_timeout_s,
            completed_ttl_s=config.completed_ttl_s,
            max_pending_groups=config.replicas.max_assembling_groups,
            replica=self.name,
            waiting_limit=config.waiting_members_limit,
            ledger=ServeLedger(ledger, copies=config.ledger.num_replicas) if ledger is not None else None,
        )
        # Members of keyed groups without ids of their own (OpenRLHF's samples), remembered long
        # enough for a re-send after an assembly timeout.
        self.open_groups = OpenGroups(ttl_s=2 * config.assembly_timeout_s + 60)
        # Each tenant's groups here, bounded by its max_groups_in_flight (cluster/admission.py).
        self.in_flight = GroupsInFlight(lambda tenant: config.tenant(tenant).max_groups_in_flight, self.name)
        self.demands = AnnouncedDemands()  # the work tenants announced (autoscaling forecast)
        # The routers' ring: a group it places on another replica is handed there (deployments/hand_off.py).
        self.ring = RingFollower(self.name, config.routing.virtual_nodes, self.assembler, self.lane.queued,
                                 self.demands, self.metrics.groups_handed_off.inc)
        self._outstanding_work = 0.0
        # Set once the engine is lost; never resolved: the process ends while calls wait on it.
        self._engine_lost: asyncio.Future[None] | None = None
        self._ending: asyncio.Task[NoReturn] | None = None
        self._sleep_loop: asyncio.Task[None] | None = None
        if self.lane.sleeper is not None:
            self._sleep_loop = asyncio.get_running_loop().create_task(self._sleep_when_idle(), name="engine-sleep")

    def _engine_lane(self, config: AppConfig) -> EngineLane:
        """This engine's lane (cluster/engine_lane.py): its fair gate, and its sleeper under idle: sleep."""
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
            if not isinstance(self.engine, SleepingEngine):  # the config allows only engines that can
                raise TypeError(f"replicas.autoscaling.idle: the {config.engine.kind} engine cannot sleep")
            assert config.replicas.autoscaling is not None
            sleeper = EngineSleeper(self.engine, config.replicas.autoscaling.scaling_settings(),
                                    margin_s=2 * SLEEP_CHECK_S)
        return EngineLane(GroupScorer(self.engine, config.scoring, replica=self.name), gate, sleeper,
                          on_scored=self._scored)

    def _scored(self, group: GroupRequest, result: GroupResult, waited_s: float) -> None:
        self.metrics.record_group(result)
        self.metrics.record_tenant(group.tenant, result, waited_s)

    async def score_group(self, group: GroupRequest, attempt: int = 0) -> GroupResult:
        """Score one whole group (``attempt`` is read by the router, not here)."""
        key = scoped_group_id(group.tenant, group.group_id or uuid.uuid4().hex)
        refusal = self._admit(group.tenant, key)
        if refusal is not None:
            return GroupResult(group_id=group.group_id, valid=False, failure="overloaded", error=refusal,
                               replica=self.name)
        work = float(len(group.candidates))
        self._outstanding_work += work
        try:
            result = await self.lane.score(group)
        except EngineDeadError as error:
            self._lose_engine(error)
            await self._answer_nothing()
        finally:
            self._outstanding_work -= work
            self.in_flight.settle(group.tenant, key)
        return result

    async def score_member(self, member: MemberRequest, attempt: int = 0, handed_off: int = 0,
                           target_replica: str | None = None) -> MemberResult:
        """Add one member to its group; answers when the group is scored (or times out). Its group is
        kept under its tenant's scope: two tenants' equal group ids never meet.

        A member of a group the routers' ring now places on another replica (the replica set changed)
        is handed to that replica, and its answer passed back. ``handed_off`` counts the hand-offs so
        far: replicas whose views of the ring differ for a moment pass a member on a few times at
        most (``attempt`` and ``target_replica`` are read by the router, not here)."""
        scoped = scoped_group_id(member.tenant, member.group_id)
        return await self.ring.place(member, scoped, attempt, handed_off,
                                     lambda here: self._join(here, scoped, route_key=member.group_id))

    async def score_open_member(self, member: MemberRequest, attempt: int = 0) -> MemberResult:
        """A member whose ``group_id`` is only a key shared by the samples of one prompt (and whose
        ``member_id`` is its own): it joins the key's group that takes members now, in arrival order
        (``cluster/open_groups.py``), and answers as :meth:`score_member` once that group is scored."""
        if member.member_id is None:
            raise ValueError("member_id: required for a member of an open group")
        scoped = self.open_groups.group_of(scoped_group_id(member.tenant, member.group_id), member.group_size,
                                           member.member_id)
        return await self._join(member.model_copy(update={"group_id": unscoped_group_id(scoped)[1]}), scoped)

    async def _join(self, member: MemberRequest, scoped: str, route_key: str | None = None) -> MemberResult:
        """Add a member to its group's assembly here; its answer once the group is scored (or not)."""
        if self._engine_lost is not None:
            await self._answer_nothing()
        refusal = self._admit(member.tenant, scoped)
        if refusal is not None:
            return MemberResult(group_id=member.group_id, index=member.index, member_id=member.member_id,
                                valid=False, failure="overloaded", error=refusal, replica=self.name)
        self._outstanding_work += 1.0
        try:
            result = await self.assembler.submit(member.model_copy(update={"group_id": scoped}), route_key)
        except EngineDeadError as error:
            self._lose_engine(error)
            await self._answer_nothing()
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

    def _lose_engine(self, error: BaseException) -> None:
        """Take no more work and end this replica's process (see the module docstring)."""
        if self._engine_lost is not None:
            return
        self.lane.lose(error)
        loop = asyncio.get_running_loop()
        self._engine_lost = loop.create_future()
        logger.error(
            "replica %s: engine lost (%s: %s); ending the replica: its calls are re-sent to live replicas "
            "and Serve starts a new one",
            self.name,
            type(error).__name__,
            error,
        )
        self._ending = loop.create_task(self._end_process(), name="end-replica")

    async def _end_process(self) -> NoReturn:
        # Meanwhile the records of groups already answered reach the ledger (bounded), for the
        # members whose answers this process's end cuts off.
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

    async def _answer_nothing(self) -> NoReturn:
        """Hold a call until the process ends: a replica without an engine answers nothing, not
        even an error, so that its callers see a dead replica and re-send the call elsewhere."""
        assert self._engine_lost is not None
        await asyncio.shield(self._engine_lost)
        raise AssertionError("unreachable: the replica process ends first")

    async def _sleep_when_idle(self) -> None:
        """Put the engine to sleep while this replica has nothing for it, and wake it for work: groups
        queued, or an announced phase known here about to send groups (cluster/engine_sleep.py)."""
        assert self.lane.sleeper is not None
        while self._engine_lost is None:
            await asyncio.sleep(SLEEP_CHECK_S)
            try:
                await self.lane.tend_sleep(self.demands)
            except EngineDeadError as error:
                self._lose_engine(error)
                return
            except Exception as error:  # noqa: BLE001 - a failed sleep leaves the engine awake: it serves on
                logger.warning("replica %s: engine sleep/wake failed: %r", self.name, error)
            self.metrics.engine_sleeping.set(1.0 if self.lane.sleeper.sleeping else 0.0)

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

    def announce_demand(self, announcement: DemandAnnouncement, attempt: int = 0,
                        target_replica: str | None = None) -> DemandAccepted:
        """Remember work a tenant expects to send (its next generation phase), for the autoscaling
        policy. A tenant's announcements go to one replica (its ring owner) and the latest counts
        wherever earlier ones are kept; one of 0 groups withdraws them (kept as such for a minute:
        ``cluster/announced_demand.py``)."""
        self.keep_demand(demand_of(announcement, time.time()))
        return DemandAccepted(replica=self.name, tenant=announcement.tenant, groups=announcement.groups)

    def keep_demand(self, demand: Demand, target_replica: str | None = None) -> None:
        """Keep a tenant's announced demand unless a later one is kept already (a replica handing on
        the demands the new ring places here calls this; ``target_replica`` is read by the router)."""
        self.demands.keep(demand)

    async def check_health(self) -> None:
        """Serve calls this periodically; raising makes Serve replace the replica.

        A failed check is the engine's loss: the replica ends at once instead of serving on
        until Serve has seen enough failed checks in a row.
        """
        if self._engine_lost is not None:
            raise EngineDeadError(f"replica {self.name} lost its engine")
        hang_timeout_s = self.config.replicas.hang_timeout_s
        try:
            try:
                await asyncio.wait_for(self.engine.check_health(), hang_timeout_s)
            except asyncio.TimeoutError as timeout:
                raise EngineDeadError(f"the engine did not answer a health probe within {hang_timeout_s} s") from timeout
        except Exception as error:
            self._lose_engine(error)
            raise

    async def takes_members(self, target_replica: str | None = None) -> str:
        """A peer's probe before it hands this replica members: a replica that lost its engine answers
        nothing (as to members), so its peer keeps them rather than hand them to a process about to
        end (they would come back ``moved`` and cost their callers an attempt)."""
        if self._engine_lost is not None:
            await self._answer_nothing()
        return self.name

    def info(self, target_replica: str | None = None) -> dict[str, Any]:
        """What this replica runs (``target_replica`` lets the router address one replica)."""
        return {
            "replica": self.name,
            "pid": os.getpid(),
            "model": self.config.engine.model,
            "engine": self.config.engine.kind,
            "prompt_type": self.config.scoring.prompt_type,
            **self.config.engine.parallelism(),
            "groups_scored": self.lane.groups_scored,
            "cold_start_s": self.cold_start_s,  # construction to serving, as the policy reads it
            # Resident memory of this replica process now, and its peak so far (Linux: KiB).
            "rss_bytes": _current_rss_bytes(),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "assembler": self.assembler.stats(),
            "engine_sleep": None if (sleeper := self.lane.sleeper) is None else {
                "sleeping": sleeper.sleeping, "sleeps": sleeper.sleeps, "wakes": sleeper.wakes,
                "woken_for_work": sleeper.woken_for_work},
        }

    def recent_groups(self, since: float | None = None, target_replica: str | None = None) -> list[dict[str, Any]]:
        """The groups this replica scored lately, oldest first, with their tenant and times (Unix seconds
        on this replica's clock): when the first member was sent and arrived, when the group was
        complete, when its scoring started and ended (``since``: scoring ended at or after).
        For diagnostics and tests; ``target_replica`` lets the router address one replica."""
        traces = []
        for trace in self.assembler.recent_groups(since):
            tenant, group_id = unscoped_group_id(trace.group_id)
            traces.append({**dataclasses.asdict(trace), "group_id": group_id, "tenant": tenant})
        return traces

    def tenants(self, target_replica: str | None = None) -> dict[str, dict[str, Any]]:
        """Each active tenant's work on this replica now and what the engine served it lately."""
        stats = self.lane.gate.stats()
        collecting = self.assembler.members_collecting()
        report = {}
        for name in set(stats) | self.in_flight.tenants() | set(collecting):
            gate = stats.get(name, GateStats())
            report[name] = {"groups_in_flight": self.in_flight.count(name),
                            "members_waiting": collecting.get(name, 0), "waiting_for_engine": gate.waiting,
                            "at_engine": gate.running, "recent_groups": gate.recent_groups,
                            "recent_tokens": gate.recent_tokens}
        return report

    async def _release(self) -> None:
        """Close the assembler, stop the engine and then disarm the process guard, whichever exist (a
        construction may have failed before either); never raises: a failed step is logged and the
        next one still runs."""
        assembler = getattr(self, "assembler", None)
        engine = getattr(self, "engine", None)
        ring = getattr(self, "ring", None)
        if ring is not None:
            ring.stop()
        sleep_loop = getattr(self, "_sleep_loop", None)
        if sleep_loop is not None:
            sleep_loop.cancel()
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
