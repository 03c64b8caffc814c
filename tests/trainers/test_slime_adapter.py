"""The slime adapter (``grrm_client/adapters/slime.py``), following slime's source (``slime/rollout/rm_hub``:
``--custom-rm-path`` with ``--group-rm`` awaits ``func(args, samples)`` once per group of
``n_samples_per_prompt`` and wants one float per sample). ``Sample`` below is a stand-in with slime's
field names (``group_index``, ``index``, ``prompt``, ``response``, ``label``, ``metadata``,
``response_length``); slime's custom rollout log function is called as ``slime/ray/rollout.py``'s
``_log_rollout_data`` calls it.

Settings, reading and group ids in milliseconds (the in-process service of the bridge tests); then
against the live ``local.yaml`` app over HTTP, and a service that goes away mid-run."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from grrm_client.adapters import slime
from grrm_client.reward_client import RewardClient
from grrm_client.adapters.slime import (
    SlimeRewardConfig,
    group_rm,
    log_rollout,
    rollout_metrics,
    sample_context,
    sample_languages,
)
from tests.bridge.helpers import LocalTransport, recipe


@dataclass
class Sample:
    """slime's ``Sample``: the fields its group reward models read."""

    group_index: int
    index: int
    prompt: str
    response: str
    label: Any = None
    metadata: dict = field(default_factory=dict)
    response_length: int = 0


def group(group_index: int, responses: list[str], *, in_label: bool = False) -> list[Sample]:
    where = {"source": "The cat sleeps.", "src_lang": "en", "trg_lang": "de"}
    return [Sample(group_index=group_index, index=group_index * len(responses) + k, prompt="Translate: The cat sleeps.",
                   response=response, label=json.dumps(where) if in_label else None,
                   metadata={} if in_label else dict(where))
            for k, response in enumerate(responses)]


@pytest.fixture
def environment(monkeypatch):
    """The rollout process's environment, read anew by the adapter."""
    def set_env(**variables: str) -> None:
        for name in [name for name in __import__("os").environ if name.startswith("GRRM_")]:
            monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        slime.reset()
    yield set_env
    slime.reset()


def test_settings_come_from_grrm_variables_and_bad_ones_are_named():
    config = SlimeRewardConfig.from_env({"GRRM_URL": "http://h:8000/grrm", "GRRM_EXTRACTOR": "none",
                                         "GRRM_DEFAULT_REWARD": "-1", "GRRM_DEADLINE_S": "30", "GRRM_API_TOKEN": "t",
                                         "GRRM_TINY_MODEL_DIR": "/x"})
    assert (config.transport, config.http_url, config.extractor, config.default_reward, config.deadline_s) == (
        "http", "http://h:8000/grrm", "none", -1.0, 30.0)
    assert SlimeRewardConfig.from_env({"GRRM_APP_NAME": "grrm"}).transport == "handle"
    with pytest.raises(ValueError, match="GRRM_URL: set it"):
        SlimeRewardConfig.from_env({})
    with pytest.raises(ValidationError, match="deadline_s"):
        SlimeRewardConfig.from_env({"GRRM_URL": "http://h", "GRRM_DEADLINE_S": "soon"})
    with pytest.raises(ValidationError, match="extractor"):
        SlimeRewardConfig.from_env({"GRRM_URL": "http://h", "GRRM_EXTRACTOR": "regex"})


def test_source_and_languages_come_from_metadata_or_a_json_label():
    config = SlimeRewardConfig.from_env({"GRRM_URL": "http://h"})
    assert sample_languages(group(0, ["a"])[0], config) == ("The cat sleeps.", "en", "de")
    assert sample_languages(group(0, ["a"], in_label=True)[0], config) == ("The cat sleeps.", "en", "de")
    bare = Sample(group_index=0, index=0, prompt="p", response="r", label="Die Katze schläft.")
    with pytest.raises(ValueError, match="source: the sample carries none in its metadata or its JSON label"):
        sample_languages(bare, config)
    bare.metadata = {"source": "The cat sleeps."}
    with pytest.raises(ValueError, match="src_lang: the sample carries none"):
        sample_languages(bare, config)
    defaults = SlimeRewardConfig.from_env({"GRRM_URL": "http://h", "GRRM_SRC_LANG": "en", "GRRM_TRG_LANG": "de"})
    assert sample_languages(bare, defaults) == ("The cat sleeps.", "en", "de")


def test_each_call_is_one_group_request_under_its_group_index(environment):
    environment(GRRM_URL="http://unused", GRRM_EXTRACTOR="none", GRRM_RUN_ID="run-s")
    config, _ = slime._adapter()
    service = LocalTransport()
    slime._state["client"] = RewardClient(config, transport=service)
    samples = group(7, [f"Die Katze {k} schläft [q={q}]." for k, q in enumerate([3, 9, 1, 4])])
    assert asyncio.run(group_rm(None, samples)) == [3, 9, 1, 4]
    assert asyncio.run(group_rm(None, samples)) == [3, 9, 1, 4]  # asked again: scored again, under a new id
    assert [request.group_id for request in service.group_requests] == ["run-s:7:1", "run-s:7:2"]
    assert all(sample.metadata["grrm_failure"] == "" for sample in samples)
    # A blank response is not a translation the service takes: the default, and the rest is compared.
    mixed = group(8, ["", "Die Katze [q=2].", "Die Katze [q=6]."])
    assert asyncio.run(group_rm(None, mixed)) == [0.0, 2, 6]
    assert mixed[0].metadata["grrm_failure"] == "invalid_text"
    assert len(service.group_requests) == 2  # the mixed group went as its members


