"""A run's trace: when its groups' members arrived and when each group was complete, step by step.

The file a user keeps of one GRPO run (JSON, ``format: 1``) and what ``grrm plan`` replays. Times are
seconds on the run's own clock (any origin: the first step's start is a good one). Per step:

- ``start_s``: when the step's generation phase began (its first rollout was asked for);
- ``generation_s``: how long generation took (to the step's last rollout);
- ``training_s``: how long the trainer then worked without sending rewards (to the next step's start);
- ``groups``: each group's members' arrival times at the reward service (seconds after ``start_s``) and,
  where they were measured, the engine seconds its scoring took (``work_s``) and its tokens (``tokens``).

A group is complete at its last member's arrival. :func:`synthetic_trace` makes one from a few numbers,
for a run not yet made.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["GroupTrace", "RunTrace", "StepTrace", "synthetic_trace"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GroupTrace(_Strict):
    """One group of one step."""

    members_at: list[float] = Field(min_length=1, description="Each member's arrival, seconds after the step's start.")
    group_id: str | None = Field(None, description="The group's id as its client sent it (a recorded trace): the "
                                                   "parts of one run that several processes recorded merge by it.")
    work_s: float | None = Field(None, gt=0, description="Engine seconds the group's scoring took on one replica "
                                                          "(None: not measured; the profile's figure is used).")
    tokens: float | None = Field(None, gt=0, description="Tokens (prompt and answer) its scoring took (None: not "
                                                         "measured); with a profile, its engine seconds where "
                                                         "work_s is missing.")

    @model_validator(mode="after")
    def _arrivals_not_negative(self) -> GroupTrace:
        if min(self.members_at) < 0:
            raise ValueError(f"members_at: {min(self.members_at)} is before the step's start (must be >= 0)")
        return self

    @property
    def complete_at(self) -> float:
        """When the group was complete (its last member's arrival), seconds after the step's start."""
        return max(self.members_at)


class StepTrace(_Strict):
    """One trainer step: a generation phase, then training."""

    start_s: float = Field(description="When the step's generation began, on the run's clock.")
    generation_s: float = Field(gt=0, description="Seconds from the step's start to its last rollout.")
    training_s: float = Field(ge=0, description="Seconds of training after generation (no rewards sent).")
    groups: list[GroupTrace] = Field(min_length=1, description="The step's groups.")


class RunTrace(_Strict):
    """One run's recorded (or synthetic) arrival pattern."""

    format: Literal[1] = Field(1, description="The trace format's version.")
    run: str = Field(min_length=1, description="The run's name (its tenant, as the service knows it).")
    group_size: int = Field(ge=1, description="Members per group (GRPO's n).")
    synthetic: bool = Field(False, description="Made by synthetic_trace, not recorded.")
    steps: list[StepTrace] = Field(min_length=1, description="The run's steps, in order.")

    @model_validator(mode="after")
    def _steps_in_order(self) -> RunTrace:
        for index, (step, later) in enumerate(zip(self.steps, self.steps[1:])):
            if later.start_s < step.start_s + step.generation_s:
                raise ValueError(f"steps[{index + 1}].start_s: {later.start_s} begins before steps[{index}]'s "
                                 f"generation ends ({step.start_s + step.generation_s})")
        for index, step in enumerate(self.steps):
            for number, group in enumerate(step.groups):
                if len(group.members_at) > self.group_size:
                    raise ValueError(f"steps[{index}].groups[{number}].members_at: {len(group.members_at)} members, "
                                     f"more than group_size {self.group_size}")
        return self


def synthetic_trace(run: str, *, groups: int, group_size: int, generation_s: float, training_s: float,
                    steps: int, spread_s: float | None = None, offset_s: float = 0.0, seed: int = 0) -> RunTrace:
    """A run not yet made: ``steps`` steps of ``groups`` groups of ``group_size``; each rollout finishes
    uniformly within the last ``spread_s`` seconds of the generation phase (default: all of it)."""
    spread_s = generation_s if spread_s is None else min(spread_s, generation_s)
    rng = random.Random(seed)
    made = []
    for index in range(steps):
        members = [[generation_s - spread_s * rng.random() for _ in range(group_size)] for _ in range(groups)]
        made.append(StepTrace(start_s=offset_s + index * (generation_s + training_s), generation_s=generation_s,
                              training_s=training_s, groups=[GroupTrace(members_at=times) for times in members]))
    return RunTrace(run=run, group_size=group_size, synthetic=True, steps=made)
