"""The reward recipe: its config (refused at load, naming the field), its pure composition, the runner that
takes a group through the language gate, the engine and the model parts, and the assembler's members.

Quick tier: no Ray, no engine. The engine is a fake score function; the language detector is a stub behind
the real gate (``cluster/language_gate.py``): a text starting with ``xx:`` is in language ``xx``, any other
is German. The service, its threads and lingua itself: tests/serving/test_recipe_service.py."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest
import sacrebleu
import yaml
from pydantic import ValidationError

from cluster.assembly import AssemblySettings, GroupAssembler
from cluster.language_gate import LanguageGate
from cluster.recipe import (
    CandidateFacts,
    GroupFacts,
    MetricItem,
    RecipeSettings,
    compose,
    grrm_recipe,
)
from cluster.recipe_runner import RecipeRunner
from cluster.protocol.schema import GroupRequest, GroupResult, MemberRequest
from deployments.config import AppConfig

# Every part, rule and model.
ALL_PARTS = {
    "default_reward": -0.5,
    "parts": {"grrm": {"scale": 0.1}, "language": {"mode": "penalty", "penalty": 0.3, "weight": 2.0},
              "overlong": {"max_response_tokens": 100, "buffer_tokens": 50, "penalty": 0.2}, "format": {"weight": 0.25},
              "bleu": {"weight": 0.1}, "chrf": {"weight": 0.1}, "length_ratio": {"weight": 0.5},
              "qe": {"kind": "model", "deployment": "qe", "weight": 0.4}},
}


def recipe(settings: dict) -> RecipeSettings:
    return RecipeSettings.model_validate(settings)


# ----------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(("settings", "named"), [
    ({"parts": {"qa": {}}}, "parts.qa: unknown part kind 'qa'"),
    ({"parts": {"fluency": {"kind": "fluent"}}}, "parts.fluency: unknown part kind 'fluent'"),
    ({"parts": {"grrm": {"weight": math.inf}}}, "parts.grrm.weight: Input should be a finite number"),
    ({"parts": {"grrm": {"weight": math.nan}}}, "parts.grrm.weight: Input should be a finite number"),
    ({"parts": {"grrm": {"weight": "1"}}}, "parts.grrm.weight: Input should be a valid number"),
    ({"parts": {"grrm": {"scale": "0.01"}}}, "parts.grrm.scale: Input should be a valid number"),
    ({"parts": {"overlong": {"max_response_tokens": 100, "buffer_tokens": 200, "penalty": 0.1}}},
     "parts.overlong: buffer_tokens: 200 exceeds max_response_tokens 100"),
    ({"parts": {"overlong": {"max_response_tokens": 100, "buffer_tokens": 20}}}, "parts.overlong.penalty: Field required"),
    ({"parts": {"language": {"mode": "warn"}}}, "parts.language.mode: Input should be 'gate' or 'penalty'"),
    ({"parts": {"qe": {"kind": "model"}}}, "parts.qe.deployment: Field required"),
    ({"parts": {"bleu": {"smooth": "exp"}}}, "parts.bleu.smooth: Extra inputs are not permitted"),
    ({"parts": {"a": {"kind": "language"}, "b": {"kind": "language", "mode": "penalty"}}},
     "parts: a, b are all language parts"),
    ({"default_reward": math.inf}, "default_reward"),
])
def test_a_bad_recipe_is_refused_at_config_load_naming_the_field(settings: dict, named: str) -> None:
    with pytest.raises(ValidationError) as refused:
        AppConfig.model_validate({"engine": {"kind": "scripted"}, "tenants": {"default": {"recipe": settings}}})
    assert named in str(refused.value)
    assert "tenants.default.recipe" in str(refused.value)


def test_a_model_part_names_a_configured_metric_model() -> None:
    with pytest.raises(ValidationError, match=r"http.tenants\[0\].recipe.parts.qe.deployment: no metric model 'qe'"):
        AppConfig.model_validate({"engine": {"kind": "scripted"}, "http": {"tenants": [
            {"name": "eval", "recipe": {"parts": {"qe": {"kind": "model", "deployment": "qe"}}}}]}})


def test_a_named_tenant_without_a_recipe_takes_the_default_tenants() -> None:
    config = AppConfig.model_validate(yaml.safe_load("""
        engine: {kind: scripted}
        tenants: {default: {recipe: {default_reward: -0.04, parts: {grrm: {scale: 0.01}}}}}
        http: {tenants: [{name: plain}, {name: own, recipe: {parts: {chrf: {}}}}]}
    """))
    assert config.tenant("plain").recipe == config.tenant("anyone").recipe == config.tenants.default.recipe
    assert list(config.tenant("own").recipe.parts) == ["chrf"] and config.tenant("own").recipe.default_reward == 0


def test_the_shipped_configs_hold_their_recipes() -> None:
    from deployments.config import load_app_config

    assert load_app_config("deployments/grrm.yaml").tenants.default.recipe == grrm_recipe()
    assert load_app_config("deployments/local.yaml").tenants.default.recipe == RecipeSettings()


# ----------------------------------------------------------------------------------------- compose


def facts(position: int, text: str | None, score: int | None, **fields) -> CandidateFacts:
    return CandidateFacts(position=position, text=text, score=score, **fields)


GROUP = GroupFacts(source="Die Katze sitzt auf der Matte.", src_lang="de", trg_lang="en")


def test_the_default_recipe_gives_each_candidate_its_score() -> None:
    composed = compose(RecipeSettings(), GROUP, [facts(0, "a", 7), facts(1, "b", None), facts(2, None, None)])
    assert [(one.reward, one.components) for one in composed] == [(7.0, {"grrm": 7.0}), (0.0, {}), (0.0, {})]


def test_grrm_recipe_by_hand() -> None:
    """GRRM's reward code: score 7 x 0.01, minus DAPO's overlong penalty of a 3,500-token response (1,452 tokens
    into the 2,048-token buffer before 4,096: 1452/2048 x 0.04); a candidate without a score: -0.04 flat."""
    composed = compose(grrm_recipe(), GROUP, [facts(0, "a", 7, response_tokens=3500), facts(1, "b", 7, response_tokens=2000),
                                              facts(2, "c", 7, response_tokens=5000), facts(3, "d", None, response_tokens=3500)])
    penalty = 1452 / 2048 * 0.04
    assert composed[0].reward == pytest.approx(0.07 - penalty)
    assert composed[0].components == pytest.approx({"grrm": 0.07, "overlong": -penalty})
    assert composed[1].reward == pytest.approx(0.07) and composed[1].components["overlong"] == 0
    assert composed[2].reward == pytest.approx(0.07 - 0.04)
    assert (composed[3].reward, composed[3].components) == (-0.04, {})


def test_reward_is_the_weighted_sum_of_the_components() -> None:
    settings = recipe(ALL_PARTS)
    group = GroupFacts(source="The cat sat on the mat.", src_lang="en", trg_lang="de",
                       ref_text="Die Katze sass auf der Matte.")
    candidates = [facts(0, "Die Katze sass auf der Matte.", 9, response_tokens=80, language_ok=True,
                        model_values={"qe": 0.9}),
                  facts(1, "The cat sat on the mat.", 3, response_tokens=20, language_ok=False, model_values={"qe": 0.2}),
                  facts(2, None, None, response_tokens=10)]
    composed = compose(settings, group, candidates)
    for one, candidate in zip(composed, candidates):
        base = settings.default_reward if candidate.score is None else 0.0
        assert one.reward == pytest.approx(base + sum(settings.parts[name].weight * value
                                                      for name, value in one.components.items()))
    first, second, invalid = (one.components for one in composed)
    assert first["grrm"] == pytest.approx(0.9) and first["overlong"] == pytest.approx(-30 / 50 * 0.2)
    assert first["language"] == 0 and second["language"] == -0.3 and first["format"] == 0 and first["qe"] == 0.9
    assert first["bleu"] == pytest.approx(1.0) and first["chrf"] == pytest.approx(1.0)
    # A candidate without a translation: the default and its format part only.
    assert invalid == {"format": -1.0} and composed[2].reward == pytest.approx(-0.5 - 0.25)


def test_bleu_and_chrf_are_sacrebleus_against_the_reference_and_absent_without_one() -> None:
    settings = recipe({"parts": {"bleu": {}, "chrf": {"word_order": 2}}})
    hypothesis, reference = "The cat was sitting on the mat.", "The cat sat on the mat."
    with_reference = GroupFacts(source="Die Katze sass auf der Matte.", src_lang="de", trg_lang="en",
                                ref_text=reference)
    [scored] = compose(settings, with_reference, [facts(0, hypothesis, 5)])
    assert scored.components["bleu"] == pytest.approx(sacrebleu.sentence_bleu(hypothesis, [reference]).score / 100)
    assert scored.components["chrf"] == pytest.approx(
        sacrebleu.sentence_chrf(hypothesis, [reference], word_order=2).score / 100)
    [unreferenced] = compose(settings, GROUP, [facts(0, hypothesis, 5)])
    assert unreferenced.components == {} and unreferenced.reward == 0.0


def test_bleu_tokenizes_chinese_by_character_words() -> None:
    settings = recipe({"parts": {"bleu": {}}})
    group = GroupFacts(source="The cat sat on the mat.", src_lang="en", trg_lang="Chinese", ref_text="猫坐在垫子上。")
    [one] = compose(settings, group, [facts(0, "猫坐在垫子上。", 5)])
    # With 13a's space splitting the whole sentence would be one word: still 1.0 here, so check the tokenizer.
    assert one.components["bleu"] == pytest.approx(1.0) and settings.parts["bleu"].tokenizer("Chinese") == "zh"
    assert settings.parts["bleu"].tokenizer("ja") == "char" and settings.parts["bleu"].tokenizer("de") == "13a"


def test_length_ratio_is_the_log_of_characters_against_the_source() -> None:
    settings = recipe({"parts": {"length_ratio": {}, "zh_en": {"kind": "length_ratio", "expected_ratio": 2.0}}})
    group = GroupFacts(source="x" * 20, src_lang="zh", trg_lang="en")
    same, double, half = compose(settings, group, [facts(0, "y" * 20, 1), facts(1, " " + "y" * 40 + " ", 1),
                                                   facts(2, "y" * 10, 1)])
    assert same.components == pytest.approx({"length_ratio": 0.0, "zh_en": -math.log(2)})
    assert double.components == pytest.approx({"length_ratio": -math.log(2), "zh_en": 0.0})
    assert half.components["length_ratio"] == pytest.approx(-math.log(2))


def test_a_post_edit_is_rewarded_against_the_groups_mean() -> None:
    """Spec 5c: (s[-1] - mean(s)) x scale - overlong; the machine translations get the default, no components."""
    group = GroupFacts(source="s", src_lang="en", trg_lang="de", post_edit=True, scores=(4, 6, 8))
    composed = compose(grrm_recipe(), group, [facts(0, "mt1", 4, response_tokens=3000), facts(1, "mt2", 6),
                                              facts(2, "pe", 8, response_tokens=3000)])
    assert composed[2].components == pytest.approx({"grrm": (8 - 6) * 0.01, "overlong": -(952 / 2048 * 0.04)})
    assert [(one.reward, one.components) for one in composed[:2]] == [(-0.04, {}), (-0.04, {})]


# ------------------------------------------------------------------------------------------- runner


class StubDetector:
    """``xx: text`` is in language xx; any other text is German."""

    def detect(self, texts: Sequence[str]) -> list[str | None]:
        return [text.split(":", 1)[0] if text[2:3] == ":" else "de" for text in texts]


class Engine:
    """A scorer standing in for the engine lane: records the groups it is shown; a candidate's
    score is the digit it ends with."""

    def __init__(self, result: GroupResult | None = None):
        self.shown: list[GroupRequest] = []
        self.result = result

    async def score_group(self, group: GroupRequest) -> GroupResult:
        self.shown.append(group)
        if self.result is not None:
            return self.result
        return GroupResult(group_id=group.group_id, scores=[int(c[-1]) for c in group.candidates], valid=True,
                           attempts=1, replica="r")


class Metric:
    """A MetricModel: each distinct candidate's value is its length / 100, None for texts in ``failing``."""

    def __init__(self, failing: tuple[str, ...] = ()):
        self.calls: list[list[MetricItem]] = []
        self.failing = failing

    async def score(self, items: Sequence[MetricItem]) -> list[float | None]:
        self.calls.append(list(items))
        return [None if item.candidate in self.failing else len(item.candidate) / 100 for item in items]


