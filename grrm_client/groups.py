"""One group's GRPO rewards from the service: what every trainer adapter shares.

A trainer hands over the completions of a group (read with :func:`cluster.rewards.read_completion`);
:func:`reward_group` sends the distinct valid ones as one whole-group request and turns the verdict
into one :class:`~cluster.rewards.RewardOutcome` per completion (the arithmetic of
``cluster/rewards.py``). :func:`reward_member` does the same for one completion of a group whose
other members another process sends (the member path: the service joins them). Neither raises for
a service problem: a reward that could not be obtained is an outcome flagged ``failed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from cluster.rewards import Completion, RewardOutcome, RewardSettings, group_outcomes, member_outcome, plan_group
from cluster.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from grrm_client.reward_client import CallOutcome, RewardClient

__all__ = ["GroupRewards", "reward_group", "reward_member"]

# What a request the schema refuses (a source or language the service cannot take) ends as.
REJECTED = "rejected"


@dataclass(frozen=True)
class GroupRewards:
    """The outcomes of one group's completions, in their order, and the call that produced them."""

    outcomes: list[RewardOutcome]
    call: CallOutcome[GroupResult] | None  # None: nothing was sent (fewer than 2 distinct valid texts)


async def reward_group(
    client: RewardClient,
    *,
    group_id: str,
    source: str,
    src_lang: str,
    trg_lang: str,
    completions: Sequence[Completion],
    settings: RewardSettings,
) -> GroupRewards:
    """Score one whole group: each distinct valid text shown once, every completion rewarded."""
    texts = [completion.candidate for completion in completions]
    lengths = [completion.length for completion in completions]
    reasons = [completion.invalid_reason for completion in completions]
    plan = plan_group(texts)
    if not plan.comparable:
        return GroupRewards(group_outcomes(texts, lengths, None, settings, invalid_reasons=reasons), None)
    try:
        request = GroupRequest(
            group_id=group_id, source=source, candidates=list(plan.distinct), src_lang=src_lang, trg_lang=trg_lang
        )
    except ValidationError as error:
        call: CallOutcome[GroupResult] = CallOutcome(result=None, attempts=0, failure=REJECTED, error=str(error))
    else:
        call = await client.score_group(request)
    result = call.result
    scores = result.scores if result is not None and result.valid else None
    failure = None if scores is not None else (result.failure if result is not None else call.failure)
    outcomes = group_outcomes(texts, lengths, scores, settings, failure=failure, invalid_reasons=reasons)
    return GroupRewards(outcomes, call)


async def reward_member(
    client: RewardClient,
    *,
    group_id: str,
    group_size: int,
    index: int,
    source: str,
    src_lang: str,
    trg_lang: str,
    completion: Completion,
    settings: RewardSettings,
) -> tuple[RewardOutcome, CallOutcome[MemberResult]]:
    """Send one completion as member ``index`` of its group; its outcome once the group is scored."""
    try:
        member = MemberRequest(
            group_id=group_id,
            group_size=group_size,
            index=index,
            source=source,
            candidate=completion.candidate or "",
            invalid=completion.candidate is None,
            src_lang=src_lang,
            trg_lang=trg_lang,
        )
    except ValidationError as error:
        call: CallOutcome[MemberResult] = CallOutcome(result=None, attempts=0, failure=REJECTED, error=str(error))
    else:
        call = await client.score_member(member)
    result = call.result
    outcome = member_outcome(
        extracted=completion.candidate is not None,
        score=result.score if result is not None and result.valid else None,
        failure=completion.invalid_reason or (call.failure if result is None else result.failure),
        length=completion.length,
        settings=settings,
    )
    return outcome, call
