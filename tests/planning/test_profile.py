"""The engine profile (cluster/planning/profile.py) and ``grrm plan --profile``."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cluster.planning.profile import EngineProfile, costed, seconds_per_group
from cluster.planning.trace import GroupTrace, RunTrace, StepTrace, synthetic_trace
from grrm_cli.main import main

PROFILE = {"engine": "vllm", "model": "double7/Qwen2.5-7B-GRRM", "gpu": "1x H200", "group_size": 8,
           "tokens_per_group": 3000.0, "cold_start_s": 90.0,
           "points": [{"concurrency": 1, "groups_per_s": 0.25, "tokens_per_s": 750.0},
                      {"concurrency": 16, "groups_per_s": 2.0, "tokens_per_s": 6000.0},
                      {"concurrency": 64, "groups_per_s": 1.6}]}


def test_seconds_per_group_is_the_best_concurrency_inverted_and_scaled():
    profile = EngineProfile.model_validate(PROFILE)
    assert profile.best().concurrency == 16  # 2 groups/s beats 0.25 and 1.6
    assert seconds_per_group(profile) == pytest.approx(0.5)  # 1 / 2 groups/s
    assert seconds_per_group(profile, group_size=4) == pytest.approx(0.25)  # half the candidates: half the work
    assert seconds_per_group(profile, tokens=1500.0) == pytest.approx(0.25)  # 1500 tokens / 6000 tokens/s
    no_tokens = profile.model_copy(update={"points": [profile.points[2]]})
    # 1500 tokens is half a measured group (3000), at 1.6 groups/s: 0.5 / 1.6 s.
    assert seconds_per_group(no_tokens, tokens=1500.0) == pytest.approx(0.5 / 1.6)
    with pytest.raises(ValueError, match="group_size: 0"):
        seconds_per_group(profile, group_size=0)


def test_recorded_tokens_become_engine_seconds_where_none_were_measured():
    profile = EngineProfile.model_validate(PROFILE)
    groups = [GroupTrace(members_at=[1.0], tokens=3000.0), GroupTrace(members_at=[1.0], tokens=3000.0, work_s=9.0),
              GroupTrace(members_at=[1.0])]
    trace = RunTrace(run="r", group_size=1, steps=[StepTrace(start_s=0, generation_s=2, training_s=1, groups=groups)])
    # 3000 tokens at 6000 tokens/s: 0.5 s; a measured work_s stays; a group with neither stays unmeasured.
    assert [group.work_s for group in costed(trace, profile).steps[0].groups] == [0.5, 9.0, None]


def test_a_bad_profile_is_refused_with_the_field_named():
    with pytest.raises(ValidationError, match="points: concurrency 16 measured more than once"):
        EngineProfile.model_validate({**PROFILE, "points": PROFILE["points"] + [PROFILE["points"][1]]})
    with pytest.raises(ValidationError, match="groups_per_s"):
        EngineProfile.model_validate({**PROFILE, "points": [{"concurrency": 1, "groups_per_s": 0}]})
    with pytest.raises(ValidationError, match="cold_start_s"):
        EngineProfile.model_validate({key: value for key, value in PROFILE.items() if key != "cold_start_s"})
    with pytest.raises(ValidationError, match="format"):
        EngineProfile.model_validate({**PROFILE, "format": 2})


def test_grrm_plan_takes_its_engine_figures_from_a_profile(tmp_path, capsys):
    profile, trace, out = tmp_path / "profile.json", tmp_path / "run.json", tmp_path / "plan.json"
    profile.write_text(json.dumps(PROFILE))
    trace.write_text(synthetic_trace("run", groups=8, group_size=4, generation_s=30.0, training_s=30.0,
                                     steps=2).model_dump_json())
    status = main(["plan", "--profile", str(profile), "--trace", str(trace), "--max-replicas", "2",
                   "--json", str(out)])
    assert status == 0, capsys.readouterr().out
    engine = json.loads(out.read_text())["engine"]
    # Groups of 4 against a profile measured at 8 and 2 groups/s: 0.25 s; the profile's cold start.
    assert engine["seconds_per_group"] == pytest.approx(0.25) and engine["cold_start_s"] == 90.0
    autoscaled = json.loads(out.read_text())["config"]["replicas"].get("autoscaling")
    assert autoscaled is None or autoscaled["cold_start_s"] == 90.0


def test_grrm_plan_wants_a_profile_or_both_figures(tmp_path, capsys):
    run = ["--synthetic", "batch=4,n=2,gen_s=10,train_s=5,steps=1", "--max-replicas", "1"]
    assert main(["plan", *run, "--seconds-per-group", "1"]) == 2
    assert "give --profile, or --cold-start-s" in capsys.readouterr().out
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({**PROFILE, "points": []}))
    assert main(["plan", *run, "--profile", str(profile)]) == 2
    assert "--profile" in (printed := capsys.readouterr().out) and "points" in printed
    profile.write_text(json.dumps(PROFILE))
    assert main(["plan", *run, "--profile", str(profile), "--cold-start-s", "3"]) == 2
    assert "drop --seconds-per-group and --cold-start-s" in capsys.readouterr().out


def test_a_profile_measured_on_several_replicas_counts_one_replicas_share():
    two = EngineProfile.model_validate({**PROFILE, "replicas": 2, "cold_start_from": "given"})
    # 2 groups/s from 2 replicas: 1 group/s each; 6000 tokens/s: 3000 each.
    assert seconds_per_group(two) == pytest.approx(1.0)
    assert seconds_per_group(two, group_size=4) == pytest.approx(0.5)
    assert seconds_per_group(two, tokens=1500.0) == pytest.approx(0.5)
    assert EngineProfile.model_validate(PROFILE).replicas == 1  # files written before the field: one replica
    with pytest.raises(ValidationError, match="replicas"):
        EngineProfile.model_validate({**PROFILE, "replicas": 0})