def runner(settings: dict | RecipeSettings, **kwargs) -> RecipeRunner:
    chosen = settings if isinstance(settings, RecipeSettings) else recipe(settings)
    return RecipeRunner(lambda tenant: chosen, passes=LanguageGate(StubDetector()).passes, **kwargs)


def group(*candidates: str, **fields) -> GroupRequest:
    return GroupRequest(group_id="g", source="The cat sat on the mat.", candidates=list(candidates), src_lang="en",
                        trg_lang="de", **fields)


def test_gated_candidates_leave_the_group_before_the_engine_sees_it() -> None:
    engine = Engine()
    outcome = asyncio.run(runner(grrm_recipe()).run(group("Gut 7", "en: Good 9", "Recht 5", "en: Good 9"), engine))
    assert [shown.candidates for shown in engine.shown] == [["Gut 7", "Recht 5"]]
    assert outcome.scores == [7, None, 5, None]
    assert outcome.failures == [None, "wrong_language", None, "wrong_language"]
    assert outcome.rewards == pytest.approx([0.07, -0.04, 0.05, -0.04])
    answer = outcome.group_result(group("Gut 7", "en: Good 9", "Recht 5", "en: Good 9"))
    assert answer.valid and answer.scores == [7, None, 5, None] and answer.components[1] == {}


