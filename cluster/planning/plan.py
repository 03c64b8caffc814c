"""The plan: what each pool would cost and expose for given runs, and the pool to deploy.

Every candidate pool is replayed through the pool model (``cluster/planning/pool_model.py``, the
project's autoscaling decision inside): fixed pools of 1 to ``max_replicas`` replicas, and autoscaled
pools over a small grid of the ``replicas.autoscaling`` settings. For each: mean and worst exposed
reward per step (``docs/exposure.md``: the last reward after the step's last rollout), replica-seconds
per run-step, GPU-hours per 1,000 run-steps and the peak replicas. Then the two answers users ask
for: the cheapest pool whose mean exposure is within ``within_pct`` of unlimited replicas (a fixed
pool of ``max_replicas``), and the lowest exposure within ``gpus`` GPUs (for which the grid is also
tried with ``max_replicas`` capped at what the GPUs hold: an autoscaled pool that may not outgrow them).
Beside them the offline bound (``cluster/planning/bound.py``): what no pool can undercut at that exposure.

SIMULATED: a prediction from a model whose inputs (seconds per group, cold start) come from a
profile or are given; ``bench/`` checks such predictions against real Serve.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.autoscaling import ScalingSettings
from cluster.planning.bound import OfflineBound, offline_bound
from cluster.planning.pool_model import ServeDefault
from cluster.planning.replay import Replay, replay, runs_of
from cluster.planning.trace import RunTrace

__all__ = ["AUTOSCALING_GRID", "SERVE_TARGETS", "Plan", "PoolPrediction", "SeparatePools", "autoscaling_block", "plan_pool",
           "serve_default_block"]

# Serve's default policy among the candidates, at these targets of ongoing requests per replica (64: grrm.yaml's
# before the project's policy; 16: Serve's default; 4: sooner), with Serve's model's delays (up 30 s, down 300 s).
SERVE_TARGETS = (4, 16, 64)

# The autoscaled candidates: each combination of these settings (the rest as ScalingSettings' defaults,
# upscale at once, down after PLANNED_DOWNSCALE_DELAY_S). Not the downscale delay: in replays of GRPO steps the
# idle rule drops replicas first, so 10 s and 60 s gave identical rows; the headroom and the backlog a replica
# may hold move both cost and exposure.
AUTOSCALING_GRID: dict[str, tuple] = {
    "min_replicas": (0, 1),
    "demand_headroom": (1.25, 1.4, 1.5, 2.0),
    "target_backlog_s": (5.0, 10.0),
}
# The downscale delay the plans were replayed and published with (below the service's default: the idle
# rule drops replicas before either delay passes, so it moves no row).
PLANNED_DOWNSCALE_DELAY_S = 60.0


@dataclass(frozen=True)
class PoolPrediction(Replay):
    """One candidate pool's predicted cost and exposure: its replay, and what the pool was."""

    pool: str  # "fixed", "autoscaled" (the project's policy) or "serve_default" (Serve's)
    replicas: int  # the fixed size, or the autoscaled pool's max_replicas
    settings: ScalingSettings | None = None  # the autoscaled pool's settings
    serve_default: ServeDefault | None = None  # Serve's policy's settings

    def row(self) -> dict[str, object]:
        """A table row: the pool, its replay's figures (not the timeline), the settings as the grid's fields."""
        row: dict[str, object] = {"pool": self.pool, "replicas": self.replicas}
        row.update((each.name, getattr(self, each.name)) for each in dataclasses.fields(Replay)
                   if each.name != "timeline")
        for name in AUTOSCALING_GRID:
            row[name] = getattr(self.settings, name) if self.settings is not None else None
        row["serve_target"] = self.serve_default.target if self.serve_default is not None else None
        return row


@dataclass(frozen=True)
class SeparatePools:
    """The baseline of several runs sharing a pool: each run on its own fixed pool, the smallest whose
    exposure is within ``within_pct`` of unlimited replicas for that run alone."""

    sizes: list[int]  # each run's pool, in the traces' order
    replica_seconds_per_step: float  # all the pools', per run-step
    exposed_s_mean: float  # mean exposed reward per run-step


@dataclass(frozen=True)
class Plan:
    """Every candidate, and the answers."""

    candidates: list[PoolPrediction]
    unlimited: PoolPrediction
    cheapest_within: PoolPrediction  # the cheapest whose mean exposure is within within_pct of unlimited
    best_within_gpus: PoolPrediction | None  # the lowest mean exposure whose peak fits in the GPUs (None: none fits)
    within_pct: float
    gpus: int | None
    # No pool can hold fewer replica-seconds per run-step with every step's exposure within within_pct of
    # unlimited (cluster/planning/bound.py): how far the cheapest candidate is from what the runs allow.
    offline: OfflineBound
    separate: SeparatePools | None = None  # several runs: a fixed pool each, the baseline of sharing one


