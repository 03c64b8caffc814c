"""Replay runs on one pool and predict what it costs and exposes: the prediction ``grrm plan`` makes
for each candidate, and the one a bench compares with a measurement of the same pool.

The pool is fixed (``settings`` None), autoscaled by the project's decision (``settings``: a
``replicas.autoscaling`` block as :class:`cluster.autoscaling.ScalingSettings`), or scaled by the model
of Serve's default policy (``serve_default``); the model itself is ``cluster/planning/pool_model.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.autoscaling import ScalingSettings
from cluster.planning.pool_model import Routing, Run, ServeDefault, simulate
from cluster.planning.trace import RunTrace

__all__ = ["Replay", "replay", "runs_of"]


@dataclass(frozen=True)
class Replay:
    """One pool's predicted cost and exposure over the replayed runs."""

    exposed_s_mean: float  # mean exposed reward per run-step (docs/exposure.md)
    exposed_s_max: float
    replica_seconds_per_step: float  # replica-seconds held (starting ones included) per run-step
    gpu_hours_per_1000_steps: float
    peak_replicas: int
    timeline: list[tuple[float, int, int]]  # (seconds, replicas held, groups waiting) every tick


def runs_of(traces: Sequence[RunTrace]) -> list[Run]:
    """The pool model's runs for ``traces``, on one clock shared by the traces (runs sharing a pool
    overlap as their traces' times say), shifted so that the earliest run starts at 0, where the
    model's clock starts: recorded traces are on Unix seconds, synthetic ones start near 0."""
    if not traces:
        raise ValueError("traces: at least one run is needed")
    earliest = min(trace.steps[0].start_s for trace in traces)
    return [Run.from_trace(trace, offset_s=trace.steps[0].start_s - earliest) for trace in traces]


def replay(runs: Sequence[Run], *, seconds_per_group: float, cold_start_s: float, replicas: int = 1,
           settings: ScalingSettings | None = None, serve_default: ServeDefault | None = None,
           gpus_per_replica: int = 1, routing: Routing = "ring") -> Replay:
    """Replay ``runs`` on one shared pool starting with ``replicas`` (a fixed pool keeps them; an
    autoscaled one starts at ``max(min_replicas, 1)`` whatever ``replicas`` says). ``routing``: ``ring``,
    each group on the replica the service's ring places it on (what the service does); ``shared``, one
    queue for all (an ideal pool)."""
    if seconds_per_group <= 0:
        raise ValueError(f"seconds_per_group: {seconds_per_group}, must be positive")
    if replicas < 1:
        raise ValueError(f"replicas: {replicas}, must be at least 1")
    start = max(settings.min_replicas, 1) if settings is not None else replicas
    result = simulate(list(runs), lambda run: ("shared", start), seconds_per_group, cold_start_s, settings,
                      serve_default, routing)
    per_step = result["replica_seconds"] / sum(run.steps for run in runs)
    timeline = result["timelines"]["shared"]
    return Replay(exposed_s_mean=result["exposed_s_mean"], exposed_s_max=result["exposed_s_max"],
                  replica_seconds_per_step=per_step, gpu_hours_per_1000_steps=per_step * gpus_per_replica * 1000 / 3600,
                  peak_replicas=max(running for _, running, _ in timeline), timeline=timeline)
