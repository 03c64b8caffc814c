"""The offline bound: fewer replica-seconds than no pool, however it scales, can hold for given runs.

An oracle knows every group's arrival in advance. It still must (1) hold a replica for every engine
second of work, and (2) for each run-step, score the groups that complete in its last ``x`` seconds
within those ``x`` seconds plus the allowed exposure ``E``: at some moment in that window it holds at
least ``ceil(W(x) / (x + E))`` replicas serving (``W(x)``: their engine seconds), for the ``x`` that needs the
most. A replica needed again after a window either stays held through the gap or starts again
(``cold_start_s`` held before it serves): each level of replicas costs at least ``min(gap,
cold_start_s)`` per gap between windows that need it, and a cold start for its first (but the first
replica's: a pool begins with one serving). The bound is the
larger of (1) and the sum over levels of (2): a lower bound on every pool's replica-seconds, not a
pool one can run (it assumes the oracle starts each replica exactly in time and scores with no routing
loss), used to say how far any policy is from what the workload allows.

SIMULATED: it reads the pool model's runs (``cluster/planning/pool_model.py``), engine seconds per group
from their traces or the profile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.planning.pool_model import Run

__all__ = ["OfflineBound", "offline_bound"]


@dataclass(frozen=True)
class OfflineBound:
    """The bound and its two parts, per run-step."""

    replica_seconds_per_step: float  # the larger of the two below
    work_per_step: float  # engine seconds of the groups themselves
    starts_per_step: float  # what the windows' required replicas cost held and started
    peak_replicas: int  # the most replicas any window needs


def _window(completions: list[float], work: list[float], exposure_s: float) -> tuple[float, float, int]:
    """(window start, window end, replicas needed) of one run-step: its groups' completions and engine
    seconds in completion order."""
    last = completions[-1]
    best, start, tail = 0, last, 0.0
    for at, seconds in zip(reversed(completions), reversed(work)):
        tail += seconds
        needed = math.ceil(tail / (last - at + exposure_s) - 1e-9)
        if needed > best:
            best, start = needed, at
    return start, last + exposure_s, best


def offline_bound(runs: Sequence[Run], *, seconds_per_group: float, cold_start_s: float,
                  exposure_s: float) -> OfflineBound:
    """The bound for ``runs`` sharing one pool, each step's exposure at most ``exposure_s``."""
    if exposure_s <= 0:
        raise ValueError(f"exposure_s: {exposure_s}, must be positive")
    if cold_start_s < 0:
        raise ValueError(f"cold_start_s: {cold_start_s}, must be at least 0")
    windows, work_total = [], 0.0
    for run in runs:
        for step, completions in enumerate(run.completions):
            recorded = run.work_s[step] if run.work_s else [None] * len(completions)
            work = [seconds_per_group if seconds is None else seconds for seconds in recorded]
            work_total += sum(work)
            windows.append(_window(completions, work, exposure_s))
    windows.sort()
    starts = 0.0
    for level in range(1, max(needed for _, _, needed in windows) + 1):
        ends = [(start, end) for start, end, needed in windows if needed >= level]
        if level > 1:  # its first start (the pools the plan replays begin with one replica serving)
            starts += cold_start_s
        reach = ends[0][1]
        for start, end in ends[1:]:
            starts += min(max(0.0, start - reach), cold_start_s)
            reach = max(reach, end)
    steps = sum(run.steps for run in runs)
    return OfflineBound(replica_seconds_per_step=max(work_total, starts) / steps, work_per_step=work_total / steps,
                        starts_per_step=starts / steps, peak_replicas=max(needed for _, _, needed in windows))
