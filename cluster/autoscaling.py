"""How many scorer replicas the pool needs: scaled on engine work and announced demand (pure, no Ray).

Ray Serve's default policy scales on ongoing requests. For GRRM most of those are members waiting
for their group-mates (a GRPO group's rollouts finish minutes apart): they cost no engine work, yet
they would grow the pool, and the new replicas would split the very groups they wait on. This
policy counts only what the engines have to do, and what the trainers say is coming:

- **engine work**: each replica reports the groups waiting for its engine and at it, and the
  seconds of work they hold (their tokens over the replica's measured throughput). The pool keeps
  enough replicas that this backlog drains within ``target_backlog_s``.
- **announced demand**: a trainer knows at the start of a generation phase how many groups are
  coming and roughly when the phase ends (:class:`Demand`). The pool grows *before* the burst so
  that groups arriving at that rate are scored as they come, and keeps that size until the phase
  is over, counting a replica's cold start. A phase counts from when its expected work reaches
  ``target_backlog_s`` (its first groups, fewer than a replica may hold queued, start none ahead
  beyond one: a pool that may empty has one replica serving by a phase's first group), and the
  cold start is the one the policy measured (from asking for replicas to all of them serving) once
  it has, the configured ``cold_start_s`` before.
- members waiting for group-mates are reported apart (``members_waiting``): a forecast, never load.

Scaling up happens as soon as it is needed; scaling down only after the lower count has been
enough for ``downscale_delay_s`` and never below what an announced phase starting within a cold
start needs. One exception to the delay: while a trainer's announcement says when its work comes
next, an idle pool (no group queued or running, no member waiting for group-mates) drops what that
demand does not need at once when every announced phase is still ahead (a trainer announces its next
phase once its current one is done), and after ``idle_downscale_delay_s`` within an announced phase
(its quiet start, a lull); either way it keeps what announced work needs within two cold starts (a
replica dropped just before it is asked for again saves little and churns the pool). The downscale
delay guards against a noisy load signal; an idle pool between announced phases is not noise, and
holding its replicas for the delay after every step costs replica-seconds each step. A pool no
trainer announces to keeps the full delay.

With ``idle="sleep"`` a replica the pool no longer needs may sleep instead of being removed (its
engine's weights offloaded and KV cache freed, woken in ``wake_s``; the replicas put their engines to
sleep themselves: ``cluster/engine_sleep.py``). Keeping it asleep costs ``sleeping_cost`` of an
awake replica per second; removing it and starting another later costs ``cold_start_s`` of a replica
that holds its GPU without serving, where waking costs ``wake_s``. So the pool keeps, asleep, the
replicas an announced need within the break-even horizon ``(cold_start_s - wake_s) /
sleeping_cost`` will use, and removes the rest as before.

The same function decides in the Serve policy (``deployments/autoscaling_policy.py``) and in the
simulator (``bench/autoscaling_sim.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "OTHER_TENANTS",
    "Demand",
    "EngineWorkMeter",
    "ReplicaLoad",
    "ScalingDecision",
    "ScalingSettings",
    "break_even_s",
    "cold_start_s",
    "decide_replicas",
    "measured_leads",
    "queued_groups",
    "replicas_for_demand",
]


# The share of a replica's request slots in use from which callers' requests may queue for want of them.
SATURATED_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What one replica reports: its engine's work now, and what only waits."""

    groups_waiting: float = 0.0  # complete groups waiting for the engine
    groups_running: float = 0.0  # groups the engine is generating for now
    queued_work_s: float = 0.0  # estimated seconds of engine work in those groups
    members_waiting: float = 0.0  # members waiting for their group-mates: a forecast, never load
    seconds_per_group: float | None = None  # measured engine seconds per group (None: nothing scored yet)
    sleeping: bool = False  # its engine sleeps (idle="sleep"): it serves again after a wake-up, not a cold start
    # Its request slots are (nearly) all taken: only then do callers' requests queue because of it.
    saturated: bool = False
    # Mean members of the groups it scored (None: none yet): how many queued member requests make a group.
    members_per_group: float | None = None
    # Seconds this replica took from its construction to serving (its engine's load): a measured cold start.
    cold_start_s: float | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    """Announced work: ``groups`` groups of ``tenant`` arriving between ``starts_at`` and ``ends_at``
    (Unix seconds), e.g. one GRPO step's generation phase (prompts x 1 group each).

    ``profile``: the share of the groups that arrive in each of equal slices of the phase, in order
    (empty: evenly). A GRPO group is complete at its *last* rollout, so completions crowd the end of
    a phase; a client that has seen its earlier phases says so (``cluster/demand_forecast.py``), and
    the pool grows for the crowd, a cold start before it, instead of for the phase's mean rate."""

    tenant: str
    groups: int
    starts_at: float
    ends_at: float
    # When it was announced: a tenant's later announcement replaces its earlier ones wherever they
    # are kept; one of 0 groups withdraws them.
    announced_at: float = 0.0
    profile: tuple[float, ...] = ()
    # How many tenants' announcements it stands for: 1, or more in the merged tail of a report that names only
    # its largest tenants (cluster/demand_report.py; its tenant is OTHER_TENANTS).
    tenants: int = 1

    def span_s(self) -> float:
        """How long the phase lasts, at least one second (its rate and slices are over this)."""
        return max(1.0, self.ends_at - self.starts_at)

    def rate(self) -> float:
        """Groups per second while the phase lasts, on average."""
        return self.groups / self.span_s()

    def groups_between(self, start: float, end: float) -> float:
        """How many of its groups are expected to arrive between ``start`` and ``end``: the profile's
        shares of the slices that overlap, pro rata (evenly without a profile)."""
        length = self.span_s()
        low, high = max(start, self.starts_at), min(end, self.starts_at + length)
        if high <= low:
            return 0.0
        total = sum(self.profile)
        if not self.profile or total <= 0:
            return self.groups * (high - low) / length
        slice_s = length / len(self.profile)
        expected = 0.0
        for position, share in enumerate(self.profile):
            begins = self.starts_at + position * slice_s
            overlap = min(begins + slice_s, high) - max(begins, low)
            if overlap > 0:
                expected += share / total * overlap / slice_s
        return self.groups * expected

    def reaches(self, groups: float) -> float:
        """When the expected groups since the phase's start first reach ``groups`` (inf: never, the whole
        phase expects fewer)."""
        if groups <= 0:
            return self.starts_at
        if groups > self.groups:
            return math.inf
        length = self.span_s()
        total = sum(self.profile)
        if not self.profile or total <= 0:
            return self.starts_at + length * groups / self.groups
        slice_s, before = length / len(self.profile), 0.0
        for position, share in enumerate(self.profile):
            expected = self.groups * share / total
            if expected > 0 and before + expected >= groups:
                return self.starts_at + slice_s * (position + (groups - before) / expected)
            before += expected
        return self.starts_at + length

    def in_progress(self, now: float, grace_s: float) -> bool:
        """Whether the phase is on at ``now``: started, and not more than ``grace_s`` past its end."""
        return self.starts_at <= now <= self.ends_at + grace_s

    def peak_rate(self, start: float, end: float) -> float:
        """The highest arrival rate (groups per second) in any slice of the phase that overlaps
        [start, end]; 0 when none does."""
        if end < self.starts_at or start > self.ends_at:
            return 0.0
        if not self.profile:
            return self.rate()
        total = sum(self.profile)
        slice_s = self.span_s() / len(self.profile)
        first = int(max(0.0, start - self.starts_at) // slice_s)
        last = int(max(0.0, min(end, self.ends_at) - self.starts_at) // slice_s)  # end may be far (inf)
        shares = self.profile[min(first, len(self.profile) - 1): min(last, len(self.profile) - 1) + 1]
        return self.groups * max(shares) / total / slice_s if total > 0 else self.rate()


# The tenant of a demand merged from several tenants' announcements: no tenant's name (TENANT_PATTERN has no spaces).
OTHER_TENANTS = "(other tenants)"


@dataclass(frozen=True, slots=True)
class ScalingSettings:
    """The knobs of :func:`decide_replicas` (``replicas.autoscaling`` in the app config): their defaults are
    declared here only; the app config's ``AutoscalingSettings`` takes its defaults from these."""

    min_replicas: int = 1
    max_replicas: int = 1
    # Engine work a replica may hold queued before another one is worth starting.
    target_backlog_s: float = 10.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0
    # With an announcement in effect, how long the pool must be idle before it drops what the announced
    # demand does not need (instead of downscale_delay_s).
    idle_downscale_delay_s: float = 5.0
    # How long a new replica takes to serve (engine load included); the lead time for announced work.
    cold_start_s: float = 60.0
    # Engine seconds per group until a replica has measured its own.
    default_seconds_per_group: float = 2.0
    # Extra capacity over the announced rate of a phase's busiest slice: arrivals within it are not even.
    demand_headroom: float = 1.5
    # An announced phase keeps its replicas this long after its end, for its last groups.
    demand_grace_s: float = 10.0
    # What becomes of a replica the pool no longer needs: "stop" (removed) or "sleep" (its engine
    # sleeps; kept while an announced need comes within the break-even horizon, see break_even_s).
    idle: Literal["stop", "sleep"] = "stop"
    # How long a sleeping engine takes to serve again (vLLM sleep mode level 1: weights from CPU memory).
    wake_s: float = 10.0
    # A sleeping replica's cost relative to an awake one (its GPU is held, its memory free for other work).
    sleeping_cost: float = 0.1
    # Seconds an engine has had nothing queued or running before it sleeps (idle="sleep").
    sleep_after_s: float = 30.0
    # The most replicas one tenant's announced demand may claim (None: no cap below max_replicas), and the
    # tenants with a cap of their own, as (tenant, replicas) pairs: so that no tenant's announcement holds the
    # whole pool. The app config sets both (tenants.default and http.tenants: max_announced_replicas).
    max_announced_replicas: int | None = None
    tenant_max_announced_replicas: tuple[tuple[str, int], ...] = ()

    def announced_replicas_cap(self, demand: Demand) -> float:
        """The most replicas ``demand`` may claim: its tenant's cap (inf: none); a merged demand's, each of its
        tenants at the default cap (a tenant with a cap of its own is among the largest, reported by name)."""
        if demand.tenant != OTHER_TENANTS:
            for tenant, replicas in self.tenant_max_announced_replicas:
                if tenant == demand.tenant:
                    return float(replicas)
        if self.max_announced_replicas is None:
            return math.inf
        return float(self.max_announced_replicas * max(1, demand.tenants))


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """The replica count to ask for, why, and the state to hand to the next decision."""

    replicas: int
    reason: str
    state: dict[str, float] = field(default_factory=dict)
    engine_work_s: float = 0.0
    for_work: int = 0
    for_demand: int = 0
    kept_asleep: int = 0  # replicas kept (asleep while idle) for an announced need within the break-even horizon
    sleeping: int = 0  # replicas that report a sleeping engine
    cold_start_s: float = 0.0  # the cold start announced work was planned with (measured, or configured)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def seconds_per_group(loads: Iterable[ReplicaLoad], default: float) -> float:
    """The pool's engine seconds per group: the median of the replicas' measurements, or ``default``."""
    measured = [load.seconds_per_group for load in loads if load.seconds_per_group]
    return _median(measured) if measured else default


MEASURED_LEADS = 3  # the pool's last measured cold starts kept (the longest counts)


def cold_start_s(loads: Iterable[ReplicaLoad], configured: float, leads: Iterable[float] = ()) -> float:
    """How long a new replica takes to serve.

    ``leads``: what the policy measured itself, from asking for more replicas to all of them serving
    (scheduling, a node to add, the engines' load: all of it); the longest of them, once there is
    one, replaces the configured ``cold_start_s`` (a replica late for a burst delays every group queued
    meanwhile, one early costs only its own seconds). Before, the configured value, or the median the replicas
    measured of their own construction where that is longer (a replica sees only its own load, not the
    scheduling before it, so there the configured value is the floor). Either way the replicas' own
    measurement can only raise it."""
    measured = [load.cold_start_s for load in loads if load.cold_start_s]
    leads = list(leads)
    base = max(leads) if leads else configured
    return max(base, _median(measured)) if measured else base


def measured_leads(state: dict[str, float]) -> list[float]:
    """The cold starts the policy measured, kept in its state (``lead/<n>``)."""
    return [value for key, value in state.items() if key.startswith("lead/")]


ASKED = "asked/"  # policy state: asked/<count> = when the pool asked for that many replicas, until they serve


def _asked(state: dict[str, float]) -> dict[str, int]:
    """The counts the pool asked for and is timing, by their state key."""
    return {key: int(key[len(ASKED):]) for key in state if key.startswith(ASKED)}


def _measure_lead(state: dict[str, float], now: float, serving: int) -> None:
    """For each replica count the pool asked for that now serves, keep how long that took (the oldest of
    ``MEASURED_LEADS`` kept gives way): a burst needs all the replicas asked for, and several starting at once
    take longer than one (on a node's shared CPUs, disks and network)."""
    for key, asked in _asked(state).items():
        if serving >= asked:
            count = int(state.get("leads_measured", 0))
            state[f"lead/{count % MEASURED_LEADS}"] = now - state.pop(key)
            state["leads_measured"] = count + 1


def _note_ask(state: dict[str, float], now: float, current: int, serving: int, replicas: int) -> None:
    """Start timing a cold start when the pool asks for more replicas than it has and than serve; stop timing
    counts it no longer asks for (it asked for fewer meanwhile)."""
    for key, asked in _asked(state).items():
        if asked > replicas:
            state.pop(key)
    if replicas > current and replicas > serving:
        state.setdefault(f"{ASKED}{replicas}", now)


def engine_work(load: ReplicaLoad, per_group_s: float) -> float:
    """A replica's queued engine seconds: its own estimate, or its groups at the pool's cost per group
    while it has measured nothing (a fresh replica's first burst still counts)."""
    if load.seconds_per_group is None:
        return (load.groups_waiting + load.groups_running) * per_group_s
    return load.queued_work_s


def replicas_for_demand(demands: Iterable[Demand], now: float, per_group_s: float, settings: ScalingSettings,
                        ahead_s: float | None = None) -> int:
    """Replicas that score the announced groups as they arrive: for each phase, its busiest slice
    from now until ``ahead_s`` ahead (default a cold start: a replica asked for now serves from then
    on, so it is asked for one cold start before its slice), and after the phase's end, for
    ``demand_grace_s``, the rate of its last slice (its last groups).

    A phase counts only from when its expected work (with ``demand_headroom``) reaches
    ``target_backlog_s``: what comes before is less than one replica may hold queued, so no replica is
    started ahead for it (a GRPO phase's first groups are few: they would keep replicas idle through
    its quiet start). A phase whose whole work is less counts for nothing; its groups are scored as
    they come, as unannounced work is.

    Whatever its size, a phase has one replica serving by its first expected group: a pool that may
    empty (``min_replicas`` 0) starts it a cold start ahead, so no announced group waits for a cold
    start (those first groups would then be queued work when the crowd comes, and delay its last reward).

    Each tenant's replicas are clamped to its cap (``settings.announced_replicas_cap``) before they are added
    up: one tenant's announcement (10,000,000 groups over a day) claims its share, the others add their own."""
    ahead_s = settings.cold_start_s if ahead_s is None else ahead_s
    backlog_groups = settings.target_backlog_s / (per_group_s * settings.demand_headroom)
    replicas = 0.0
    first_groups = False  # a phase's first group comes within ahead_s (or it is on): one replica at least
    for demand in demands:
        if demand.groups > 0 and demand.reaches(1) - ahead_s <= now <= demand.ends_at + settings.demand_grace_s:
            first_groups = True
        counts_from = demand.reaches(backlog_groups)
        if counts_from == math.inf:
            rate = 0.0
        elif now <= demand.ends_at:
            begins = max(now, counts_from)
            rate = demand.peak_rate(begins, now + ahead_s) if begins <= now + ahead_s else 0.0
        elif now <= demand.ends_at + settings.demand_grace_s:
            rate = demand.peak_rate(demand.ends_at, demand.ends_at)
        else:
            rate = 0.0
        replicas += min(rate * per_group_s * settings.demand_headroom, settings.announced_replicas_cap(demand))
    return max(int(first_groups), math.ceil(replicas - 1e-9))


def break_even_s(settings: ScalingSettings) -> float:
    """How far ahead a need must come for a sleeping replica to cost less than removing it and
    starting another: asleep for T costs ``sleeping_cost * T`` replica-seconds, a cold start instead of
    a wake-up ``cold_start_s - wake_s`` (0: waking is no cheaper than a cold start)."""
    if settings.sleeping_cost <= 0:
        return math.inf
    return max(0.0, settings.cold_start_s - settings.wake_s) / settings.sleeping_cost


def decide_replicas(
    *,
    now: float,
    current: int,
    loads: list[ReplicaLoad],
    demands: list[Demand],
    settings: ScalingSettings,
    state: dict[str, float] | None = None,
    queued_at_callers: float = 0.0,
    serving: int | None = None,
) -> ScalingDecision:
    """The replica count for the pool now (see the module docstring).

    ``current`` is the count the deployment targets now; ``serving`` how many of its replicas serve
    (default: one per load reported); ``queued_at_callers`` requests queued in callers' handles
    (:func:`queued_groups`: engine work only while a replica is saturated, a group per its members);
    ``state`` what the previous decision
    returned (empty after a controller restart: the policy then waits a full downscale delay
    before it drops replicas, and measures its cold start again, and rebuilds the rest from the
    replicas' reports).
    """
    state = dict(state or {})
    serving = len(loads) if serving is None else serving
    _measure_lead(state, now, serving)
    decision = _decide(now, current, loads, demands, settings, state, queued_at_callers, serving)
    _note_ask(decision.state, now, current, serving, decision.replicas)
    return decision


def _decide(now: float, current: int, loads: list[ReplicaLoad], demands: list[Demand], settings: ScalingSettings,
            state: dict[str, float], queued_at_callers: float, serving: int) -> ScalingDecision:
    settings = dataclasses.replace(settings, cold_start_s=cold_start_s(loads, settings.cold_start_s,
                                                                       measured_leads(state)))
    per_group_s = seconds_per_group(loads, settings.default_seconds_per_group)
    engine_work_s = (sum(engine_work(load, per_group_s) for load in loads)
                     + queued_groups(loads, queued_at_callers, serving) * per_group_s)
    for_work = math.ceil(engine_work_s / settings.target_backlog_s - 1e-9)
    for_demand = replicas_for_demand(demands, now, per_group_s, settings)
    # With idle="sleep", the replicas running now that an announced need within the break-even horizon
    # will use stay, asleep meanwhile: never more than run now (none is started only to sleep).
    kept_asleep = 0
    if settings.idle == "sleep":
        kept_asleep = min(current, replicas_for_demand(demands, now, per_group_s, settings, break_even_s(settings)))
    # With min_replicas 0, the last replica stays while members wait on it for their group-mates: dropping
    # it would answer them "shutting down" and their re-sends would start a replica again (a cold start).
    # Requests queued at callers hold it too, saturated or not (they are on their way to it); at 0 they are
    # counted as work anyway.
    members_held = any(load.members_waiting for load in loads) or queued_at_callers > 0
    wanted = min(settings.max_replicas,
                 max(settings.min_replicas, int(members_held), for_work, for_demand, kept_asleep))
    details = dict(engine_work_s=engine_work_s, for_work=for_work, for_demand=for_demand, kept_asleep=kept_asleep,
                   sleeping=sum(1 for load in loads if load.sleeping), cold_start_s=settings.cold_start_s)
    # Idle: nothing for the engines, no member waiting for its group-mates (a group on its way), nothing queued
    # at callers, and a trainer has said when its work comes (between its phases, or in a lull of one).
    idle = bool(loads) and bool(demands) and engine_work_s == 0 and not members_held
    idle_for = now - state.setdefault("idle_since", now) if idle else 0.0
    if not idle:
        state.pop("idle_since", None)
    if wanted > current:
        state.pop("lower_since", None)
        since = state.setdefault("higher_since", now)
        if now - since >= settings.upscale_delay_s:
            state.pop("higher_since", None)
            return ScalingDecision(wanted, _why(wanted, for_work, for_demand, engine_work_s), state, **details)
        return ScalingDecision(current, f"holding {current} until the upscale delay has passed", state, **details)
    state.pop("higher_since", None)
    if wanted < current:
        since = state.setdefault("lower_since", now)
        # Idle while every announced phase is still ahead: the trainers have said their work comes later (a
        # trainer announces its next phase once this one is done), so the pool drops what that does not need at
        # once. Idle within a phase (its quiet start, a lull between groups) waits idle_downscale_delay_s.
        in_phase = any(demand.in_progress(now, settings.demand_grace_s) for demand in demands)
        if idle and idle_for >= (settings.idle_downscale_delay_s if in_phase else 0.0):
            # Never below what announced work needs within two cold starts, though: a replica dropped that
            # shortly before it is asked for again saves little of its cold start, and churns the pool.
            lower = max(wanted, min(current, replicas_for_demand(demands, now, per_group_s, settings,
                                                                 2 * settings.cold_start_s)))
            if lower < current:
                state.pop("lower_since", None)
                return ScalingDecision(lower, f"{_why(lower, for_work, for_demand, engine_work_s, kept_asleep)}; "
                                              + (f"idle for {idle_for:.0f} s within an announced phase" if in_phase
                                                 else "idle until the next announced phase"), state, **details)
        if now - since >= settings.downscale_delay_s:
            state.pop("lower_since", None)
            return ScalingDecision(wanted, _why(wanted, for_work, for_demand, engine_work_s, kept_asleep), state,
                                   **details)
        return ScalingDecision(current, f"holding {current}: {wanted} would do, not yet for the downscale delay",
                               state, **details)
    state.pop("lower_since", None)
    if kept_asleep == current > max(for_work, for_demand, settings.min_replicas):
        return ScalingDecision(current, _why(current, for_work, for_demand, engine_work_s, kept_asleep), state,
                               **details)
    return ScalingDecision(current, "steady", state, **details)


def queued_groups(loads: list[ReplicaLoad], queued_at_callers: float, serving: int | None = None) -> float:
    """The groups of engine work in requests queued at callers' handles (Serve's
    ``total_queued_requests``): none unless a replica is saturated (or none serves), since a burst of
    members routed one by one queues in the handles for a moment with every replica's slots free, and
    those members are only on their way to wait for group-mates; then each request is a member, and
    ``members_per_group`` of them (the replicas' mean, else 1) a group's work. ``serving``: replicas
    that serve (default: those reporting); one that serves but has not reported yet (an app just
    deployed) is not an empty pool: the queue is on its way to it, and its first report tells."""
    serving = len(loads) if serving is None else serving
    if queued_at_callers <= 0 or (loads and not any(load.saturated for load in loads)) or (not loads and serving):
        return 0.0
    sizes = [load.members_per_group for load in loads if load.members_per_group]
    return queued_at_callers / (sum(sizes) / len(sizes) if sizes else 1.0)


def _why(wanted: int, for_work: int, for_demand: int, engine_work_s: float, kept_asleep: int = 0) -> str:
    if kept_asleep == wanted > max(for_work, for_demand):
        return f"keeping {wanted} replicas, asleep while idle, for announced demand within the break-even horizon"
    if for_demand >= for_work and for_demand == wanted:
        return f"{wanted} replicas for the announced demand"
    if for_work == wanted:
        return f"{wanted} replicas for {engine_work_s:.1f} s of queued engine work"
    return f"{wanted} replicas (the configured bound)"


class EngineWorkMeter:
    """One replica's engine work: the groups queued for and at its engine, in estimated seconds.

    A group's cost is estimated when it is queued (its prompt tokens, roughly); what the engine then
    takes per estimated token, answers included, is measured over *busy* time (at least one group at
    the engine), so an idle replica does not look slow and long analyses count. Callers pass the
    clock (monotonic seconds).
    """

    def __init__(self) -> None:
        self.waiting = 0  # groups queued for the engine
        self.running = 0  # groups at the engine
        self.queued_tokens = 0.0  # estimated tokens of both
        self.groups_done = 0
        self.groups_seen = 0  # groups queued so far, and their members (the mean group size)
        self.members_seen = 0
        self.estimated_tokens_done = 0.0
        self.tokens_done = 0.0  # what the engine reported (prompt and answer)
        self.busy_s = 0.0
        self._busy_since: float | None = None

    def queued(self, estimated_tokens: float, members: int = 1) -> None:
        """A complete group of ``members`` now waits for the engine."""
        self.waiting += 1
        self.queued_tokens += estimated_tokens
        self.groups_seen += 1
        self.members_seen += members

    def started(self, now: float) -> None:
        """A waiting group went to the engine."""
        self.waiting -= 1
        self.running += 1
        if self._busy_since is None:
            self._busy_since = now

    def withdrawn(self, estimated_tokens: float) -> None:
        """A waiting group left before it reached the engine (its caller went away)."""
        self.waiting -= 1
        self.queued_tokens -= estimated_tokens

    def finished(self, now: float, estimated_tokens: float, used_tokens: float | None) -> None:
        """A group left the engine (``used_tokens`` None: it failed, and teaches nothing about cost)."""
        self.running -= 1
        self.queued_tokens -= estimated_tokens
        if used_tokens is not None:
            self.groups_done += 1
            self.estimated_tokens_done += estimated_tokens
            self.tokens_done += used_tokens
        if self.running == 0 and self._busy_since is not None:
            self.busy_s += now - self._busy_since
            self._busy_since = None

    def _busy(self, now: float) -> float:
        return self.busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)

    def tokens_per_s(self, now: float) -> float | None:
        """Tokens (prompt and answer) served per busy second so far (None: nothing served yet)."""
        busy = self._busy(now)
        return self.tokens_done / busy if self.groups_done and busy > 0 else None

    def load(self, now: float, members_waiting: int, slots: int | None = None) -> ReplicaLoad:
        """This replica's report to the autoscaling policy; ``slots``: its request slots
        (max_ongoing_requests), saturated from :data:`SATURATED_SHARE` of them held by members and
        groups (None: never)."""
        busy = self._busy(now)
        held = members_waiting + self.waiting + self.running  # a group's members and its call: an upper bound
        shape = dict(saturated=slots is not None and held >= SATURATED_SHARE * slots,
                     members_per_group=self.members_seen / self.groups_seen if self.groups_seen else None)
        if self.groups_done == 0 or busy <= 0 or self.estimated_tokens_done <= 0:
            return ReplicaLoad(self.waiting, self.running, 0.0, members_waiting, None, **shape)
        seconds_per_token = busy / self.estimated_tokens_done
        return ReplicaLoad(self.waiting, self.running, max(0.0, self.queued_tokens) * seconds_per_token,
                           members_waiting, busy / self.groups_done, **shape)
