"""The pure core of ``grrm profile`` (cluster/planning/profiling.py): what is sent, how it is sent at a
concurrency, and how timings become a profile. No service: the sending is a function of the test's."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from cluster.planning.profile import EngineProfile, seconds_per_group
from cluster.planning.profiling import (
    Answer,
    MadeGroups,
    ProfileSettings,
    Window,
    answer_of,
    field_error,
    made_groups,
    measure,
    point_of,
    profile_of,
    sample_groups,
)
from cluster.protocol.schema import GroupRequest, GroupResult, Usage

ROW = {"source": "Guten Morgen.", "candidates": ["Good morning.", "Morning."], "src_lang": "de", "trg_lang": "en"}


def test_made_groups_have_the_asked_shape_and_no_two_alike():
    groups = made_groups(MadeGroups(group_size=4, source_words=12, candidate_words=9), 20, tag="t1")
    assert len(groups) == 20 and all(len(group.candidates) == 4 for group in groups)
    # The label ("[t1 7]") plus the asked words; every candidate its words.
    assert all(len(group.source.split()) == 2 + 12 for group in groups)
    assert all(len(candidate.split()) == 9 for group in groups for candidate in group.candidates)
    assert len({group.source for group in groups}) == 20 and len({group.group_id for group in groups}) == 20
    assert all(len(set(group.candidates)) == 4 for group in groups)  # identical ones would share a score
    # Another run's groups are new to a service that scored these (its cache keeps them by id).
    again = made_groups(MadeGroups(group_size=4, source_words=12, candidate_words=9), 20, tag="t2")
    assert not {group.group_id for group in groups} & {group.group_id for group in again}
    assert not {group.source for group in groups} & {group.source for group in again}


def test_a_sample_is_sent_in_order_and_round_again_each_group_different():
    groups = sample_groups([ROW, GroupRequest(**{**ROW, "source": "Gute Nacht."})], 5, tag="x")
    assert [group.source for group in groups] == ["[x 0] Guten Morgen.", "[x 1] Gute Nacht.", "[x 2] Guten Morgen.",
                                                  "[x 3] Gute Nacht.", "[x 4] Guten Morgen."]
    assert [group.group_id for group in groups] == [f"profile-x-{index}" for index in range(5)]
    assert groups[2].candidates == ROW["candidates"] and groups[2].src_lang == "de"


def test_bad_input_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="sample row 1: candidates: Field required"):
        sample_groups([ROW, {key: value for key, value in ROW.items() if key != "candidates"}], 4, tag="x")
    with pytest.raises(ValueError, match="sample row 0: candidates: List should have at least 2 items"):
        sample_groups([{**ROW, "candidates": ["one"]}], 4, tag="x")
    with pytest.raises(ValueError, match="sample: no groups"):
        sample_groups([], 4, tag="x")
    cases = [({"concurrency": []}, "concurrency: List should have at least 1 item after validation, not 0"),
             ({"concurrency": [1, 0]}, "concurrency.1: Input should be greater than or equal to 1"),
             ({"concurrency": [2, 2]}, "concurrency: Value error, 2 given more than once"),
             ({"concurrency": [1], "groups_per_point": 0}, "groups_per_point: Input should be greater than or equal to 1"),
             ({"concurrency": [1], "warmup_groups": -1}, "warmup_groups: Input should be greater than or equal to 0")]
    for given, message in cases:
        with pytest.raises(ValidationError) as error:
            ProfileSettings(**given)
        assert field_error(error.value) == message
    with pytest.raises(ValueError, match="groups_per_point: 3 is fewer than concurrency 4"):
        ProfileSettings(concurrency=[1, 4], groups_per_point=3).check_groups()
    with pytest.raises(ValidationError) as error:
        MadeGroups(group_size=1, source_words=5, candidate_words=5)
    assert field_error(error.value).startswith("group_size: Input should be greater than or equal to 2")


def test_groups_per_point_default_to_four_per_group_in_flight_at_least_sixteen():
    settings = ProfileSettings(concurrency=[1, 8, 64])
    assert [settings.groups_at(concurrency) for concurrency in settings.concurrency] == [16, 32, 256]
    assert ProfileSettings(concurrency=[8], groups_per_point=10).groups_at(8) == 10


def test_a_window_becomes_a_point_by_hand():
    answers = (Answer(1.0, True, tokens=300), Answer(2.0, True, tokens=500), Answer(0.5, False, "parse_failed"),
               Answer(3.0, True, tokens=400))
    window = Window(concurrency=2, wall_s=4.0, answers=answers)
    point = point_of(window)
    # 3 valid answers in 4 s (the invalid one is no throughput); 1200 tokens in 4 s.
    assert point.concurrency == 2 and point.groups_per_s == pytest.approx(0.75) and point.tokens_per_s == 300.0
    assert window.mean_latency_s == pytest.approx(2.0) and window.failures == {"parse_failed": 1}
    # An engine that reports no tokens (the scripted one): no tokens per second, not zero.
    assert point_of(Window(1, 2.0, (Answer(1.0, True), Answer(1.0, True)))).tokens_per_s is None
    with pytest.raises(ValueError, match=r"concurrency 4: no valid answer \(deadline: 2\)"):
        point_of(Window(4, 9.0, (Answer(9.0, False, "deadline"), Answer(9.0, False, "deadline"))))


def test_answers_are_read_from_the_service_result_or_its_absence():
    valid = GroupResult(valid=True, scores=[3, 4], usage=Usage(prompt_tokens=200, completion_tokens=40))
    assert answer_of(valid, None, 0.5) == Answer(0.5, True, None, 240)
    assert answer_of(GroupResult(valid=False, failure="parse_failed"), None, 0.5) == Answer(0.5, False, "parse_failed")
    assert answer_of(None, "deadline", 9.0) == Answer(9.0, False, "deadline")


def test_the_profile_holds_a_point_per_window_and_the_tokens_per_group():
    windows = [Window(1, 4.0, (Answer(2.0, True, tokens=300), Answer(2.0, True, tokens=300))),
               Window(2, 3.0, (Answer(2.0, True, tokens=300), Answer(2.0, True, tokens=300),
                               Answer(2.5, True, tokens=300), Answer(2.5, True, tokens=300)))]
    profile = profile_of(windows, engine="vllm", model="m", group_size=4, cold_start_s=12.5,
                         cold_start_from="the replicas' own", replicas=1)
    assert isinstance(profile, EngineProfile) and profile.tokens_per_group == 300.0
    assert [(point.concurrency, point.groups_per_s, point.tokens_per_s) for point in profile.points] == [
        (1, 0.5, 150.0), (2, pytest.approx(4 / 3), pytest.approx(400.0))]
    assert seconds_per_group(profile) == pytest.approx(0.75)  # grrm plan's reading: the best point inverted
    assert EngineProfile.model_validate_json(profile.model_dump_json()) == profile
    with pytest.raises(ValueError, match="windows: none"):
        profile_of([], engine="vllm", model="m", group_size=4, cold_start_s=0)


def test_measure_keeps_the_concurrency_in_flight_and_times_the_window():
    in_flight, most = 0, 0
    now = [0.0]

    async def send(group: GroupRequest):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)
        now[0] += 1.0  # each answer moves the test's clock by a second
        in_flight -= 1
        return GroupResult(valid=True, usage=Usage(prompt_tokens=10, completion_tokens=5)), None

    groups = made_groups(MadeGroups(group_size=2, source_words=3, candidate_words=3), 6, tag="m")
    window = asyncio.run(measure(send, groups, 3, clock=lambda: now[0]))
    assert most == 3 and len(window.answers) == 6 and window.wall_s == 6.0
    assert point_of(window).groups_per_s == 1.0 and point_of(window).tokens_per_s == 15.0
    # Fewer groups than the concurrency: only those are in flight.
    most = 0
    assert len(asyncio.run(measure(send, groups[:2], 8, clock=lambda: now[0])).answers) == 2 and most == 2
