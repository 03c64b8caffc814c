"""Recording a run's trace as its client sends (cluster/planning/recorder.py): steps, groups, bounds."""

from __future__ import annotations

import pytest

from cluster.planning.recorder import TraceRecorder, one_per_run
from cluster.planning.replay import replay, runs_of
from cluster.planning.trace import RunTrace, synthetic_trace

T0 = 1_700_000_000.0  # Unix seconds, as the client records


def test_steps_split_at_the_quiet_gap_and_groups_keep_their_members_relative_to_the_step():
    recorder = TraceRecorder("run-a", phase_gap_s=10.0)
    assert recorder.trace() is None
    ended = [recorder.member_sent("g1", 2, T0 + 0.0, member=0), recorder.member_sent("g2", 2, T0 + 3.0, member=0),
             recorder.member_sent("g1", 2, T0 + 5.5, member=1), recorder.member_sent("g2", 2, T0 + 9.0, member=1)]
    assert ended == [False, False, False, False]
    # 9.999 s of quiet is not a gap yet; 10 s is: the next member opens step 2 and ends step 1.
    assert recorder.member_sent("g3", 2, T0 + 18.999, member=0) is False
    assert recorder.member_sent("g3", 2, T0 + 30.0, member=1) is True
    recorder.group_answered("g1", tokens=1200)
    trace = recorder.trace()
    assert isinstance(trace, RunTrace) and trace.run == "run-a" and trace.group_size == 2 and not trace.synthetic
    first, second = trace.steps
    assert first.start_s == T0 and first.generation_s == pytest.approx(18.999)
    assert [group.members_at for group in first.groups] == [[0.0, 5.5], [3.0, 9.0], [18.999]]
    assert first.groups[0].tokens == 1200 and first.groups[1].tokens is None
    # Training: from the step's last arrival to the next step's start.
    assert first.training_s == pytest.approx(30.0 - 18.999)
    assert second.start_s == T0 + 30.0 and second.training_s == 0.0  # the last step: its end is not known
    assert second.generation_s == 0.001  # one arrival: the format wants a positive phase
    assert RunTrace.model_validate_json(trace.model_dump_json()) == trace
    # As a step ends, only the ended steps are written: the one going on is not yet a step.
    assert recorder.trace(ended_only=True).steps == [first]
    assert TraceRecorder("run-a").trace(ended_only=True) is None


def test_a_member_sent_again_is_no_new_arrival_and_a_group_holds_at_most_its_size():
    recorder = TraceRecorder("run-a")
    recorder.member_sent("g", 3, T0, member=0)
    recorder.member_sent("g", 3, T0 + 4.0, member=0)  # the caller sent it again: not a new arrival
    recorder.member_sent("g", 3, T0 + 5.0, member="b")
    recorder.member_sent("g", 3, T0 + 6.0)  # no key: counted, up to the group's size
    recorder.member_sent("g", 3, T0 + 7.0)  # a fourth member of a group of 3: dropped
    trace = recorder.trace()
    assert trace.steps[0].groups[0].members_at == [0.0, 5.0, 6.0]
    assert recorder.dropped == 1
    # A re-send long after does not open a step either: it is the same member of the same group.
    assert recorder.member_sent("g", 3, T0 + 100.0, member=0) is False and recorder.steps == 1


def test_a_whole_group_arrives_at_once_and_its_tokens_are_kept_once():
    recorder = TraceRecorder("run-a")
    recorder.group_sent("g", 4, T0 + 1.0)
    recorder.group_sent("g", 4, T0 + 2.0)  # sent again (a caller's retry): the same group, no new members
    recorder.group_sent(7, 4, T0 + 2.5)
    recorder.group_answered("g", tokens=0)  # no measurement
    recorder.group_answered("g", tokens=900)
    recorder.group_answered("g", tokens=950)  # answered again: kept once
    recorder.group_answered("unknown", tokens=10)
    groups = recorder.trace().steps[0].groups
    assert [group.members_at for group in groups] == [[0.0] * 4, [1.5] * 4]
    assert [group.tokens for group in groups] == [900, None]


def test_an_answer_after_the_next_step_opened_still_finds_its_group():
    recorder = TraceRecorder("run-a", phase_gap_s=1.0)
    recorder.group_sent("g", 2, T0)
    recorder.group_sent("h", 2, T0 + 5.0)
    recorder.group_answered("g", tokens=42)
    assert recorder.trace().steps[0].groups[0].tokens == 42


