"""A metric model's pure parts (cluster/metric_judge.py on the scripted engine, no Ray) and its config:
the prompt, the verdict, what gives None, and the deployments the application's builder binds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from cluster import gqm
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions, make_engine
from cluster.metric_judge import SCORE_REGEX, MetricJudge, metric_prompt, read_score
from deployments.app import build_app, metric_model_deployments
from deployments.config import AppConfig


@dataclass(frozen=True)
class Item:
    source: str
    candidate: str
    ref_text: str | None = None
    src_lang: str = "en"
    trg_lang: str = "de"


def test_the_prompt_is_sqm_with_the_reference_in_its_notes():
    assert metric_prompt("Hello.", "Hallo.", "en", "de") == gqm.build_single_prompt("Hello.", "Hallo.", "en", "de")
    prompt = metric_prompt("Hello.", "Hallo.", "en", "de", ref_text="  Hallo zusammen. \n")
    parsed = gqm.parse_single_prompt(prompt)
    assert (parsed.source, parsed.candidate, parsed.trg_lang) == ("Hello.", "Hallo.", "German")
    assert parsed.notes == "German reference:\nHallo zusammen."
    assert metric_prompt("Hello.", "Hallo.", "en", "de", ref_text="  ") == metric_prompt("Hello.", "Hallo.", "en", "de")


@pytest.mark.parametrize(("answer", "score"), [
    ("analysis\n\n7", 7), ("10", 10), ("0\n", 0), ("x\n 3 ", 3),
    ("11", None), ("-1", None), ("7.5", None), ("Score: 7", None), ("7\nmore", None), ("", None), ("٣", None),
])
def test_the_verdict_is_an_in_range_integer_alone_on_the_last_line(answer, score):
    assert read_score(answer) == score


def judge(scoring: ScoringConfig | None = None, **options) -> MetricJudge:
    engine = make_engine(EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(**options)))
    asyncio.run(engine.start())
    return MetricJudge(engine, scoring or ScoringConfig(verdict_repair=True))


def test_a_group_is_scored_item_by_item_in_order_duplicates_generated_once():
    metric = judge()
    items = [Item("Hello.", "Hallo [q=7]", "Hallo."), Item("Hello.", "Hi [q=3]"), Item("Hello.", "Hallo [q=7]", "Hallo."),
             Item("Hello.", "Servus [q=10]", "Hallo.")]
    assert asyncio.run(metric.score(items)) == [0.7, 0.3, 0.7, 1.0]
    assert len(metric.engine.prompts_seen) == 3
    assert "German reference:\nHallo." in metric.engine.prompts_seen[0]
    assert "reference" not in metric.engine.prompts_seen[1]


def test_an_unparseable_answer_is_repaired_by_a_constrained_score_else_none():
    metric = judge()
    metric.engine.script_failures(["malformed"])
    assert asyncio.run(metric.score([Item("Hello.", "Hallo [q=6]")])) == [0.6]
    assert [sampling.regex for sampling in metric.engine.sampling_seen] == [None, SCORE_REGEX]
    # Without repair or retries nothing is made up.
    strict = judge(ScoringConfig(verdict_repair=False, retries=0))
    strict.engine.script_failures(["malformed", "ok"])
    assert asyncio.run(strict.score([Item("a", "b [q=6]"), Item("a", "c [q=2]")])) == [None, 0.2]
    # A retry resamples at retry_temperature.
    retried = judge(ScoringConfig(verdict_repair=False, retries=1))
    retried.engine.script_failures(["malformed"])
    assert asyncio.run(retried.score([Item("a", "b [q=6]")])) == [0.6]
    assert [sampling.temperature for sampling in retried.engine.sampling_seen] == [0.0, 1.0]


def test_an_engine_error_is_none_for_its_item_only():
    metric = judge(ScoringConfig(verdict_repair=True, retries=3))
    metric.engine.script_failures(["error", "ok"])
    assert asyncio.run(metric.score([Item("a", "b [q=6]"), Item("a", "c [q=2]")])) == [None, 0.2]


def test_prompts_over_budget_or_refused_by_the_guard_are_none_and_never_sent():
    metric = judge(ScoringConfig(max_prompt_tokens=80, prompt_guard="reject"))
    items = [Item("a", "b [q=6]"), Item("a", "word " * 100), Item("a", "fenced ``` [q=5]"), Item("a", "c [q=1]", "```")]
    assert asyncio.run(metric.score(items)) == [0.6, None, None, None]
    assert len(metric.engine.prompts_seen) == 1


def test_a_neutralized_fence_is_scored():
    metric = judge()
    assert asyncio.run(metric.score([Item("a", "fenced ``` [q=5]")])) == [0.5]
    assert "```" not in gqm.parse_single_prompt(gqm.embedded_prompt(metric.engine.prompts_seen[0])).candidate


SCRIPTED = {"kind": "scripted"}


def app_config(**metric_models) -> AppConfig:
    return AppConfig.model_validate({"engine": SCRIPTED, "replicas": {"num_replicas": 1, "gpus_per_rank": 0},
                                     "metric_models": metric_models})


@pytest.mark.parametrize(("settings", "problem"), [
    ({"q e": {"engine": SCRIPTED}}, "metric_models.q e: a metric model's name"),
    ({"qe": {"engine": {"kind": "vllm"}}}, "metric_models.qe: engine.model: required"),
    ({"qe": {"engine": SCRIPTED, "replicas": {"autoscaling": {}}}}, "metric_models.qe.replicas.autoscaling"),
    ({"qe": {"engine": {"kind": "vllm", "model": "m", "max_model_len": 1024}}},
     "metric_models.qe: engine.max_model_len (1024) is below scoring.max_prompt_tokens"),
    ({"qe": {"engine": SCRIPTED, "scoring": {"max_answer_tokens": 0}}}, "metric_models.qe.scoring.max_answer_tokens"),
    ({"qe": {}}, "metric_models.qe.engine"),
])
def test_a_bad_metric_model_is_refused_at_load_naming_the_field(settings, problem):
    with pytest.raises(ValidationError) as refused:
        app_config(**settings)
    assert problem in str(refused.value)


def test_each_metric_model_is_a_deployment_of_the_application_bound_to_the_scorers():
    config = app_config(qe={"engine": SCRIPTED, "replicas": {"num_replicas": 2, "num_cpus": 0.5, "gpus_per_rank": 0,
                                                             "env_vars": {"X": "1"}}},
                        ref={"engine": SCRIPTED, "replicas": {"gpus_per_rank": 1, "resources": {"grrm_worker": 1}}})
    deployments = metric_model_deployments(config)
    qe = deployments["qe"]._bound_deployment
    assert qe.name == "MetricModel-qe" and qe.num_replicas == 2
    assert qe.ray_actor_options == {"num_cpus": 0.5, "runtime_env": {"env_vars": {"X": "1"}}}
    assert qe._deployment_config.request_router_config.request_router_class.endswith(":PowerOfTwoChoicesRequestRouter")
    ref = deployments["ref"]._bound_deployment
    assert ref.ray_actor_options == {"num_cpus": 1.0, "num_gpus": 1.0, "resources": {"grrm_worker": 1}}
    scorers = build_app(config)._bound_deployment.init_args[0]._bound_deployment
    assert sorted(scorers.init_kwargs["metric_models"]) == ["qe", "ref"]
    assert scorers.init_kwargs["metric_models"]["qe"]._bound_deployment.name == "MetricModel-qe"
    assert build_app(app_config())._bound_deployment.init_args[0]._bound_deployment.init_kwargs == {"metric_models": {}}
