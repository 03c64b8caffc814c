"""SIMULATED: a discrete-time model of a reward pool scoring GRPO runs' groups (no Ray, no engine).

Each run is a schedule of steps: a generation phase whose groups complete at given times, then a
training phase with no rewards. A pool of replicas scores complete groups first come, first served,
one group at a time per replica, each taking ``seconds_per_group``; a replica asked for serves after
``cold_start_s``. Its size is fixed, or decided every second by the project's own autoscaling
decision (:func:`cluster.autoscaling.decide_replicas`, the function Serve's controller calls) fed the
runs' demand announcements as their clients make them (``cluster.demand_forecast``), or by a model of
Ray Serve's default policy. Idle replicas may sleep (``replicas.autoscaling.idle: sleep``) by
``cluster/engine_sleep.py``'s decision.

Used by ``bench/autoscaling_sim.py`` (synthetic runs at scale) and ``grrm plan`` (recorded or synthetic
traces, ``cluster/planning/trace.py``).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from cluster.autoscaling import Demand, ReplicaLoad, ScalingSettings, decide_replicas
from cluster.demand_forecast import PhaseForecaster
from cluster.engine_sleep import sleep_action
from cluster.planning.trace import RunTrace
from cluster.routing import HashRing

TICK_S = 1.0
Routing = Literal["shared", "ring"]


@dataclass(frozen=True)
class ServeDefault:
    """A model of Ray Serve's default autoscaling policy (``replica_queue_length_autoscaling_policy``):
    as many replicas as the ongoing requests averaged over ``look_back_s``, divided by ``target``,
    applied once the wish has held for the up or down delay. Ongoing requests are every member
    sent and not yet answered, those waiting for group-mates included (what Serve counts)."""

    target: int = 64  # grrm.yaml before the project's policy
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 300.0
    look_back_s: float = 30.0
    max_replicas: int = 64

    def decide(self, now: float, current: int, ongoing: float, state: dict) -> int:
        history = state.setdefault("ongoing", deque())
        history.append((now, ongoing))
        while history[0][0] <= now - self.look_back_s:
            history.popleft()
        wished = max(1, min(self.max_replicas, math.ceil(statistics.mean(value for _, value in history) / self.target)))
        direction = (wished > current) - (wished < current)
        if direction != state.get("direction"):  # a new wish, or one the other way: its delay starts now
            state["direction"], state["since"] = direction, now
        delay = self.upscale_delay_s if direction > 0 else self.downscale_delay_s
        if direction == 0 or now - state["since"] < delay:
            return current
        state["direction"] = None  # applied: the next wish waits its whole delay
        return wished


@dataclass
class Run:
    """One GRPO run's schedule: when each step's groups complete."""

    name: str
    offset_s: float
    steps: int
    groups: int
    group_size: int
    generation_s: float
    training_s: float
    completions: list[list[float]] = field(default_factory=list)  # per step, group completion times
    # Per step, each group's engine seconds in completions' order (None: the pool's seconds per group);
    # empty: every group costs the pool's figure.
    work_s: list[list[float | None]] = field(default_factory=list)
    rollouts: list[float] = field(default_factory=list)  # every rollout's finish time, in order
    # (announced at, what): the run's demand announcements, as its trainer's client makes them.
    announcements: list[tuple[float, Demand]] = field(default_factory=list)
    # A recorded run's step starts and its end (steps + 1 times); empty: every step as long as the first.
    step_starts: list[float] = field(default_factory=list)

    @classmethod
    def from_trace(cls, trace: RunTrace, offset_s: float = 0.0) -> Run:
        """A run that replays ``trace`` (its clock shifted so its first step starts at ``offset_s``):
        its groups complete when the trace says, and it announces as its client would have."""
        first = trace.steps[0]
        shift = offset_s - first.start_s
        run = cls(trace.run, offset_s=offset_s, steps=len(trace.steps), groups=len(first.groups),
                  group_size=trace.group_size, generation_s=first.generation_s, training_s=first.training_s)
        run.step_starts = [step.start_s + shift for step in trace.steps]
        last = trace.steps[-1]
        run.step_starts.append(last.start_s + shift + last.generation_s + last.training_s)
        for step, start in zip(trace.steps, run.step_starts):
            groups = sorted(step.groups, key=lambda group: group.complete_at)
            run.completions.append([start + group.complete_at for group in groups])
            run.work_s.append([group.work_s for group in groups])
            run.rollouts.extend(start + at for group in step.groups for at in group.members_at)
        run.rollouts.sort()
        run.announcements = run.announce()
        return run

    def build(self, rng: random.Random) -> Run:
        for step in range(self.steps):
            start = self.phase_start(step)
            finishes = [[start + self.generation_s * rng.random() for _ in range(self.group_size)]
                        for _ in range(self.groups)]
            self.completions.append(sorted(max(group) for group in finishes))
            self.rollouts.extend(finish for group in finishes for finish in group)
        self.rollouts.sort()
        self.announcements = self.announce()
        return self

    def announce(self) -> list[tuple[float, Demand]]:
        """What the client announces: the first step while the trainer starts (it knows its batch and
        phase length, not yet when in the phase the groups come: the prior), then, from the rollouts
        it sees, each phase as it opens and the next one ahead (grrm_client/demand.py's forecast)."""
        forecaster = PhaseForecaster(self.groups, gap_s=10.0, first_phase_s=self.generation_s, group_size=self.group_size)
        start = self.phase_start(0)
        announced = [(start - self.training_s,
                      Demand(self.name, self.groups, start, start + self.generation_s, start - self.training_s,
                             forecaster.profile()))]
        for finish in self.rollouts:
            forecast = forecaster.arrive(finish)
            if forecast is None:
                continue
            announced.append((finish, Demand(self.name, self.groups, finish, finish + forecast.lasts_s, finish,
                                             forecast.profile)))
            ahead = forecast.next_announcement()
            if ahead is not None:
                at, starts_in_s = finish + ahead[0], ahead[1]
                announced.append((at, Demand(self.name, self.groups, at + starts_in_s,
                                             at + starts_in_s + forecast.lasts_s, at, forecast.profile)))
        return sorted(announced, key=lambda pair: pair[0])

    def phase_start(self, step: int) -> float:
        if self.step_starts:
            return self.step_starts[step]
        return self.offset_s + step * (self.generation_s + self.training_s)

    def end_s(self) -> float:
        return self.phase_start(self.steps)


def simulate(runs: list[Run], replicas_of, seconds_per_group: float, cold_start_s: float,
             settings: ScalingSettings | None, serve_default: ServeDefault | None = None,
             routing: Routing = "shared") -> dict:
    """Score every run's groups on pools: ``replicas_of`` maps a run to its pool's name; a pool with
    ``settings`` is elastic by the project's decision (every tick), one with ``serve_default`` by the
    model of Serve's default policy (from ``replicas_of``'s size up to its ``max_replicas``), else fixed
    at its starting size. ``routing``: ``shared``, one queue any free replica takes from (an ideal
    pool); ``ring``, as the service assembles, each group on the serving replica its id hashes to on the
    routers' consistent-hash ring (``cluster.routing.HashRing``), re-placed when the serving set changes
    (the hand-off of groups not yet begun), so a replica idles while another has a queue."""
    arrivals = sorted((time, run.name, step, run.work_s[step][number] if run.work_s else None,
                       f"{run.name}/{step}/{number}")
                      for run in runs for step, times in enumerate(run.completions)
                      for number, time in enumerate(times))
    pools: dict[str, dict] = {}
    for run in runs:
        name, size = replicas_of(run)
        pool = pools.setdefault(name, {"size": size, "starting": [], "free_at": [], "asleep": [], "busy_until": [],
                                       "queue": [], "answered": [], "answered_groups": 0,
                                       "state": {}, "replica_seconds": 0.0, "asleep_seconds": 0.0, "timeline": [],
                                       "runs": []})
        pool["runs"].append(run)
    for pool in pools.values():
        pool["free_at"] = [0.0] * pool["size"]  # the first replicas are up from the start
        pool["asleep"] = [False] * pool["size"]
        pool["busy_until"] = [0.0] * pool["size"]  # when each replica last finished work (idle since)
        pool["ids"] = [f"replica-{number}" for number in range(pool["size"])]  # names on the ring
        pool["started"] = pool["size"]
    last_scored: dict[tuple[str, int], float] = {}
    horizon = max(run.end_s() for run in runs) + 600
    index, now = 0, 0.0
    pool_of = {run.name: replicas_of(run)[0] for run in runs}
    while now < horizon:
        # Groups completing within this tick are queued now and start when they complete: a replica free
        # at 7.0 scores a group complete at 7.3 from 7.3, not from the next tick (a 0.5 s bias on average).
        while index < len(arrivals) and arrivals[index][0] < now + TICK_S:
            at, run_name, step, work, key = arrivals[index]
            # A group's own measured cost where its trace has one, else the pool's figure.
            work = seconds_per_group if work is None else work
            heapq.heappush(pools[pool_of[run_name]]["queue"], (at, run_name, step, work, key))
            index += 1
        for pool in pools.values():
            started = [ready for ready in pool["starting"] if ready <= now]
            pool["free_at"].extend(started)
            pool["asleep"].extend([False] * len(started))
            pool["busy_until"].extend(started)
            pool["ids"].extend(f"replica-{pool['started'] + number}" for number in range(len(started)))
            pool["started"] += len(started)
            pool["starting"] = [ready for ready in pool["starting"] if ready > now]
            sleeps = settings is not None and settings.idle == "sleep"
            if sleeps:
                wake(pool, now, settings, pool["runs"])
            # Serve each free (awake) replica's next group within this tick: any queued group, or (ring)
            # only those the ring places on it.
            queues = owned_queues(pool) if routing == "ring" else None
            for slot, free in enumerate(pool["free_at"]):
                if pool["asleep"][slot]:
                    continue
                queue = pool["queue"] if queues is None else queues.get(pool["ids"][slot], [])
                free = max(free, now)
                while queue and free < now + TICK_S:
                    at, run_name, step, work, _ = heapq.heappop(queue)
                    free = max(free, at) + work
                    heapq.heappush(pool["answered"], free)
                    last_scored[(run_name, step)] = max(last_scored.get((run_name, step), 0.0), free)
                    pool["busy_until"][slot] = free
                pool["free_at"][slot] = free
            if queues is not None:
                pool["queue"] = [entry for queue in queues.values() for entry in queue]
                heapq.heapify(pool["queue"])
            if sleeps:
                fall_asleep(pool, now, settings, pool["runs"])
            running = len(pool["free_at"]) + len(pool["starting"])
            pool["replica_seconds"] += running * TICK_S
            pool["asleep_seconds"] += sum(pool["asleep"]) * TICK_S
            waiting = [entry for entry in pool["queue"] if entry[0] <= now]  # complete by now: what replicas report
            pool["timeline"].append((now, running, len(waiting)))
            if settings is not None:
                busy = sum(1 for free in pool["free_at"] if free > now)
                # Queued groups at their own cost, running ones at the pool's figure.
                queued_s = sum(entry[3] for entry in waiting) + busy * seconds_per_group
                load = ReplicaLoad(groups_waiting=len(waiting), groups_running=busy, queued_work_s=queued_s,
                                   members_waiting=members_waiting(pool["runs"], now),
                                   seconds_per_group=seconds_per_group)
                decision = decide_replicas(now=now, current=running, loads=[load], demands=demands(pool["runs"], now),
                                           settings=settings, state=pool["state"], serving=len(pool["free_at"]))
                pool["state"] = decision.state
                resize(pool, decision.replicas, now, cold_start_s)
            elif serve_default is not None:
                while pool["answered"] and pool["answered"][0] <= now:
                    heapq.heappop(pool["answered"])
                    pool["answered_groups"] += 1
                ongoing = rollouts_arrived(pool["runs"], now) - pool["answered_groups"] * pool["runs"][0].group_size
                resize(pool, serve_default.decide(now, running, ongoing, pool["state"]), now,
                       cold_start_s)
        now += TICK_S
        if index >= len(arrivals) and all(not pool["queue"] for pool in pools.values()) and now > max(
                run.end_s() for run in runs):
            break
    exposure = [last_scored[(run.name, step)] - max(run.completions[step]) for run in runs for step in range(run.steps)]
    asleep_seconds = sum(pool["asleep_seconds"] for pool in pools.values())
    return {"replica_seconds": sum(pool["replica_seconds"] for pool in pools.values()),
            "asleep_replica_seconds": asleep_seconds,
            "exposed_s_mean": statistics.mean(exposure), "exposed_s_max": max(exposure),
            "timelines": {name: pool["timeline"] for name, pool in pools.items()}}


def owned_queues(pool: dict) -> dict[str | None, list]:
    """The pool's queued groups by the serving replica the ring places each on, each a heap."""
    ids = tuple(pool["ids"])
    if pool.get("ring_of") != ids:
        pool["ring"], pool["ring_of"] = HashRing(ids), ids
    queues: dict[str | None, list] = {}
    for entry in pool["queue"]:
        queues.setdefault(pool["ring"].owner(entry[4]), []).append(entry)
    for queue in queues.values():
        heapq.heapify(queue)
    return queues


def rollouts_arrived(runs: list[Run], now: float) -> int:
    """The runs' rollouts finished by ``now`` (each a member sent to the pool)."""
    return sum(bisect.bisect_right(run.rollouts, now) for run in runs)


def members_waiting(runs: list[Run], now: float) -> int:
    """Members sent by ``now`` whose group is not complete yet (waiting for group-mates)."""
    complete = sum(run.group_size * bisect.bisect_right(times, now) for run in runs for times in run.completions)
    return rollouts_arrived(runs, now) - complete


def known_to(slot: int, replicas: int, runs: list[Run], now: float) -> list[Demand]:
    """The announcements replica ``slot`` holds: those of the runs it owns (one replica per run)."""
    return demands([run for index, run in enumerate(runs) if index % replicas == slot], now)


def wake(pool: dict, now: float, settings: ScalingSettings, runs: list[Run]) -> None:
    """Wake sleeping replicas (``cluster/engine_sleep.py``'s decision): the owner of a run ahead of its
    announced groups, and one for each queued group no awake replica takes at once (the service's
    ring spreads groups over every replica, sleeping ones included; the group waits for the wake-up)."""
    unserved = len(pool["queue"]) - sum(1 for slot, free in enumerate(pool["free_at"])
                                        if not pool["asleep"][slot] and free <= now)
    for slot, asleep in enumerate(pool["asleep"]):
        if not asleep:
            continue
        action = sleep_action(now=now, sleeping=True, busy=unserved > 0, idle_since=None,
                              demands=known_to(slot, len(pool["asleep"]), runs, now), settings=settings,
                              margin_s=TICK_S)
        if action == "wake":
            pool["asleep"][slot] = False
            pool["free_at"][slot] = pool["busy_until"][slot] = now + settings.wake_s  # it serves once awake
            unserved -= 1


def fall_asleep(pool: dict, now: float, settings: ScalingSettings, runs: list[Run]) -> None:
    """Put awake replicas with nothing to do since ``sleep_after_s`` to sleep (a replica is idle
    since it finished its last group, woke or started)."""
    for slot, until in enumerate(pool["busy_until"]):
        if pool["asleep"][slot]:
            continue
        busy = until > now or bool(pool["queue"])
        action = sleep_action(now=now, sleeping=False, busy=busy, idle_since=None if busy else until,
                              demands=known_to(slot, len(pool["asleep"]), runs, now), settings=settings,
                              margin_s=TICK_S)
        if action == "sleep":
            pool["asleep"][slot] = True


def demands(runs: list[Run], now: float) -> list[Demand]:
    """Each run's latest announcement by ``now`` (the service keeps a tenant's latest)."""
    latest = []
    for run in runs:
        made = [demand for at, demand in run.announcements if at <= now]
        if made:
            latest.append(made[-1])
    return latest


def resize(pool: dict, target: int, now: float, cold_start_s: float) -> None:
    """Start replicas (up after a cold start) or stop idle ones, sleeping ones first, newest first."""
    running = len(pool["free_at"]) + len(pool["starting"])
    if target > running:
        pool["starting"].extend([now + cold_start_s] * (target - running))
    while target < len(pool["free_at"]) + len(pool["starting"]):
        if pool["starting"]:
            pool["starting"].pop()
        else:
            idle = [slot for slot, free in enumerate(pool["free_at"]) if free <= now]
            if not idle:
                break
            gone = ([slot for slot in idle if pool["asleep"][slot]] or idle)[-1]
            pool["free_at"].pop(gone)
            pool["asleep"].pop(gone)
            pool["busy_until"].pop(gone)
            pool["ids"].pop(gone)