def test_out_of_order_send_times_stay_within_their_step():
    recorder = TraceRecorder("run-a")
    recorder.member_sent("g", 2, T0 + 1.0, member=0)
    recorder.member_sent("g", 2, T0 + 0.9, member=1)  # stamped before the step's first arrival
    assert recorder.trace().steps[0].groups[0].members_at == [0.0, 0.0]


def test_recording_is_bounded_in_steps_and_groups():
    recorder = TraceRecorder("run-a", phase_gap_s=1.0, max_steps=3, max_groups_per_step=2)
    for step in range(5):
        for group in range(4):
            recorder.group_sent(f"{step}-{group}", 2, T0 + 10.0 * step + 0.1 * group)
    trace = recorder.trace()
    assert len(trace.steps) == 3 and all(len(step.groups) == 2 for step in trace.steps)
    # Groups over the bound still make the phase last (to 0.3 s); the step after the last one kept was
    # seen, so the last step's training is known.
    assert trace.steps[-1].generation_s == pytest.approx(0.3)
    assert trace.steps[-1].training_s == pytest.approx(10.0 - 0.3)
    assert recorder.dropped == 2 * 2 * 3 + 4 * 2 * 2  # 2 groups of 2 over the bound in each kept step, 2 steps more
    with pytest.raises(ValueError, match="phase_gap_s"):
        TraceRecorder("run-a", phase_gap_s=0.001)


def test_a_recorded_trace_replays():
    recorder = TraceRecorder("run-a", phase_gap_s=5.0)
    for step in range(3):
        start = T0 + 60.0 * step
        for group in range(8):
            for member in range(4):
                recorder.member_sent(f"{step}-{group}", 4, start + 2.0 * member + 0.25 * group, member=member)
    runs = runs_of([recorder.trace()])
    assert runs[0].offset_s == 0.0 and runs[0].steps == 3
    result = replay(runs, seconds_per_group=1.0, cold_start_s=10.0, replicas=2)
    assert result.exposed_s_mean > 0 and result.peak_replicas == 2


def test_traces_on_the_unix_clock_replay_as_the_same_traces_from_zero():
    def run(name: str, offset_s: float) -> RunTrace:
        return synthetic_trace(name, groups=6, group_size=4, generation_s=30.0, training_s=40.0, steps=2,
                               offset_s=offset_s, seed=len(name))

    from_zero = replay(runs_of([run("a", 0.0), run("bb", 100.0)]), seconds_per_group=1.0, cold_start_s=5.0)
    on_unix = replay(runs_of([run("a", T0), run("bb", T0 + 100.0)]), seconds_per_group=1.0, cold_start_s=5.0)
    assert on_unix == from_zero


def test_the_parts_several_processes_recorded_of_one_run_merge_into_its_trace():
    # verl's reward workers each send a share of every group: two parts, each with half of each group's
    # members, merge into whole groups, the steps found again; another run's trace stays its own.
    whole = TraceRecorder("run-a")
    parts = [TraceRecorder("run-a"), TraceRecorder("run-a")]
    for step in range(2):
        for group in range(3):
            for member in range(4):
                at = 1000.0 + 60.0 * step + group + member * 0.5
                whole.member_sent(f"s{step}g{group}", 4, at)
                parts[member % 2].member_sent(f"s{step}g{group}", 4, at)
    parts[1].group_answered("s0g1", tokens=300.0)
    other = TraceRecorder("run-b")
    other.member_sent("x", 1, 1010.0)
    merged = one_per_run([parts[0].trace(), other.trace(), parts[1].trace()])
    assert [trace.run for trace in merged] == ["run-a", "run-b"]
    expected = whole.trace()
    assert [step.start_s for step in merged[0].steps] == [step.start_s for step in expected.steps]
    assert [[sorted(group.members_at) for group in step.groups] for step in merged[0].steps] == [
        [sorted(group.members_at) for group in step.groups] for step in expected.steps]
    assert merged[0].steps[0].groups[1].tokens == 300.0 and merged[1] == other.trace()


def test_grrm_plan_counts_the_parts_of_one_run_as_one_run(tmp_path, capsys):
    from grrm_cli.main import main

    paths = []
    for number in range(2):
        recorder = TraceRecorder("run-a")
        for group in range(4):
            recorder.member_sent(f"g{group}", 2, 500.0 + group + number * 0.3)
        path = tmp_path / f"run-a-{number}.json"
        path.write_text(recorder.trace().model_dump_json())
        paths += ["--trace", str(path)]
    assert main(["plan", *paths, "--seconds-per-group", "1", "--cold-start-s", "5", "--max-replicas", "2"]) == 0
    assert "SIMULATED plan for 1 run(s)" in capsys.readouterr().out
