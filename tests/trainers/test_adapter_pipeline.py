"""The one member pipeline every adapter takes (``grrm_client/adapters/pipeline.py``), and the import
paths users configure, kept as re-exports of the adapters."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster.rewards import INVALID_TEXT, Completion, RewardSettings
from cluster.protocol.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from cluster.protocol.members import (
    FailureLog,
    RowContext,
    component_means,
    components_of,
    from_recipe,
    member_request,
    member_reward,
)
from cluster.protocol.calls import CallOutcome
from grrm_client.adapters.pipeline import REJECTED, reward_group, reward_member

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = RewardSettings(default_reward=-1.0, score_scale_factor=0.1)
VALID = Completion(extracted=True, candidate="Hallo Welt", invalid_reason=None, length=7)
INVALID = Completion(extracted=True, candidate=None, invalid_reason=INVALID_TEXT, length=9)
WHERE = dict(group_id="run:g1", group_size=4, source="Hello world", src_lang="en", trg_lang="de")


def result(score: int | None, failure: str | None = None) -> MemberResult:
    return MemberResult(group_id="run:g1", index=0, score=score, valid=score is not None, failure=failure,
                        attempts=1, replica="r1")


class Recorder:
    """A client that answers every member with one score and keeps what it was sent."""

    def __init__(self, answer: MemberResult):
        self.answer, self.sent = answer, []

    async def score_member(self, member: MemberRequest) -> CallOutcome[MemberResult]:
        self.sent.append(member)
        return CallOutcome(result=self.answer, attempts=1)


def test_a_member_is_its_position_or_an_id_of_its_own_and_an_invalid_one_is_sent_marked():
    placed = member_request(VALID, index=2, tenant="alpha", sent_at=5.0, **WHERE)
    assert (placed.index, placed.member_id, placed.tenant, placed.candidate, placed.invalid) == (2, None, "alpha",
                                                                                               "Hallo Welt", False)
    first, again = member_request(VALID, **WHERE), member_request(VALID, **WHERE)
    assert first.index is None and first.member_id and first.member_id != again.member_id
    blank = member_request(INVALID, index=1, **WHERE)
    assert (blank.candidate, blank.invalid) == ("", True)
    with pytest.raises(ValidationError, match="src_lang"):
        member_request(VALID, **{**WHERE, "src_lang": "x" * 65})


def test_the_answer_becomes_the_reward_and_an_invalid_completion_keeps_its_own_reason():
    assert member_reward(VALID, result(8), None, SETTINGS).reward == pytest.approx(0.8)
    failed = member_reward(VALID, result(None, "parse_failed"), None, SETTINGS)
    assert (failed.reward, failed.failed, failed.failure) == (-1.0, True, "parse_failed")
    lost = member_reward(VALID, None, "timeout", SETTINGS)
    assert (lost.failed, lost.failure) == (True, "timeout")
    # Its reward never depended on the service: not a service failure, whatever came back.
    invalid = member_reward(INVALID, None, "timeout", SETTINGS)
    assert (invalid.reward, invalid.failed, invalid.failure) == (-1.0, False, INVALID_TEXT)


def test_reward_member_sends_once_and_a_member_the_service_cannot_take_is_rejected_unsent():
    client = Recorder(result(6))
    outcome, call = asyncio.run(reward_member(client, VALID, SETTINGS, index=0, **WHERE))
    assert outcome.reward == pytest.approx(0.6) and call.attempts == 1 and len(client.sent) == 1
    outcome, call = asyncio.run(reward_member(client, VALID, SETTINGS, index=0, **{**WHERE, "trg_lang": ""}))
    assert (outcome.failed, outcome.failure, call.attempts, len(client.sent)) == (True, REJECTED, 0, 1)
    assert "trg_lang" in call.error


def test_each_failure_reason_is_logged_once():
    log = FailureLog()
    timeout = member_reward(VALID, None, "timeout", SETTINGS)
    assert [log.first(timeout), log.first(timeout), log.first(member_reward(VALID, None, "engine_error", SETTINGS)),
            log.first(member_reward(VALID, result(3), None, SETTINGS))] == [True, False, True, False]


def test_no_adapter_builds_a_member_or_its_reward_but_the_pipeline():
    """The member mapping is written once (the protocol's): every adapter, through the pipeline, and the
    service's OpenRLHF route call it."""
    places = [*sorted((ROOT / "grrm_client").rglob("*.py")), *sorted((ROOT / "trainer_bridge").rglob("*.py")),
              *sorted((ROOT / "deployments" / "http").rglob("*.py")),
              *sorted((ROOT / "cluster" / "protocol").rglob("*.py"))]
    builders = {}
    for path in places:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"MemberRequest", "member_outcome"}:
                builders.setdefault(str(path.relative_to(ROOT)), set()).add(node.func.id)
    assert builders == {"cluster/protocol/members.py": {"MemberRequest", "member_outcome"}}
    callers = [*(ROOT / "grrm_client" / "adapters").rglob("*.py"), ROOT / "cluster" / "protocol" / "openrlhf.py"]
    users = {path.stem for path in callers
             if "grrm_client.adapters.pipeline" in path.read_text() or "cluster.protocol.members" in path.read_text()}
    assert {"trl", "slime", "openrlhf", "reward_manager", "batch"} <= users


