"""The pure reward arithmetic (spec section 5), exhaustively, against a reference written from the spec."""

from __future__ import annotations

import itertools

import pytest

from grrm_client.adapters.verl.metrics import RewardCounters, step_metrics
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, extra_info
from cluster.rewards import (
    RewardSettings,
    default_outcome,
    group_outcomes,
    is_failure,
    member_outcome,
    overlong_penalty,
    plan_group,
    scored_outcome,
)

OVERLONG = RewardSettings(
    default_reward=-0.5, score_scale_factor=0.1, overlong_enable=True, max_resp_len=100, buffer_len=20, penalty_factor=1.0
)


@pytest.mark.parametrize(
    ("length", "penalty"),
    [(0, 0.0), (50, 0.0), (80, 0.0), (81, 0.05), (90, 0.5), (99, 0.95), (100, 1.0), (101, 1.0), (10_000, 1.0)],
)
def test_overlong_penalty_is_zero_then_linear_then_flat(length, penalty):
    assert overlong_penalty(length, max_resp_len=100, buffer_len=20, penalty_factor=1.0) == pytest.approx(penalty)
    assert overlong_penalty(length, max_resp_len=100, buffer_len=20, penalty_factor=2.5) == pytest.approx(2.5 * penalty)


def test_overlong_penalty_rejects_nonsense():
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(10, max_resp_len=100, buffer_len=0, penalty_factor=1.0)
    with pytest.raises(ValueError, match="length"):
        overlong_penalty(-1, max_resp_len=100, buffer_len=10, penalty_factor=1.0)


def test_disabled_overlong_never_penalises():
    settings = RewardSettings(score_scale_factor=1.0)
    assert settings.penalty(10**9) == 0.0
    assert scored_outcome(7, 10**9, settings).reward == 7.0


def test_scored_and_default_rewards():
    assert scored_outcome(8, 90, OVERLONG).reward == pytest.approx(0.8 - 0.5)
    assert scored_outcome(8, 90, OVERLONG).penalty == pytest.approx(0.5)
    outcome = default_outcome("parse_failed", OVERLONG)
    # A failure gives the default itself, NOT default * scale (the reference's one quirk).
    assert outcome.reward == -0.5 and not outcome.valid and outcome.failed and outcome.penalty == 0.0
    assert default_outcome("too_few_distinct", OVERLONG).reward == -0.5
    assert not default_outcome("too_few_distinct", OVERLONG).failed


def test_plan_group_dedups_in_first_seen_order():
    plan = plan_group(["b", None, "a", "b", "c", None, "a"])
    assert plan.distinct == ("b", "a", "c")
    assert plan.positions == (0, None, 1, 0, 2, None, 1)
    assert plan.comparable
    assert not plan_group(["x", "x", None]).comparable
    assert not plan_group([None, None]).comparable
    assert not plan_group([]).comparable


def reference_rewards(texts, lengths, score_of, settings, failure):
    """Spec section 5, written independently of the implementation."""
    valid = [t for t in texts if t is not None]
    distinct = set(valid)
    rewards = []
    for text, length in zip(texts, lengths):
        if text is None or len(distinct) < 2 or failure is not None:
            rewards.append(settings.default_reward)
            continue
        penalty = 0.0
        if settings.overlong_enable:
            exceed = length - (settings.max_resp_len - settings.buffer_len)
            penalty = min(max(exceed, 0) / settings.buffer_len, 1.0) * settings.penalty_factor
        rewards.append(score_of[text] * settings.score_scale_factor - penalty)
    return rewards


@pytest.mark.parametrize("settings", [RewardSettings(), OVERLONG, RewardSettings(default_reward=1.5, score_scale_factor=3)])
@pytest.mark.parametrize("failure", [None, "parse_failed"])
def test_group_outcomes_match_the_spec_for_every_small_group(settings, failure):
    alphabet = [None, "a", "b", "c"]
    score_of = {"a": 9, "b": 4, "c": 0}
    checked = 0
    for size in range(1, 5):
        for texts in itertools.product(alphabet, repeat=size):
            lengths = [70 + 9 * i for i in range(size)]  # crosses into the overlong buffer
            plan = plan_group(texts)
            distinct_scores = None if failure else [score_of[t] for t in plan.distinct]
            outcomes = group_outcomes(texts, lengths, distinct_scores, settings, failure=failure)
            expected = reference_rewards(texts, lengths, score_of, settings, failure)
            assert [o.reward for o in outcomes] == pytest.approx(expected), texts
            for text, outcome in zip(texts, outcomes):
                if text is None:
                    assert outcome.failure == "invalid_extraction" and not outcome.failed
                elif not plan.comparable:
                    assert outcome.failure == "too_few_distinct" and not outcome.failed
                elif failure:
                    assert outcome.failure == failure and outcome.failed and outcome.raw_score is None
                else:
                    assert outcome.valid and outcome.raw_score == score_of[text] and outcome.failure is None
            # Identical texts always share a reward.
            for (t1, o1), (t2, o2) in itertools.combinations(zip(texts, outcomes), 2):
                if t1 is not None and t1 == t2:
                    assert o1.raw_score == o2.raw_score
            checked += 1
    assert checked == 4 + 16 + 64 + 256


