"""GroupScorer logic: dedup, prompt limits, retries, repair, failures (scripted engine: the
tests are about the scorer, not the engine; real engines are covered in tests/engines)."""

from __future__ import annotations

import asyncio

import pytest

from cluster import gqm
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, EngineDeadError, ScriptedEngineOptions, make_engine
from cluster.protocol.schema import GroupRequest
from cluster.scorer import GroupScorer, dedup_candidates, ranking_line, read_verdict
from tests.in_flight import hold_until_in_flight


def scripted(**options) -> object:
    return make_engine(EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(**options)))


async def scorer_with(config: ScoringConfig | None = None, **options) -> GroupScorer:
    engine = scripted(**options)
    await engine.start()
    return GroupScorer(engine, config or ScoringConfig(), replica="r0")


def group(*candidates: str, group_id: str = "g1") -> GroupRequest:
    return GroupRequest(
        group_id=group_id, source="The cat sat on the mat.", candidates=list(candidates), src_lang="en", trg_lang="de"
    )


def test_dedup_keeps_first_seen_order_and_maps_back():
    distinct, position = dedup_candidates(["b", "a", "b", "c", "a"])
    assert distinct == ["b", "a", "c"]
    assert position == [0, 1, 0, 2, 1]


def test_read_verdict_applies_range_policy_to_score_type():
    assert read_verdict("A: 4, B: 9", 2, "score") == [4, 9]
    assert read_verdict("A: 4, B: 12", 2, "score") is None  # the prompt asks for 0..10
    assert read_verdict("B > A", 2, "ranking") == [0, 1]  # tiers, not model-written: the lowest is 0
    # 26 candidates in 26 tiers score 25..0: beyond 0..10, and still a verdict.
    assert read_verdict(" > ".join(gqm.LETTERS), 26, "ranking") == list(range(25, -1, -1))


def test_ranking_line_only_when_present():
    assert ranking_line("x\nB > A\nB: 9, A: 3", "ranking_score") == "B > A"
    assert ranking_line("x\nB: 9, A: 3", "ranking_score") is None
    assert ranking_line("B > A = C", "ranking") == "B > A = C"


async def test_scores_follow_candidates_and_duplicates_share_a_score():
    scorer = await scorer_with()
    result = await scorer.score_group(group("gut [q=8]", "schlecht [q=2]", "gut [q=8]", "mittel [q=5]"))
    assert result.valid and result.failure is None
    assert result.scores == [8, 2, 8, 5]
    assert result.group_id == "g1" and result.replica == "r0"
    assert result.attempts == 1
    assert result.ranking == "A > C > B"  # the model saw 3 distinct texts: A, B, C
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0
    assert result.latency_s >= 0
    # The model saw each distinct text once.
    assert scorer.engine.prompts_seen[-1].count("gut [q=8]") == 1