def plan_pool(traces: Sequence[RunTrace], *, seconds_per_group: float, cold_start_s: float, max_replicas: int,
              gpus_per_replica: int = 1, within_pct: float = 5.0, gpus: int | None = None,
              demand_grace_s: float = 5.0) -> Plan:
    """Replay ``traces`` (runs sharing one pool, each started at its trace's own clock) on every
    candidate pool and answer the two questions (see the module docstring)."""
    if max_replicas < 1:
        raise ValueError(f"max_replicas: {max_replicas}, must be at least 1")
    runs = runs_of(traces)

    def predicted(pool: str, replicas: int, settings: ScalingSettings | None,
                  serve_default: ServeDefault | None = None) -> PoolPrediction:
        result = replay(runs, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s,
                        replicas=1 if serve_default is not None else replicas, settings=settings,
                        serve_default=serve_default, gpus_per_replica=gpus_per_replica)
        figures = {each.name: getattr(result, each.name) for each in dataclasses.fields(Replay)}
        return PoolPrediction(**figures, pool=pool, replicas=replicas, settings=settings, serve_default=serve_default)

    candidates = [predicted("fixed", size, None) for size in range(1, max_replicas + 1)]
    base = ScalingSettings(max_replicas=max_replicas, target_backlog_s=10.0, upscale_delay_s=0.0,
                           downscale_delay_s=PLANNED_DOWNSCALE_DELAY_S, cold_start_s=cold_start_s,
                           default_seconds_per_group=seconds_per_group,
                           demand_grace_s=demand_grace_s)
    caps = [max_replicas]
    if gpus is not None and 1 <= gpus // gpus_per_replica < max_replicas:
        caps.append(gpus // gpus_per_replica)
    for cap, values in itertools.product(caps, itertools.product(*AUTOSCALING_GRID.values())):
        settings = dataclasses.replace(base, max_replicas=cap, **dict(zip(AUTOSCALING_GRID, values)))
        candidates.append(predicted("autoscaled", cap, settings))
    for cap, target in itertools.product(caps, SERVE_TARGETS):
        candidates.append(predicted("serve_default", cap, None, ServeDefault(target=target, max_replicas=cap)))
    unlimited = candidates[max_replicas - 1]
    bound = unlimited.exposed_s_mean * (1 + within_pct / 100)
    within = [candidate for candidate in candidates if candidate.exposed_s_mean <= bound]
    cheapest = min(within, key=lambda candidate: (candidate.replica_seconds_per_step, candidate.exposed_s_mean))
    fitting = [candidate for candidate in candidates
               if gpus is not None and candidate.peak_replicas * gpus_per_replica <= gpus]
    best = min(fitting, key=lambda candidate: (candidate.exposed_s_mean, candidate.replica_seconds_per_step),
               default=None)
    offline = offline_bound(runs, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s, exposure_s=bound)
    separate = (separate_pools(traces, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s,
                               max_replicas=max_replicas, within_pct=within_pct) if len(traces) > 1 else None)
    return Plan(candidates=candidates, unlimited=unlimited, cheapest_within=cheapest, best_within_gpus=best,
                within_pct=within_pct, gpus=gpus, offline=offline, separate=separate)


def separate_pools(traces: Sequence[RunTrace], *, seconds_per_group: float, cold_start_s: float, max_replicas: int,
                   within_pct: float) -> SeparatePools:
    """Each run alone on fixed pools of 1 to ``max_replicas``: the smallest within ``within_pct`` of its
    largest's exposure, and what those pools cost and expose together."""
    sizes, held, exposed, steps = [], 0.0, 0.0, 0
    for trace in traces:
        runs = runs_of([trace])
        pools = [replay(runs, seconds_per_group=seconds_per_group, cold_start_s=cold_start_s, replicas=size)
                 for size in range(1, max_replicas + 1)]
        limit = pools[-1].exposed_s_mean * (1 + within_pct / 100)
        size, chosen = next((size, pool) for size, pool in enumerate(pools, start=1) if pool.exposed_s_mean <= limit)
        sizes.append(size)
        held += chosen.replica_seconds_per_step * len(trace.steps)
        exposed += chosen.exposed_s_mean * len(trace.steps)
        steps += len(trace.steps)
    return SeparatePools(sizes=sizes, replica_seconds_per_step=held / steps, exposed_s_mean=exposed / steps)


def autoscaling_block(settings: ScalingSettings) -> dict[str, object]:
    """The ``replicas.autoscaling`` block of the app config for ``settings`` (the engine_work policy)."""
    fields = ("min_replicas", "max_replicas", "target_backlog_s", "upscale_delay_s", "downscale_delay_s",
              "idle_downscale_delay_s", "cold_start_s", "default_seconds_per_group", "demand_headroom",
              "demand_grace_s")
    return {"policy": "engine_work", **{name: getattr(settings, name) for name in fields}}


def serve_default_block(serve_default: ServeDefault) -> dict[str, object]:
    """The ``replicas.autoscaling`` block of the app config for Serve's default policy as modelled."""
    return {"policy": "serve_default", "min_replicas": 1, "max_replicas": serve_default.max_replicas,
            "target_ongoing_requests": float(serve_default.target), "upscale_delay_s": serve_default.upscale_delay_s,
            "downscale_delay_s": serve_default.downscale_delay_s, "look_back_period_s": serve_default.look_back_s}
