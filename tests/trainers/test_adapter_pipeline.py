"""The one member pipeline every adapter takes (``grrm_client/adapters/pipeline.py``), and the import
paths users configure, kept as re-exports of the adapters."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster.rewards import INVALID_TEXT, Completion, RewardSettings
from cluster.schema import MemberRequest, MemberResult
from grrm_client.adapters.pipeline import REJECTED, FailureLog, member_request, member_reward, reward_member
from grrm_client.reward_client import CallOutcome

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
    """The member pipeline is written once: every adapter (and the service's OpenRLHF route) calls it."""
    places = [*sorted((ROOT / "grrm_client").rglob("*.py")), *sorted((ROOT / "trainer_bridge").rglob("*.py")),
              *sorted((ROOT / "deployments" / "http").rglob("*.py"))]
    builders = {}
    for path in places:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"MemberRequest", "member_outcome"}:
                builders.setdefault(str(path.relative_to(ROOT)), set()).add(node.func.id)
    assert builders == {"grrm_client/adapters/pipeline.py": {"MemberRequest", "member_outcome"}}
    users = {path.stem for path in (ROOT / "grrm_client" / "adapters").rglob("*.py")
             if "grrm_client.adapters.pipeline" in path.read_text()}
    assert {"trl", "slime", "openrlhf", "reward_manager", "batch"} <= users


def test_the_import_paths_users_configure_are_the_adapters():
    import grrm_client.adapters.slime as slime
    import grrm_client.adapters.trl as trl
    import grrm_client.adapters.verl.plugin as plugin
    import grrm_client.slime
    import grrm_client.trl
    import trainer_bridge.verl_plugin
    from grrm_client.adapters.verl.reward_manager import GRRMRewardManager
    from trainer_bridge.reward_manager import GRRMRewardManager as configured

    assert configured is GRRMRewardManager  # pkg://trainer_bridge.reward_manager in verl's config
    assert trainer_bridge.verl_plugin.install is plugin.install
    assert grrm_client.trl.GRRMReward is trl.GRRMReward
    assert (grrm_client.slime.group_rm, grrm_client.slime.reset) == (slime.group_rm, slime.reset)