async def test_prompt_is_the_spec_prompt_through_the_chat_template():
    scorer = await scorer_with()
    request = group("eins [q=1]", "zwei [q=2]")
    await scorer.score_group(request)
    expected = gqm.build_group_prompt(request.source, request.candidates, "en", "de")
    assert scorer.engine.prompts_seen[-1] == (
        f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_retries_at_retry_temperature_after_malformed_answers():
    scorer = await scorer_with(ScoringConfig(retries=3))
    scorer.engine.script_failures(["malformed", "malformed", "ok"])
    result = await scorer.score_group(group("a [q=3]", "b [q=7]"))
    assert result.valid and result.scores == [3, 7]
    assert result.attempts == 3
    temperatures = [s.temperature for s in scorer.engine.sampling_seen[-3:]]
    assert temperatures == [0.0, 1.0, 1.0]


async def test_group_that_never_parses_is_flagged_never_scored():
    scorer = await scorer_with(ScoringConfig(retries=2))
    scorer.engine.script_failures(["malformed"] * 3)
    result = await scorer.score_group(group("a [q=3]", "b [q=7]"))
    assert not result.valid and result.scores is None
    assert result.failure == "parse_failed" and result.attempts == 3
    assert "3 attempts" in result.error


async def test_verdict_repair_avoids_a_full_resample():
    scorer = await scorer_with(ScoringConfig(retries=3, verdict_repair=True))
    scorer.engine.script_failures(["malformed", "ok"])
    result = await scorer.score_group(group("a [q=3]", "b [q=7]", "c [q=5]"))
    assert result.valid and result.scores == [3, 7, 5]
    assert result.attempts == 1 and result.repairs == 1
    repair_sampling = scorer.engine.sampling_seen[-1]
    assert repair_sampling.regex == gqm.verdict_regex(3)
    assert repair_sampling.max_tokens == scorer.config.repair_max_tokens


async def test_single_distinct_candidate_is_not_sent_to_the_engine():
    scorer = await scorer_with()
    result = await scorer.score_group(group("same", "same", "same"))
    assert not result.valid and result.failure == "too_few_distinct"
    assert scorer.engine.generations_served == 0


async def test_prompt_over_the_limit_is_refused():
    scorer = await scorer_with(ScoringConfig(max_prompt_tokens=40))
    result = await scorer.score_group(group("word " * 50, "other"))
    assert not result.valid and result.failure == "prompt_too_long"
    assert "max_prompt_tokens 40" in result.error
    assert scorer.engine.generations_served == 0


async def test_engine_error_and_hang_become_flagged_failures():
    scorer = await scorer_with(ScoringConfig(generation_timeout_s=0.2))
    scorer.engine.script_failures(["error"])
    failed = await scorer.score_group(group("a", "b"))
    assert failed.failure == "engine_error" and "scripted" in failed.error
    scorer.engine.script_failures(["hang"])
    hung = await asyncio.wait_for(scorer.score_group(group("a", "b")), timeout=5)
    assert hung.failure == "timeout" and hung.scores is None


async def test_groups_are_scored_concurrently():
    scorer = await scorer_with()
    hold_until_in_flight(scorer.engine, 8)  # the 8 groups' prompts in the engine at once, not one after another
    groups = [group(f"a{i} [q=1]", f"b{i} [q=9]", group_id=f"g{i}") for i in range(8)]
    results = await scorer.score_groups(groups)
    assert [r.group_id for r in results] == [f"g{i}" for i in range(8)]
    assert all(r.scores == [1, 9] for r in results)


async def test_groups_larger_than_max_group_size_are_refused_when_splitting_is_off():
    scorer = await scorer_with(ScoringConfig(max_group_size=3, split_large_groups=False))
    result = await scorer.score_group(group("a", "b", "c", "d"))
    assert result.failure == "rejected" and "max_group_size 3" in result.error
    assert scorer.engine.generations_served == 0


async def test_groups_larger_than_max_group_size_are_split_by_default():
    # Splitting and merging are covered in tests/test_ensemble.py; here: no refusal, no prompt
    # larger than the limit.
    scorer = await scorer_with(ScoringConfig(max_group_size=3))
    result = await scorer.score_group(group("a [q=1]", "b [q=4]", "c [q=9]", "d [q=6]"))
    assert result.valid and result.scores == [1, 4, 9, 6]
    assert all(prompt.count("Translation ") <= 3 for prompt in scorer.engine.prompts_seen)


@pytest.mark.parametrize("prompt_type", gqm.PROMPT_TYPES)
async def test_every_prompt_type_round_trips(prompt_type):
    scorer = await scorer_with(ScoringConfig(prompt_type=prompt_type))
    result = await scorer.score_group(group("a [q=2]", "b [q=9]", "c [q=2]"))
    assert result.valid
    expected = {"ranking": [0, 1, 0]}.get(prompt_type, [2, 9, 2])
    assert result.scores == expected


# ----------------------------------------------------------------------------- engine death


async def test_a_dead_engine_is_raised_never_flagged():
    scorer = await scorer_with()
    scorer.engine.kill()
    with pytest.raises(EngineDeadError):
        await scorer.score_group(group("a", "b"))


async def test_an_engine_dying_during_generation_is_raised():
    scorer = await scorer_with(ScoringConfig(verdict_repair=True), per_prompt_s=0.2)
    scoring = asyncio.ensure_future(scorer.score_group(group("a", "b")))
    await asyncio.sleep(0.05)
    scorer.engine.kill()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(scoring, timeout=5)


async def test_an_engine_dying_before_the_verdict_repair_is_raised():
    # The first answer has no verdict; the engine dies right after it, before the repair.
    scorer = await scorer_with(ScoringConfig(verdict_repair=True), malformed_rate=1.0, die_after_generations=1)
    with pytest.raises(EngineDeadError):
        await scorer.score_group(group("a", "b"))
    assert scorer.engine.generations_served == 1


async def test_a_generation_past_its_deadline_on_a_hung_engine_is_engine_death():
    # A slow generation on a healthy engine stays a flagged timeout (see above); when the engine
    # does not answer its health check either, it hangs: that is its death.
    scorer = await scorer_with(ScoringConfig(generation_timeout_s=0.2))
    scorer.engine.stall()
    with pytest.raises(EngineDeadError, match="hung"):
        await asyncio.wait_for(scorer.score_group(group("a", "b")), timeout=5)


# ----------------------------------------------------------------------------- references and notes

REFERENCE = {"ref_text": "  Die Katze saß auf der Matte.\n", "ref_lang": "de", "notes": "\nmat: Matte (not Teppich) "}


def group_with(*candidates: str, post_edit: bool = False, **context) -> GroupRequest:
    return group(*candidates).model_copy(update={"post_edit": post_edit, **context})


def user_message(prompt: str) -> str:
    return prompt.removeprefix("<|im_start|>user\n").removesuffix("<|im_end|>\n<|im_start|>assistant\n")


async def test_the_reference_and_notes_follow_the_candidates_in_the_prompt():
    scorer = await scorer_with()
    request = group_with("eins [q=1]", "zwei [q=2]", **REFERENCE)
    result = await scorer.score_group(request)
    assert result.valid and result.scores == [1, 2]
    message = user_message(scorer.engine.prompts_seen[-1])
    assert message == gqm.build_group_prompt(request.source, request.candidates, "en", "de", **REFERENCE)
    assert message.endswith(
        "Translation B:\n```\nzwei [q=2]\n```\n"
        "\n\nYou may refer to the following reference, if helpful, when evaluating the translations.\n\n"
        "German reference:\n```\nDie Katze saß auf der Matte.\n```\n"
        "\n\nYou may refer to the following notes, if helpful, when evaluating the translations.\n\n"
        "Notes:\n```\nmat: Matte (not Teppich)\n```\n"
    )
    # The scripted model's analysis says what it was shown (the client test reads it in answers).
    assert result.answer.startswith(
        "Compared with the German reference: Die Katze saß auf der Matte.\nFollowing the notes: mat: Matte (not Teppich)\n"
    )
    plain = await scorer.score_group(group("eins [q=1]", "zwei [q=2]"))
    assert "reference" not in plain.answer and "notes" not in plain.answer


@pytest.mark.parametrize("config", [
    ScoringConfig(permutations=3),
    ScoringConfig(max_group_size=3, split_subgroup_size=3),
    ScoringConfig(max_group_size=3, permutations=2),
], ids=["permutations", "split", "split+permutations"])
async def test_every_prompt_of_a_plan_carries_the_reference_and_notes(config):
    scorer = await scorer_with(config)
    request = group_with("a [q=1]", "b [q=4]", "c [q=9]", "d [q=6]", "e [q=2]", **REFERENCE)
    result = await scorer.score_group(request)
    assert result.valid and result.scores == [1, 4, 9, 6, 2]
    prompts = [gqm.parse_group_prompt(user_message(prompt)) for prompt in scorer.engine.prompts_seen]
    assert len(prompts) > 1
    assert {(p.ref_text, p.ref_lang, p.notes) for p in prompts} == {
        ("Die Katze saß auf der Matte.", "German", "mat: Matte (not Teppich)")
    }


async def test_very_long_notes_count_against_the_prompt_budget():
    config = ScoringConfig(max_prompt_tokens=200)
    short = await scorer_with(config)
    assert (await short.score_group(group_with("a [q=1]", "b [q=2]", notes="Keep it formal."))).valid
    scorer = await scorer_with(config)
    result = await scorer.score_group(group_with("a [q=1]", "b [q=2]", notes="Use the formal Sie. " * 100))
    assert not result.valid and result.failure == "prompt_too_long"
    assert "max_prompt_tokens 200" in result.error
    assert scorer.engine.generations_served == 0


# ----------------------------------------------------------------------------- post-edit groups

async def test_a_post_edit_group_is_not_deduplicated_and_keeps_its_post_edit_last():
    scorer = await scorer_with()
    # Two MT texts, one of them twice, and a post-edit identical to the first MT text.
    texts = ("gut [q=8]", "schlecht [q=2]", "gut [q=8]", "gut [q=8]")
    result = await scorer.score_group(group_with(*texts, post_edit=True))
    assert result.valid and result.scores == [8, 2, 8, 8]
    assert gqm.parse_group_prompt(user_message(scorer.engine.prompts_seen[-1])).candidates == texts
    # The same texts as an ordinary group: the model sees each distinct text once.
    await scorer.score_group(group_with(*texts))
    assert gqm.parse_group_prompt(user_message(scorer.engine.prompts_seen[-1])).candidates == texts[:2]


async def test_a_post_edit_group_of_one_text_repeated_is_still_scored():
    scorer = await scorer_with()
    result = await scorer.score_group(group_with("same [q=5]", "same [q=5]", post_edit=True))
    assert result.valid and result.scores == [5, 5]


@pytest.mark.parametrize("config", [ScoringConfig(permutations=2), ScoringConfig(max_group_size=3)],
                         ids=["permutations", "split"])
async def test_a_post_edit_group_in_an_ensemble_keeps_every_candidate_and_the_post_edit_last(config):
    # Merged scores come back per candidate in request order, so the post-edit stays the last
    # candidate: ensembles need no refusal for post-edit groups.
    scorer = await scorer_with(config)
    texts = ("mt1 [q=3]", "mt2 [q=6]", "mt1 [q=3]", "pe [q=9]")
    result = await scorer.score_group(group_with(*texts, post_edit=True))
    assert result.valid and result.scores == [3, 6, 3, 9]
    shown = [gqm.parse_group_prompt(user_message(prompt)).candidates for prompt in scorer.engine.prompts_seen]
    assert len(shown) > 1
    assert sum(prompt.count("mt1 [q=3]") for prompt in shown) >= 2  # both copies were shown


async def test_a_post_edit_group_over_max_group_size_without_splitting_is_refused_naming_why():
    scorer = await scorer_with(ScoringConfig(max_group_size=3, split_large_groups=False))
    result = await scorer.score_group(group_with("a", "a", "a", "b", post_edit=True))
    assert result.failure == "rejected" and "post-edit" in result.error and "max_group_size 3" in result.error
    assert scorer.engine.generations_served == 0
