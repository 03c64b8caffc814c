"""A measured engine profile: what one replica of the deployed engine scores per second, and how long a
new replica takes to serve. ``grrm plan`` turns it into the pool model's seconds per group.

The file (JSON, ``format: 1``) is what a profiling run writes and a user keeps beside their traces; it
is pure data here (reading it is ``grrm_cli/plan.py``'s, measuring and writing it ``grrm_cli/profile.py``'s).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.planning.trace import RunTrace

__all__ = ["ConcurrencyPoint", "EngineProfile", "costed", "seconds_per_group"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConcurrencyPoint(_Strict):
    """One replica's throughput with ``concurrency`` groups at its engine at once."""

    concurrency: int = Field(ge=1, description="Groups sent to the replica's engine at once.")
    groups_per_s: float = Field(gt=0, description="Groups the replica scored per second at this concurrency.")
    tokens_per_s: float | None = Field(None, gt=0, description="Tokens (prompt and answer) per second at this "
                                                                "concurrency (None: not measured).")


class EngineProfile(_Strict):
    """One engine's measured profile (one replica, its GPUs as deployed)."""

    format: Literal[1] = Field(1, description="The profile format's version.")
    engine: str = Field(min_length=1, description="The engine kind (vllm, sglang, transformers, scripted).")
    model: str = Field(min_length=1, description="The model the replica served.")
    gpu: str = Field("", description="Free text: the GPU and its count per replica (e.g. '1x H200').")
    group_size: int = Field(ge=1, description="Candidates per group in the measured groups.")
    tokens_per_group: float | None = Field(None, gt=0, description="Mean tokens (prompt and answer) of a measured "
                                                                   "group (None: not measured).")
    cold_start_s: float = Field(ge=0, description="Seconds from asking for a replica to its serving.")
    cold_start_from: str = Field("", description="Free text: where cold_start_s came from (the replicas' own "
                                                 "measure, or given by hand).")
    replicas: int = Field(1, ge=1, description="Replicas that served the measured groups: the points are theirs "
                                               "together, one replica's share is 1/replicas of them.")
    points: list[ConcurrencyPoint] = Field(min_length=1, description="Throughput at each measured concurrency.")

    @model_validator(mode="after")
    def _one_point_per_concurrency(self) -> EngineProfile:
        seen = [point.concurrency for point in self.points]
        repeated = sorted({value for value in seen if seen.count(value) > 1})
        if repeated:
            raise ValueError(f"points: concurrency {repeated[0]} measured more than once")
        return self

    def best(self) -> ConcurrencyPoint:
        """The measured concurrency with the highest groups per second (the replicas' capacity)."""
        return max(self.points, key=lambda point: point.groups_per_s)


def seconds_per_group(profile: EngineProfile, group_size: int | None = None, tokens: float | None = None) -> float:
    """Engine seconds one group costs a replica, as the pool model counts it (one group at a time, so the
    replica's throughput at its best concurrency, inverted).

    ``tokens``: the group's tokens, over the best point's tokens per second when it was measured. Else
    ``group_size``: the measured seconds scaled by candidates (a GQM prompt and answer grow with the
    group, roughly in proportion). Neither: the measured group's seconds. A profile measured on several
    replicas counts one replica's share of them (a load that saturates them is spread evenly)."""
    best = profile.best()
    groups_per_s = best.groups_per_s / profile.replicas
    if tokens is not None:
        if tokens <= 0:
            raise ValueError(f"tokens: {tokens}, must be positive")
        if best.tokens_per_s is not None:
            return tokens / (best.tokens_per_s / profile.replicas)
        if profile.tokens_per_group is not None:
            return tokens / profile.tokens_per_group / groups_per_s
    if group_size is not None:
        if group_size < 1:
            raise ValueError(f"group_size: {group_size}, must be at least 1")
        return group_size / profile.group_size / groups_per_s
    return 1.0 / groups_per_s


def costed(trace: RunTrace, profile: EngineProfile) -> RunTrace:
    """``trace`` with each group that has ``tokens`` but no ``work_s`` given the engine seconds those
    tokens cost on ``profile``'s engine (a trace recorded on one engine, planned for another)."""
    steps = [step.model_copy(update={"groups": [
        group.model_copy(update={"work_s": seconds_per_group(profile, tokens=group.tokens)})
        if group.work_s is None and group.tokens is not None else group for group in step.groups]})
        for step in trace.steps]
    return trace.model_copy(update={"steps": steps})