def test_a_group_gated_below_two_distinct_candidates_is_never_sent() -> None:
    """Gated before deduplication: two copies of one German text are one candidate, nothing to compare."""
    engine = Engine()
    outcome = asyncio.run(runner(grrm_recipe()).run(group("Gut 7", "en: Good 9", "Gut 7"), engine))
    assert engine.shown == [] and outcome.result.failure == "too_few_distinct" and outcome.scores is None
    assert outcome.failures == [None, "wrong_language", None] and outcome.rewards == [-0.04] * 3


def test_penalty_mode_shows_every_candidate_and_penalises_the_wrong_language() -> None:
    engine = Engine()
    outcome = asyncio.run(runner({"parts": {"grrm": {}, "language": {"mode": "penalty", "penalty": 2.0}}}).run(
        group("Gut 7", "en: Good 9"), engine))
    assert engine.shown[0].candidates == ["Gut 7", "en: Good 9"]
    assert outcome.components == [{"grrm": 7.0, "language": 0.0}, {"grrm": 9.0, "language": -2.0}]
    assert outcome.rewards == [7.0, 7.0] and outcome.failures == [None, None]


def test_a_post_edit_group_checks_only_the_post_edit() -> None:
    engine = Engine()
    post_edit = group("en: mt 4", "Mt 6", "Pe 8", post_edit=True, response_tokens=[0, 0, 3000])
    outcome = asyncio.run(runner(grrm_recipe()).run(post_edit, engine))
    assert engine.shown[0].candidates == ["en: mt 4", "Mt 6", "Pe 8"] and engine.shown[0].post_edit
    assert outcome.rewards == pytest.approx([-0.04, -0.04, 0.02 - 952 / 2048 * 0.04])
    engine = Engine()
    outcome = asyncio.run(runner(grrm_recipe()).run(group("Mt 4", "Mt 6", "en: pe 8", post_edit=True), engine))
    assert engine.shown == [] and outcome.result.failure == "wrong_language" and outcome.rewards == [-0.04] * 3


