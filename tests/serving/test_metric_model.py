"""A second model deployment in the reward application, named by a recipe as a part.

The metric model is a second tiny model (its own seed and vocabulary: another model than the scorers'
would be) loaded by the transformers engine through the real loading code, a Serve deployment beside the
scorers in the same application; the default tenant's recipe reads it as its ``qe`` part. Groups go
through the product's client (``RewardClient``) over HTTP, whole and member by member. The scorers'
engine is the scripted one: this module is about the second deployment, whose values are checked
against the deployment's own answer for the same candidates.
"""

from __future__ import annotations

import asyncio

import pytest
from ray import serve

from cluster.recipe import MetricItem
from cluster.protocol.schema import GroupRequest, MemberRequest
from cluster.tiny_model import build_tiny_model
from deployments.app import build_app
from deployments.config import AppConfig
from deployments.metric_models import metric_model_clients
from grrm_client import ClientConfig, RewardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP = "metricmodel"
QE_WEIGHT = 0.5
GRRM_SCALE = 0.1
SOURCE = "I have a frog in my throat."
CANDIDATES = ["我嗓子有点哑。 [q=8]", "我喉咙里有只青蛙。 [q=3]", "我嗓子不太舒服。 [q=6]"]
REFERENCE = "我嗓子哑了。"


@pytest.fixture(scope="module")
def metric_app(serve_instance, tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-metric", seed=7, vocab_size=1536)
    config = AppConfig.model_validate({
        "engine": {"kind": "scripted"},
        "replicas": {"num_replicas": 1, "num_cpus": 0.25, "gpus_per_rank": 0},
        "metric_models": {"qe": {
            # One prompt per forward pass: no padding, so its greedy answer is the same in any company.
            "engine": {"kind": "transformers", "model": str(model), "device": "cpu",
                       "engine_kwargs": {"max_batch_size": 1}},
            # A random model's free answer never parses: the constrained repair gives its score.
            "scoring": {"max_prompt_tokens": 1024, "max_answer_tokens": 8, "verdict_repair": True,
                        "repair_max_tokens": 8, "retries": 0},
            "replicas": {"num_replicas": 1, "num_cpus": 0.25, "gpus_per_rank": 0}}},
        "tenants": {"default": {"recipe": {"parts": {
            "grrm": {"scale": GRRM_SCALE}, "qe": {"kind": "model", "deployment": "qe", "weight": QE_WEIGHT}}}}},
    })
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    try:
        yield f"{serve_instance}/{APP}", config
    finally:
        serve.delete(APP)


def deployment_values(config: AppConfig, items: list[MetricItem]) -> list[float | None]:
    """The metric deployment's own answer, through the client the scorer replicas use."""
    handle = serve.get_deployment_handle("MetricModel-qe", app_name=APP)
    [client] = metric_model_clients(config, {"qe": handle}).values()
    return asyncio.run(client.score(items))


def items_of(candidates: list[str], ref_text: str | None) -> list[MetricItem]:
    return [MetricItem(SOURCE, candidate, ref_text, "en", "zh") for candidate in candidates]


def test_the_metric_model_deployment_scores_with_its_own_tiny_model(metric_app):
    _, config = metric_app
    with_reference = deployment_values(config, items_of(CANDIDATES, REFERENCE))
    # Every value is a score the model wrote (0..10) / 10; greedy, so asked again it answers the same.
    assert all(value is not None and round(value * 10) == value * 10 and 0 <= value <= 1 for value in with_reference)
    assert deployment_values(config, items_of(CANDIDATES, REFERENCE)) == with_reference
    # A prompt over its budget is not sent: no value, never a made-up one.
    assert deployment_values(config, items_of(["长" * 2000, CANDIDATES[0]], None))[0] is None
    info = serve.get_deployment_handle("MetricModel-qe", app_name=APP).info.remote().result(timeout_s=60)
    assert info["engine"] == "transformers" and info["model"] == config.metric_models["qe"].engine.model
    assert info["model"] != config.engine.model


def test_a_recipes_model_part_is_in_every_answer_whole_and_by_members(metric_app):
    url, config = metric_app
    expected = deployment_values(config, items_of(CANDIDATES, REFERENCE))
    client = RewardClient(ClientConfig(transport="http", http_url=url, token_env=None, deadline_s=300))
    group = GroupRequest(group_id="frog", source=SOURCE, candidates=CANDIDATES, src_lang="en", trg_lang="zh",
                         ref_text=REFERENCE, ref_lang="zh")
    members = [MemberRequest(group_id="frog-members", group_size=len(CANDIDATES), index=index, source=SOURCE,
                             candidate=candidate, src_lang="en", trg_lang="zh", ref_text=REFERENCE, ref_lang="zh")
               for index, candidate in enumerate(CANDIDATES)]

    async def send():
        try:
            whole = await client.score_group(group)
            by_members = await asyncio.gather(*(client.score_member(member) for member in members))
            return whole, by_members
        finally:
            await client.aclose()

    whole, by_members = asyncio.run(send())
    result = whole.result
    assert result is not None and result.valid, whole
    assert result.scores == [8, 3, 6]
    assert [components["qe"] for components in result.components] == expected
    for score, reward, components in zip(result.scores, result.rewards, result.components):
        assert components["grrm"] == pytest.approx(score * GRRM_SCALE)
        assert reward == pytest.approx(score * GRRM_SCALE + QE_WEIGHT * components["qe"])
    answers = sorted((outcome.result for outcome in by_members), key=lambda answer: answer.index)
    assert all(answer is not None and answer.valid for answer in answers), by_members
    assert [answer.components["qe"] for answer in answers] == expected
    assert [answer.reward for answer in answers] == pytest.approx(result.rewards)