def test_the_import_paths_users_configure_are_the_adapters():
    import grrm_client.adapters.slime as slime
    import grrm_client.adapters.trl as trl
    import grrm_client.slime
    import grrm_client.trl
    from grrm_client.adapters.verl.reward_manager import GRRMRewardManager
    from trainer_bridge.reward_manager import GRRMRewardManager as configured

    assert configured is GRRMRewardManager  # pkg://trainer_bridge.reward_manager in verl's config
    assert grrm_client.trl.GRRMReward is trl.GRRMReward
    assert (grrm_client.slime.group_rm, grrm_client.slime.reset) == (slime.group_rm, slime.reset)


# -- the service's recipe: its reward and parts, as every adapter takes them --------------------------------


def recipe_member(score: int | None, reward: float, failure: str | None = None, **parts: float) -> MemberResult:
    """A member answer from a service with a recipe: the composed reward and its parts before weighting."""
    return MemberResult(group_id="run:g1", index=0, score=score, valid=score is not None, failure=failure,
                        reward=reward, components=parts)


def test_an_answers_reward_is_the_reward_with_its_parts_and_the_adapters_default_only_without_an_answer():
    answered = member_reward(VALID, recipe_member(8, 0.04, grrm=0.08, overlong=-0.04), None, SETTINGS)
    # Not the adapter's score x 0.1: the service's reward, taken as it is.
    assert (answered.reward, answered.valid, answered.raw_score, answered.failed) == (0.04, True, 8, False)
    assert from_recipe(answered) and components_of(answered) == {"grrm": 0.08, "overlong": -0.04}
    # A flagged answer carries the recipe's default: that is the reward, still counted as a failure.
    failed = member_reward(VALID, recipe_member(None, -0.04, "parse_failed"), None, SETTINGS)
    assert (failed.reward, failed.failed, failed.failure, components_of(failed)) == (-0.04, True, "parse_failed", {})
    gated = member_reward(VALID, recipe_member(None, -0.04, "wrong_language"), None, SETTINGS)
    assert (gated.reward, gated.valid, gated.failure) == (-0.04, False, "wrong_language")
    # A completion without a translation: the recipe's reward for it (its format part), its own reason.
    invalid = member_reward(INVALID, recipe_member(None, -1.04, "too_few_distinct", format=-1.0), None, SETTINGS)
    assert (invalid.reward, invalid.failure, invalid.failed, components_of(invalid)) == (
        -1.04, INVALID_TEXT, False, {"format": -1.0})
    # No answer: the adapter's own default, flagged, without parts.
    lost = member_reward(VALID, None, "deadline", SETTINGS)
    assert (lost.reward, lost.failed, from_recipe(lost), components_of(lost)) == (-1.0, True, False, {})


def test_a_rows_reference_notes_and_response_length_go_on_its_member_and_a_half_pair_is_refused_unsent():
    context = RowContext.of("Hallo Welt!", "de", "Welt: keep it")
    member = member_request(VALID, index=0, context=context, **WHERE)
    assert (member.ref_text, member.ref_lang, member.notes, member.response_tokens) == (
        "Hallo Welt!", "de", "Welt: keep it", 7)
    unknown = member_request(Completion(extracted=True, candidate="Hallo", invalid_reason=None), index=0, **WHERE)
    assert (unknown.response_tokens, unknown.ref_text, unknown.notes) == (None, None, None)  # no length: none sent
    # Missing, NaN (pandas) and blank values are no context at all.
    assert RowContext.of(None, float("nan"), "  ") == RowContext()
    client = Recorder(result(6))
    outcome, call = asyncio.run(reward_member(client, VALID, SETTINGS, index=0, context=RowContext.of("Hallo", None),
                                              **WHERE))
    assert (outcome.failed, outcome.failure, call.attempts, client.sent) == (True, REJECTED, 0, [])
    assert "ref_text: given without ref_lang" in call.error