def test_model_parts_score_each_distinct_candidate_beside_the_engine() -> None:
    metric = Metric()
    settings = {"parts": {"grrm": {}, "qe": {"kind": "model", "deployment": "qe", "weight": 10.0}}}
    outcome = asyncio.run(runner(settings, metric_models={"qe": metric}).run(
        group("Gut 7", "Gut 7", "Ganz gut 5", ref_text="Gut.", ref_lang="de"), Engine()))
    assert [[item.candidate for item in call] for call in metric.calls] == [["Gut 7", "Ganz gut 5"]]
    assert metric.calls[0][0] == MetricItem(source="The cat sat on the mat.", candidate="Gut 7", ref_text="Gut.",
                                            src_lang="en", trg_lang="de")
    assert outcome.components[0] == {"grrm": 7.0, "qe": 0.05} and outcome.rewards == pytest.approx([7.5, 7.5, 6.0])


def test_a_model_part_without_a_value_fails_the_group_to_its_default() -> None:
    settings = {"default_reward": -1.0, "parts": {"grrm": {}, "qe": {"kind": "model", "deployment": "qe"}}}
    outcome = asyncio.run(runner(settings, metric_models={"qe": Metric(failing=("Gut 7",))}).run(
        group("Gut 7", "Ganz gut 5"), Engine()))
    assert outcome.result.failure == "engine_error" and "recipe model part qe" in outcome.result.error
    assert outcome.scores is None and outcome.rewards == [-1.0, -1.0] and outcome.components == [{}, {}]


