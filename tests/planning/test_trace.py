"""The trace format (cluster/planning/trace.py): what a run's file holds, and errors that name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.planning.pool_model import Run
from cluster.planning.trace import GroupTrace, RunTrace, StepTrace, synthetic_trace


def test_a_synthetic_trace_has_the_shape_asked_for_and_survives_its_file():
    trace = synthetic_trace("run-a", groups=5, group_size=4, generation_s=60.0, training_s=30.0, steps=3,
                            spread_s=10.0, offset_s=7.0)
    assert [step.start_s for step in trace.steps] == [7.0, 97.0, 187.0]
    assert all(len(step.groups) == 5 and all(len(group.members_at) == 4 for group in step.groups) for step in trace.steps)
    # Rollouts finish within the phase's last spread_s: every member between 50 and 60 s into its step.
    arrivals = [at for step in trace.steps for group in step.groups for at in group.members_at]
    assert min(arrivals) >= 50.0 and max(arrivals) <= 60.0
    assert RunTrace.model_validate_json(trace.model_dump_json()) == trace and trace.synthetic


def test_a_bad_trace_is_refused_with_the_field_named():
    one = StepTrace(start_s=0.0, generation_s=10.0, training_s=5.0, groups=[GroupTrace(members_at=[1.0, 2.0])])
    with pytest.raises(ValidationError, match="members_at"):
        GroupTrace(members_at=[-1.0, 2.0])
    with pytest.raises(ValidationError, match=r"steps\[1\].start_s"):
        RunTrace(run="r", group_size=2, steps=[one, one.model_copy(update={"start_s": 5.0})])
    with pytest.raises(ValidationError, match=r"steps\[0\].groups\[0\].members_at: 2 members, more than group_size 1"):
        RunTrace(run="r", group_size=1, steps=[one])
    with pytest.raises(ValidationError, match="format"):
        RunTrace.model_validate({"format": 2, "run": "r", "group_size": 2, "steps": [one.model_dump()]})
    with pytest.raises(ValidationError, match="extra"):
        RunTrace.model_validate({"run": "r", "group_size": 2, "steps": [one.model_dump()], "stepz": []})


def test_a_recorded_run_replays_its_own_times_and_steps():
    # Steps of different lengths, as a recorded run has them; a group of 2 completes at its later member.
    steps = [StepTrace(start_s=100.0, generation_s=10.0, training_s=20.0,
                       groups=[GroupTrace(members_at=[3.0, 8.0]), GroupTrace(members_at=[1.0, 2.0])]),
             StepTrace(start_s=140.0, generation_s=5.0, training_s=5.0, groups=[GroupTrace(members_at=[4.0, 5.0])])]
    run = Run.from_trace(RunTrace(run="r", group_size=2, steps=steps), offset_s=0.0)
    assert run.completions == [[2.0, 8.0], [45.0]]  # shifted: the first step starts at 0
    assert run.rollouts == [1.0, 2.0, 3.0, 8.0, 44.0, 45.0]
    assert [run.phase_start(step) for step in range(3)] == [0.0, 40.0, 50.0] and run.end_s() == 50.0
    assert run.announcements and run.announcements[0][1].tenant == "r"  # it announces as its client would
