"""Large groups and position-bias ensembles: planning, the Bradley-Terry merge (pure logic), and
GroupScorer's split / permutation paths on the scripted engine with known true qualities."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cluster import ensemble, gqm
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions, make_engine
from cluster.engines.base import count_tokens
from simulated.scripted_engine import group_scores, noise_sd
from cluster.protocol.schema import GroupRequest
from cluster.scorer import GroupScorer
from tests.in_flight import hold_until_in_flight

SOURCE = "The cat sat on the mat."


async def scorer_with(config: ScoringConfig | None = None, **options) -> GroupScorer:
    engine = make_engine(EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(**options)))
    await engine.start()
    return GroupScorer(engine, config or ScoringConfig(), replica="r0")


def marked_group(qualities, group_id: str = "g") -> GroupRequest:
    return GroupRequest(
        group_id=group_id,
        source=SOURCE,
        candidates=[f"Übersetzung {i} [q={q}]" for i, q in enumerate(qualities)],
        src_lang="en",
        trg_lang="de",
    )


def qualities(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(0, 10) for _ in range(n)]


def prompt_members(prompt: str) -> list[int]:
    """Which candidates of marked_group a prompt shows, in prompt order."""
    parsed_ids = []
    for block in prompt.split("Translation ")[1:]:
        if "Übersetzung " in block:
            parsed_ids.append(int(block.split("Übersetzung ", 1)[1].split(" ", 1)[0]))
    return parsed_ids


# --------------------------------------------------------------------------- planning


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 120),
    max_size=st.integers(2, 26),
    anchors=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_subgroups_share_anchors_cover_everyone_and_fit(n, max_size, anchors, seed):
    subgroups = ensemble.plan_subgroups(n, max_size, anchors, seed)
    assert all(gqm.MIN_CANDIDATES <= len(members) <= max_size for members in subgroups)
    assert all(len(set(members)) == len(members) for members in subgroups)
    assert set().union(*subgroups) == set(range(n))
    if n <= max_size:
        assert subgroups == [list(range(n))]  # no split: the plain prompt, in order
        return
    shared = set.intersection(*(set(members) for members in subgroups))
    assert len(shared) == min(anchors, max_size - 1)
    # Only anchors are scored more than once; sizes are balanced.
    others = [member for members in subgroups for member in members if member not in shared]
    assert sorted(others) == sorted(set(range(n)) - shared)
    assert max(map(len, subgroups)) - min(map(len, subgroups)) <= 1
    assert ensemble.connects_all(n, subgroups)
    assert ensemble.plan_subgroups(n, max_size, anchors, seed) == subgroups  # deterministic


def test_subgroup_count_is_the_fewest_that_fit():
    assert [len(s) for s in ensemble.plan_subgroups(16, 8, 2, seed=1)] == [7, 7, 6]
    assert len(ensemble.plan_subgroups(32, 8, 2, seed=1)) == 5  # 30 others, 6 per subgroup
    assert len(ensemble.plan_subgroups(32, 26, 2, seed=1)) == 2


@settings(max_examples=200, deadline=None)
@given(
    members=st.lists(st.integers(0, 99), min_size=2, max_size=26, unique=True),
    k=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_permutations_are_orders_of_the_members_starting_with_the_given_one(members, k, seed):
    for design in ("antithetic", "random"):
        orders = ensemble.plan_permutations(members, k, seed, design)
        assert len(orders) == k and orders[0] == tuple(members)
        assert all(sorted(order) == sorted(members) for order in orders)
    antithetic = ensemble.plan_permutations(members, k, seed, "antithetic")
    if k >= 2:
        assert antithetic[1] == tuple(reversed(members))
    if k % 2 == 0:
        # Every candidate's mean position is the middle: a linear position bias cancels.
        for member in members:
            positions = [order.index(member) for order in antithetic]
            assert sum(positions) * 2 == k * (len(members) - 1)


def test_plan_prompts_is_every_subgroup_in_every_order():
    plain = ensemble.plan_prompts(5, max_size=8)
    assert plain == [ensemble.SubPrompt((0, 1, 2, 3, 4), 0, 0)]
    prompts = ensemble.plan_prompts(20, max_size=8, anchors=2, permutations=3, seed=7)
    subgroups = ensemble.plan_subgroups(20, 8, 2, seed=7)
    assert len(prompts) == len(subgroups) * 3
    for prompt in prompts:
        assert sorted(prompt.members) == sorted(subgroups[prompt.subgroup])
        assert len(prompt.members) <= 8


# --------------------------------------------------------------------------- merge


def test_pair_outcomes_use_only_differences():
    soft = ensemble.pair_outcomes([3, 1], [7, 5], temperature=2.0)
    shifted = ensemble.pair_outcomes([3, 1], [9, 7], temperature=2.0)
    assert soft == shifted and soft[0].i == 3 and soft[0].j == 1
    assert soft[0].win == pytest.approx(1 / (1 + 2.718281828459045**-1))
    hard = ensemble.pair_outcomes([0, 1, 2], [5, 5, 2], temperature=0)
    assert [(o.i, o.j, o.win) for o in hard] == [(0, 1, 0.5), (0, 2, 1.0), (1, 2, 1.0)]
    with pytest.raises(gqm.GQMInputError):
        ensemble.pair_outcomes([0, 0], [1, 2])


def test_bradley_terry_recovers_known_strengths():
    truth = [1.5, -0.5, 0.0, 2.0, -3.0]
    outcomes = [
        ensemble.PairOutcome(i, j, 1 / (1 + 2.718281828459045 ** -(truth[i] - truth[j])))
        for i in range(5)
        for j in range(5)
        if i < j
    ]
    strengths = ensemble.fit_bradley_terry(5, outcomes, prior=1e-9)
    centred = [s - sum(strengths) / 5 for s in strengths]
    assert centred == pytest.approx([t - sum(truth) / 5 for t in truth], abs=1e-5)


def test_bradley_terry_stays_finite_when_one_candidate_wins_everything():
    outcomes = [ensemble.PairOutcome(0, j, 1.0) for j in (1, 2, 3)] + [ensemble.PairOutcome(1, 2, 0.5)]
    strengths = ensemble.fit_bradley_terry(4, outcomes, prior=1e-2)
    assert all(abs(s) < 1e3 for s in strengths)
    assert strengths[0] == max(strengths)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(9, 60),
    max_size=st.integers(4, 12),
    anchors=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    shifted=st.booleans(),
)
def test_merge_recovers_the_true_scores_on_noiseless_input(n, max_size, anchors, seed, shifted):
    truth = qualities(n, seed)
    plan = ensemble.plan_prompts(n, max_size=max_size, anchors=anchors, permutations=2, seed=seed)
    rng = random.Random(seed)
    # Each prompt may see the whole scale shifted (a model judges relative to the group it sees).
    verdicts = []
    for prompt in plan:
        shift = rng.choice([-2, 0, 1, 3]) if shifted else 0
        verdicts.append((prompt.members, [truth[m] + shift for m in prompt.members]))
    merged = ensemble.merge_verdicts(n, verdicts)
    assert merged is not None
    assert gqm.ranking_accuracy(truth, merged.scores) == 1.0  # the true order, ties included
    if not shifted or min(truth) == 0 and max(truth) == 10:
        assert merged.scores == truth  # and, with the level pinned, the true scores
    # Strengths order the candidates like the truth (one point = 1/temperature = 0.5 logit);
    # tied candidates in different subgroups differ only by the prior's small shrinkage.
    for i in range(n):
        for j in range(n):
            if truth[i] > truth[j]:
                assert merged.strengths[i] > merged.strengths[j]
            elif truth[i] == truth[j]:
                assert merged.strengths[i] == pytest.approx(merged.strengths[j], abs=0.05)


def test_merged_scores_are_a_monotone_map_of_the_strengths():
    rng = random.Random(3)
    truth = qualities(30, 3)
    plan = ensemble.plan_prompts(30, max_size=8, anchors=2, seed=3)
    noisy = {p: [min(10, max(0, truth[m] + rng.choice([-2, -1, 0, 1, 2]))) for m in p.members] for p in plan}
    verdicts = [(p.members, noisy[p]) for p in plan]
    merged = ensemble.merge_verdicts(30, verdicts)
    assert merged is not None and merged.slope > 0
    for i in range(30):
        for j in range(30):
            if merged.strengths[i] > merged.strengths[j]:
                assert merged.scores[i] >= merged.scores[j]
    assert all(0 <= score <= 10 for score in merged.scores)


def test_merge_refuses_when_the_verdicts_do_not_connect_everyone():
    plan = ensemble.plan_prompts(16, max_size=8, anchors=2, seed=0)
    truth = qualities(16, 0)
    verdicts = [(p.members, [truth[m] for m in p.members]) for p in plan]
    assert ensemble.merge_verdicts(16, verdicts) is not None
    assert ensemble.merge_verdicts(16, verdicts[1:]) is None  # a subgroup's own members are lost
    assert ensemble.merge_verdicts(16, []) is None
    assert not ensemble.connects_all(4, [[0, 1], [2, 3]])
    assert ensemble.connects_all(4, [[0, 1], [2, 3], [1, 2]])


def test_ranking_prompt_type_merges_into_tiers():
    truth = [2, 0, 1, 1, 3, 0]  # tier scores as the parser gives them: the lowest tier is 0
    verdicts = [((0, 1, 2, 3), (2, 0, 1, 1)), ((4, 5, 0, 2), (3, 0, 2, 1))]
    merged = ensemble.merge_verdicts(6, verdicts, prompt_type="ranking")
    assert merged is not None and merged.scores == [2, 0, 1, 1, 3, 0] == truth
    # Parsed sub-prompt verdicts feed the merge unchanged: "A > C = D > B" is A: 2, B: 0, C: 1, D: 1.
    assert gqm.parse_group_answer("A > C = D > B", 4, "ranking") == list(verdicts[0][1])


# --------------------------------------------------------------------------- scripted engine noise


def test_scripted_noise_is_off_by_default_and_fixed_per_prompt():
    marks = [f"c{i} [q={q}]" for i, q in enumerate([2, 5, 8, 5])]
    assert group_scores("s", marks) == [2, 5, 8, 5]
    noisy = group_scores("s", marks, noise=1.5, noise_seed=4)
    assert noisy == group_scores("s", marks, noise=1.5, noise_seed=4)  # same prompt, same verdict
    other_orders = {tuple(group_scores("s", marks[::-1], noise=1.5, noise_seed=seed)) for seed in range(10)}
    assert len(other_orders) > 1  # other prompts get independent errors
    assert noise_sd(8, 0.5, 0.25, 8) == 0.5 and noise_sd(16, 0.5, 0.25, 8) == 2.5
    shifted = group_scores("s", ["[q=5]"] * 4, shift_noise=3.0, noise_seed=1)
    assert len(set(shifted)) == 1  # a prompt shift moves the whole group together


# --------------------------------------------------------------------------- GroupScorer


async def test_split_group_is_scored_in_subgroups_and_merged_to_the_true_scores():
    truth = qualities(20, 11)
    scorer = await scorer_with(ScoringConfig(max_group_size=8, split_anchors=2))
    request = marked_group(truth)
    result = await scorer.score_group(request)
    assert result.valid and result.failure is None
    assert result.scores == truth
    prompts = scorer.engine.prompts_seen
    assert len(prompts) == 3 and all(len(prompt_members(p)) <= 8 for p in prompts)
    members = [set(prompt_members(p)) for p in prompts]
    assert len(set.intersection(*members)) == 2 and set.union(*members) == set(range(20))
    # Usage and attempts cover every sub-prompt.
    assert result.attempts == 3
    assert result.usage.prompt_tokens == sum(count_tokens(scorer.engine.tokenizer, p) for p in prompts)
    assert result.usage.completion_tokens > 0
    assert "merge" in result.stages
    assert result.ranking is not None and result.ranking.startswith(gqm.LETTERS[truth.index(max(truth))])


async def test_groups_beyond_26_letters_are_split_and_duplicates_share_a_score():
    truth = qualities(40, 5)
    request = marked_group(truth)
    request = request.model_copy(update={"candidates": request.candidates + request.candidates[:5]})
    scorer = await scorer_with(ScoringConfig())  # max_group_size 26: two subgroups
    result = await scorer.score_group(request)
    assert result.valid and result.scores == truth + truth[:5]
    assert result.ranking is None  # 40 distinct candidates have no letters
    assert all(len(prompt_members(p)) <= 26 for p in scorer.engine.prompts_seen)


async def test_permutations_map_scores_back_to_the_right_candidates():
    truth = [7, 2, 9, 4, 4, 0]
    scorer = await scorer_with(ScoringConfig(permutations=4))
    result = await scorer.score_group(marked_group(truth))
    assert result.valid and result.scores == truth
    orders = [prompt_members(p) for p in scorer.engine.prompts_seen]
    assert len(orders) == 4 and orders[0] == list(range(6)) and orders[1] == list(range(6))[::-1]
    assert len({tuple(order) for order in orders}) == 4
    assert result.attempts == 4


async def test_position_bias_is_removed_by_permutations():
    async def accuracy(permutations: int) -> float:
        scorer = await scorer_with(
            ScoringConfig(permutations=permutations), position_bias=4.0, score_noise=0.5, seed=3
        )
        groups = [marked_group(qualities(8, seed), f"g{seed}") for seed in range(30)]
        results = await scorer.score_groups(groups)
        truths = [qualities(8, seed) for seed in range(30)]
        return gqm.mean_ranking_accuracy([(t, r.scores) for t, r in zip(truths, results)])

    k1, k2, k4 = await accuracy(1), await accuracy(2), await accuracy(4)
    assert k4 > k1 + 0.05
    assert k2 > k1


async def test_split_and_merge_beats_one_oversized_prompt_under_size_degradation():
    options = {"score_noise": 0.3, "oversize_noise": 0.25, "trained_group_size": 8, "seed": 1}
    truths = [qualities(16, seed) for seed in range(12)]
    groups = [marked_group(t, f"g{i}") for i, t in enumerate(truths)]
    oversized = await scorer_with(ScoringConfig(max_group_size=16), **options)
    split = await scorer_with(ScoringConfig(max_group_size=8), **options)
    one = await oversized.score_groups(groups)
    merged = await split.score_groups(groups)
    assert all(len(prompt_members(p)) == 16 for p in oversized.engine.prompts_seen)
    assert all(len(prompt_members(p)) <= 8 for p in split.engine.prompts_seen)
    acc_one = gqm.mean_ranking_accuracy([(t, r.scores) for t, r in zip(truths, one)])
    acc_split = gqm.mean_ranking_accuracy([(t, r.scores) for t, r in zip(truths, merged)])
    assert acc_split >= acc_one


async def test_a_failed_subgroup_makes_the_group_invalid_never_made_up():
    scorer = await scorer_with(ScoringConfig(max_group_size=8, retries=1))
    # Sub-prompts start in plan order: the second subgroup fails both its attempts.
    scorer.engine.script_failures(["ok", "malformed", "ok", "malformed"])
    result = await scorer.score_group(marked_group(qualities(20, 2)))
    assert not result.valid and result.scores is None
    assert result.failure == "parse_failed"
    assert "1 of 3 prompts failed" in result.error
    assert result.attempts == 1 + 2 + 1  # every attempt of every sub-prompt
    assert result.usage.prompt_tokens > 0


async def test_a_failed_permutation_is_tolerated_while_the_graph_stays_connected():
    truth = [3, 8, 5, 1]
    scorer = await scorer_with(ScoringConfig(permutations=2, retries=0))
    scorer.engine.script_failures(["ok", "error"])
    result = await scorer.score_group(marked_group(truth))
    assert result.valid and result.scores == truth
    assert result.attempts == 2


async def test_verdict_repair_composes_with_split_groups():
    truth = qualities(12, 9)
    scorer = await scorer_with(ScoringConfig(max_group_size=8, verdict_repair=True, retries=2))
    scorer.engine.script_failures(["malformed"])
    result = await scorer.score_group(marked_group(truth))
    assert result.valid and result.scores == truth
    assert result.repairs == 1 and result.attempts == 2  # two subgroups, one attempt each


async def test_a_sub_prompt_over_the_token_limit_names_the_reason():
    scorer = await scorer_with(ScoringConfig(max_group_size=4, max_prompt_tokens=120))
    request = marked_group(qualities(8, 1))
    request.candidates[5] = "word " * 200 + "[q=3]"
    result = await scorer.score_group(request)
    assert not result.valid and result.failure == "prompt_too_long"


async def test_plans_larger_than_the_prompt_budget_are_refused():
    scorer = await scorer_with(ScoringConfig(max_group_size=4, max_prompts_per_group=5))
    result = await scorer.score_group(marked_group(qualities(20, 1)))
    assert result.failure == "rejected" and "max_prompts_per_group 5" in result.error
    assert scorer.engine.generations_served == 0


async def test_sub_prompts_run_concurrently():
    scorer = await scorer_with(ScoringConfig(max_group_size=8, permutations=2))
    hold_until_in_flight(scorer.engine, 6)  # the 6 sub-prompts in the engine at once, not one after another
    result = await scorer.score_group(marked_group(qualities(20, 4)))
    assert result.valid and result.attempts == 6


def test_config_rejects_subgroups_larger_than_max_group_size():
    with pytest.raises(ValidationError, match="split_subgroup_size"):
        ScoringConfig(max_group_size=8, split_subgroup_size=10)
    assert ScoringConfig().permutations == 1 and ScoringConfig().split_large_groups