def test_a_recipe_the_replica_cannot_apply_is_refused_naming_the_part() -> None:
    with pytest.raises(ValueError, match=r"tenants.default.recipe.parts.qe.deployment: no metric model 'qe'"):
        runner({}).check("tenants.default.recipe", recipe({"parts": {"qe": {"kind": "model", "deployment": "qe"}}}))
    with pytest.raises(ValueError, match="language part needs the language detector"):
        RecipeRunner(lambda tenant: grrm_recipe()).check("tenants.default.recipe", grrm_recipe())


def test_an_engine_failure_gives_every_candidate_the_default() -> None:
    failed = GroupResult(valid=False, failure="parse_failed", error="no verdict", attempts=7)
    outcome = asyncio.run(runner(grrm_recipe()).run(group("Gut 7", "Recht 5"), Engine(result=failed)))
    assert outcome.result.failure == "parse_failed" and outcome.rewards == [-0.04, -0.04]


# ------------------------------------------------------------------------------------------ members


def member(index: int, candidate: str, **fields) -> MemberRequest:
    values = {"group_id": "g", "group_size": 3, "index": index, "source": "The cat sat on the mat.",
              "candidate": candidate, "src_lang": "en", "trg_lang": "de"}
    return MemberRequest(**{**values, **fields})


async def members(assembler: GroupAssembler, *sent: MemberRequest) -> list:
    return list(await asyncio.gather(*(assembler.submit(one) for one in sent)))


def test_members_carry_rewards_their_recipe_composed() -> None:
    engine = Engine()
    settings = recipe({"default_reward": -0.04, "parts": {"grrm": {"scale": 0.01}, "language": {},
                                                         "format": {"weight": 0.5},
                                                         "overlong": {"max_response_tokens": 4096,
                                                                      "buffer_tokens": 2048, "penalty": 0.04}}})
    assembler = GroupAssembler(engine, AssemblySettings(assembly_timeout_s=30), rewards=runner(settings))
    context = {"ref_text": "Die Katze sass auf der Matte.", "ref_lang": "de", "notes": "Keep it short."}
    answers = asyncio.run(members(assembler, member(0, "Gut 7", response_tokens=3500, **context),
                                  member(1, "", invalid=True, response_tokens=9000, **context),
                                  member(2, "Recht 5", response_tokens=100, **context)))
    [shown] = engine.shown
    assert shown.candidates == ["Gut 7", "Recht 5"] and shown.response_tokens == [3500, 100]
    assert (shown.ref_text, shown.ref_lang, shown.notes) == (context["ref_text"], "de", "Keep it short.")
    first, invalid, third = answers
    assert first.reward == pytest.approx(0.07 - 1452 / 2048 * 0.04) and first.components["format"] == 0
    assert invalid.reward == pytest.approx(-0.04 - 0.5) and invalid.components == {"format": -1.0}
    assert third.reward == pytest.approx(0.05) and third.group_scores == [7, None, 5]