class GroupRecorder:
    """A client that answers a whole group with ``answer`` and every member with a recipe's default, and
    keeps what it was sent."""

    def __init__(self, answer: GroupResult | None = None):
        self.answer, self.groups, self.members = answer, [], []

    async def score_group(self, group: GroupRequest) -> CallOutcome[GroupResult]:
        self.groups.append(group)
        return CallOutcome(result=self.answer, attempts=1, failure=None if self.answer else "unavailable")

    async def score_member(self, member: MemberRequest) -> CallOutcome[MemberResult]:
        self.members.append(member)
        answer = recipe_member(None, -0.04, "too_few_distinct", **({"format": -1.0} if member.invalid else {}))
        return CallOutcome(result=answer, attempts=1)


def completions(*texts: str | None) -> list[Completion]:
    return [Completion(extracted=text is not None, candidate=text, invalid_reason=None if text else INVALID_TEXT,
                       length=100 + k) for k, text in enumerate(texts)]


GROUP_WHERE = dict(group_id="run:g1", source="Hello world", src_lang="en", trg_lang="de")


def test_a_whole_group_sends_every_candidate_in_order_and_takes_each_candidates_reward_and_parts():
    # As the replica builds it (cluster/recipe_runner.py): the gated last candidate's score is None.
    answer = GroupResult(group_id="run:g1", valid=True).model_copy(update=dict(
        scores=[8, 3, 8, None], rewards=[0.08, -0.01, 0.08, -0.04],
        components=[{"grrm": 0.08, "overlong": 0.0}, {"grrm": 0.03, "overlong": -0.04},
                    {"grrm": 0.08, "overlong": 0.0}, {}]))
    client = GroupRecorder(answer)
    context = RowContext.of("Hallo Welt!", "de")
    scored = asyncio.run(reward_group(client, completions=completions("Hallo", "Welt", "Hallo", "Hello"),
                                      settings=SETTINGS, context=context, **GROUP_WHERE))
    (sent,) = client.groups
    assert sent.candidates == ["Hallo", "Welt", "Hallo", "Hello"]  # not deduplicated here: the service does
    assert (sent.response_tokens, sent.ref_text, sent.ref_lang) == ([100, 101, 102, 103], "Hallo Welt!", "de")
    assert [outcome.reward for outcome in scored.outcomes] == [0.08, -0.01, 0.08, -0.04]
    assert [components_of(outcome) for outcome in scored.outcomes] == answer.components
    # The candidate the gate took out of a group with a verdict: no score, the recipe's default.
    assert [(outcome.valid, outcome.failure) for outcome in scored.outcomes] == [
        (True, None), (True, None), (True, None), (False, "wrong_language")]
    assert scored.call is not None and scored.calls == [scored.call] * 4


def test_a_group_with_a_completion_without_translation_goes_as_members_for_the_recipes_rewards():
    client = GroupRecorder()
    scored = asyncio.run(reward_group(client, completions=completions("Hallo", None, "Welt"), settings=SETTINGS,
                                      **GROUP_WHERE))
    assert client.groups == [] and [m.index for m in client.members] == [0, 1, 2]
    assert [(m.invalid, m.group_size, m.response_tokens) for m in client.members] == [
        (False, 3, 100), (True, 3, 101), (False, 3, 102)]
    assert [outcome.reward for outcome in scored.outcomes] == [-0.04] * 3
    assert components_of(scored.outcomes[1]) == {"format": -1.0} and scored.outcomes[1].failure == INVALID_TEXT
    assert scored.call is None and len(scored.calls) == 3


def test_a_group_without_an_answer_gets_the_adapters_default_and_one_without_a_recipe_its_arithmetic():
    lost = asyncio.run(reward_group(GroupRecorder(None), completions=completions("Hallo", "Welt"), settings=SETTINGS,
                                    **GROUP_WHERE))
    assert [(o.reward, o.failure, o.failed) for o in lost.outcomes] == [(-1.0, "unavailable", True)] * 2
    old = GroupResult(group_id="run:g1", valid=True, scores=[8, 3])  # a service before the recipe
    scored = asyncio.run(reward_group(GroupRecorder(old), completions=completions("Hallo", "Welt"), settings=SETTINGS,
                                      **GROUP_WHERE))
    assert [o.reward for o in scored.outcomes] == pytest.approx([0.8, 0.3]) and not from_recipe(scored.outcomes[0])


def test_a_steps_part_means_count_a_rollout_without_the_part_as_zero():
    assert component_means([{"grrm": 0.08, "bleu": 0.5}, {"grrm": 0.02}, {}]) == pytest.approx(
        {"grrm/component/grrm/mean": 0.1 / 3, "grrm/component/bleu/mean": 0.5 / 3})
    assert component_means([{}, {}]) == {}