def test_the_recipes_parts_are_logged_with_slimes_rollout_metrics(environment):
    environment(GRRM_URL="http://unused", GRRM_EXTRACTOR="none", GRRM_RUN_ID="run-s")
    config, _ = slime._adapter()
    service = LocalTransport(recipe=recipe(default_reward=-1.0, scale=0.1,
                                           overlong={"max_response_tokens": 100, "buffer_tokens": 50, "penalty": 0.5}))
    slime._state["client"] = RewardClient(config, transport=service)
    samples = group(3, [f"Die Katze {k} [q={q}]." for k, q in enumerate([4, 8])], in_label=True)
    context = {"ref_text": "Die Katze schläft.", "ref_lang": "de", "notes": "Katze, not Kater."}
    for sample, length in zip(samples, (20, 100)):
        sample.label = json.dumps({**json.loads(sample.label), **context})
        sample.response_length = length
    assert sample_context(samples[0], config) == slime.RowContext.of(**context)
    assert asyncio.run(group_rm(None, samples)) == pytest.approx([0.4, 0.8 - 0.5])
    (sent,) = service.group_requests
    assert (sent.ref_text, sent.notes, sent.response_tokens) == (context["ref_text"], context["notes"], [20, 100])
    assert [sample.metadata["grrm_components"] for sample in samples] == [
        {"grrm": pytest.approx(0.4), "overlong": 0.0}, {"grrm": pytest.approx(0.8), "overlong": -0.5}]
    # A third sample whose reward got no answer: no parts, counted as a failure.
    lost = Sample(group_index=4, index=9, prompt="p", response="r",
                  metadata={"grrm_components": {}, "grrm_failure": "deadline", "grrm_failed": True, "grrm_valid": False})
    metrics = rollout_metrics([*samples, lost, Sample(group_index=5, index=10, prompt="p", response="not ours")])
    assert metrics == pytest.approx({
        "grrm/rewards": 3, "grrm/valid": 2, "grrm/failed": 1, "grrm/valid_rate": 2 / 3, "grrm/failed_rate": 1 / 3,
        "grrm/default/deadline": 1, "grrm/component/grrm/mean": 1.2 / 3, "grrm/component/overlong/mean": -0.5 / 3})
    # slime's _log_rollout_data: the function returns False (slime logs the step as ever) after adding ours
    # to the metrics slime logs next.
    extra = {"rollout/some_metric": 1.0}
    assert log_rollout(7, None, samples, extra, 12.5) is False
    assert extra["grrm/component/overlong/mean"] == -0.25 and extra["rollout/some_metric"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_group_of_samples_is_scored_by_the_live_service(local_app, environment):
    url, _handle, _config = local_app
    environment(GRRM_URL=url, GRRM_EXTRACTOR="none", GRRM_DEADLINE_S="120")
    samples = group(0, [f"Die Katze {k} schläft auf dem Dach." for k in range(4)], in_label=True)
    rewards = asyncio.run(group_rm(None, samples))
    assert len(rewards) == 4 and all(isinstance(reward, float) and 0 <= reward <= 10 for reward in rewards)
    assert all(sample.metadata["grrm_failure"] == "" for sample in samples)
    # local.yaml's recipe: the reward is the grrm part at weight 1, and slime's step logs the part.
    assert [sample.metadata["grrm_components"] for sample in samples] == [{"grrm": reward} for reward in rewards]
    assert rollout_metrics(samples)["grrm/component/grrm/mean"] == pytest.approx(sum(rewards) / 4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_service_that_stops_mid_run_gives_the_flagged_default_within_the_deadline(serve_instance, environment):
    app = "slime-stop"
    config = AppConfig(engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions()),
                       replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0))
    serve.run(build_app(config), name=app, route_prefix=f"/{app}")
    environment(GRRM_URL=f"{serve_instance}/{app}", GRRM_EXTRACTOR="none", GRRM_DEFAULT_REWARD="-1",
                GRRM_DEADLINE_S="10", GRRM_MAX_ATTEMPTS="3")
    responses = [f"Die Katze {k} schläft [q={k + 2}]." for k in range(4)]
    assert asyncio.run(group_rm(None, group(0, responses))) == [2, 3, 4, 5]
    serve.delete(app)
    samples = group(1, responses)
    assert asyncio.run(group_rm(None, samples)) == [-1.0] * 4
    # Answered, not waited out: Serve has no such route, and the client gives up on it (a hang: the test's timeout).
    assert {sample.metadata["grrm_failure"] for sample in samples} == {"not_found"}