def test_a_gated_member_fails_wrong_language_and_its_group_mates_are_scored() -> None:
    engine = Engine()
    assembler = GroupAssembler(engine, AssemblySettings(assembly_timeout_s=30), rewards=runner(grrm_recipe()))
    first, gated, third = asyncio.run(members(assembler, member(0, "Gut 7"), member(1, "en: Good 9"),
                                              member(2, "Recht 5")))
    assert engine.shown[0].candidates == ["Gut 7", "Recht 5"]
    assert (gated.failure, gated.valid, gated.score, gated.reward) == ("wrong_language", False, None, -0.04)
    assert first.valid and first.score == 7 and first.reward == pytest.approx(0.07) and first.failure is None
    # A retry of the gated member is answered from the scored group, as it was the first time.
    again = asyncio.run(assembler.submit(member(1, "en: Good 9")))
    assert (again.failure, again.reward) == ("wrong_language", -0.04) and len(engine.shown) == 1


def test_members_gated_below_two_candidates_get_their_reasons() -> None:
    engine = Engine()
    assembler = GroupAssembler(engine, AssemblySettings(assembly_timeout_s=30), rewards=runner(grrm_recipe()))
    answers = asyncio.run(members(assembler, member(0, "Gut 7"), member(1, "en: Good 9"), member(2, "en: Fine 5")))
    assert engine.shown == [] and [one.failure for one in answers] == ["too_few_distinct", "wrong_language",
                                                                        "wrong_language"]
    assert [one.reward for one in answers] == [-0.04] * 3


@pytest.mark.parametrize(("field", "value", "named"), [
    ("ref_text", "Eine andere Referenz.", "ref_text (a different text here)"),
    ("ref_lang", "German", "ref_lang ('German' here, 'de' in the group)"),
    ("notes", None, "notes (none here)"),
])
def test_a_member_disagreeing_on_the_reference_or_notes_is_a_conflict(field: str, value, named: str) -> None:
    context = {"ref_text": "Die Katze sass.", "ref_lang": "de", "notes": "Formal."}

    async def scenario():
        assembler = GroupAssembler(Engine(), AssemblySettings(assembly_timeout_s=30), rewards=runner(RecipeSettings()))
        first = asyncio.ensure_future(assembler.submit(member(0, "Gut 7", **context)))
        await asyncio.sleep(0)
        odd = await assembler.submit(member(1, "Recht 5", **{**context, field: value}))
        first.cancel()
        return odd

    answer = asyncio.run(scenario())
    assert answer.failure == "conflict" and named in answer.error and answer.reward == 0.0


def test_a_cached_answer_checks_the_reference_too() -> None:
    engine = Engine()
    assembler = GroupAssembler(engine, AssemblySettings(assembly_timeout_s=30), rewards=runner(RecipeSettings()))
    context = {"ref_text": "Die Katze sass.", "ref_lang": "de"}
    asyncio.run(members(assembler, *(member(i, f"Satz {i}", group_size=2, **context) for i in range(2))))
    retry = asyncio.run(assembler.submit(member(0, "Satz 0", group_size=2, **context)))
    assert retry.reward == 0.0 and retry.components == {"grrm": 0.0} and retry.failure is None
    other = asyncio.run(assembler.submit(member(0, "Satz 0", group_size=2, ref_text="Anders.", ref_lang="de")))
    assert other.failure == "conflict" and "ref_text (a different text here)" in other.error