def test_group_outcomes_checks_lengths_and_scores():
    with pytest.raises(ValueError, match="lengths"):
        group_outcomes(["a", "b"], [1], [1, 2], RewardSettings())
    with pytest.raises(ValueError, match="distinct_scores"):
        group_outcomes(["a", "b", "a"], [1, 1, 1], [1, 2, 3], RewardSettings())


def test_invalid_reasons_are_kept():
    outcomes = group_outcomes(["a", None, "b"], [1, 1, 1], [3, 5], RewardSettings(), invalid_reasons=[None, "invalid_text", None])
    assert [o.failure for o in outcomes] == [None, "invalid_text", None]
    assert [o.reward for o in outcomes] == [3.0, 0.0, 5.0]


def test_member_outcome():
    settings = RewardSettings(default_reward=-1.0, score_scale_factor=0.5)
    assert member_outcome(extracted=True, score=6, failure=None, length=3, settings=settings).reward == 3.0
    invalid = member_outcome(extracted=False, score=None, failure=None, length=3, settings=settings)
    assert (invalid.reward, invalid.failure, invalid.failed) == (-1.0, "invalid_extraction", False)
    # An invalid rollout is invalid whatever the group's fate.
    assert member_outcome(extracted=False, score=None, failure="invalid_text", length=3, settings=settings).failure == "invalid_text"
    timeout = member_outcome(extracted=True, score=None, failure="timeout", length=3, settings=settings)
    assert (timeout.reward, timeout.failed) == (-1.0, True)
    missing = member_outcome(extracted=True, score=None, failure=None, length=3, settings=settings)
    assert missing.failure == "no_score" and missing.failed


@pytest.mark.parametrize(
    ("reason", "failed"),
    [
        (None, False), ("invalid_extraction", False), ("invalid_text", False), ("too_few_distinct", False),
        ("prompt_too_long", False), ("wrong_language", False), ("parse_failed", True), ("engine_error", True), ("timeout", True),
        ("rejected", True), ("deadline", True), ("unavailable", True), ("transport_error", True),
    ],
)
def test_failure_classification(reason, failed):
    assert is_failure(reason) is failed


def test_extra_info_has_the_same_keys_and_types_for_every_outcome():
    settings = RewardSettings()
    outcomes = [
        scored_outcome(7, 10, settings),
        default_outcome("invalid_extraction", settings),
        default_outcome("too_few_distinct", settings),
        default_outcome("unavailable", settings),
    ]
    infos = [extra_info(o, extracted=i != 1, attempts=1, request_attempts=2, replica="r", mask_failed=True) for i, o in enumerate(outcomes)]
    for info in infos:
        assert tuple(info) == EXTRA_INFO_KEYS
        assert {k: type(v) for k, v in info.items() if k != "raw_score"} == {
            k: type(v) for k, v in infos[0].items() if k != "raw_score"
        }
    assert [i["masked"] for i in infos] == [False, False, False, True]
    assert [i["failure"] for i in infos] == ["", "invalid_extraction", "too_few_distinct", "unavailable"]
    assert infos[0]["raw_score"] == 7 and infos[3]["raw_score"] is None
    unmasked = extra_info(outcomes[3], extracted=True, mask_failed=False)
    assert unmasked["failed"] and not unmasked["masked"]


def test_counters_and_step_metrics_agree():
    settings = RewardSettings()
    outcomes = [scored_outcome(5, 1, settings), default_outcome("timeout", settings), default_outcome("too_few_distinct", settings)]
    counters = RewardCounters()
    infos = []
    for outcome in outcomes:
        info = extra_info(outcome, extracted=True, request_attempts=2, mask_failed=True)
        counters.record(info)
        infos.append(info)
    metrics = counters.as_metrics()
    assert metrics == step_metrics(infos)  # untimed rows: no exposure figures
    assert metrics["grrm/failed"] == 1 and metrics["grrm/masked"] == 1 and metrics["grrm/valid"] == 1
    assert metrics["grrm/default/timeout"] == 1 and metrics["grrm/default/too_few_distinct"] == 1
    assert counters.retried == 3
