"""The one path from a trainer's completions to rewards, which every adapter takes.

A trainer's response is first read into a :class:`~cluster.rewards.Completion`
(:func:`cluster.rewards.read_completion`), its row's reference and notes into a
:class:`~cluster.protocol.members.RowContext`.
Then either:

* member by member (verl's per-rollout manager, TRL's straddling groups):
  :func:`reward_member` sends a completion as a member of its group and rewards what came back,
  around one client call (the mapping, both ways, is the protocol's: :mod:`cluster.protocol.members`,
  which the service's OpenRLHF route takes too);
* or a whole group at once (slime, TRL's whole groups, verl's batch path): :func:`reward_group`
  sends the group as one request when every completion holds a translation, else its completions
  as members (so that the service's recipe rewards a rollout without one too).

The reward is the service's where an answer carries one (its tenant's recipe); the adapter's own
``default_reward`` applies only where no answer came (the service unreachable, the deadline).

Neither raises for a service problem: a reward that could not be obtained is an outcome flagged
``failed`` (each adapter logs a reason once: :class:`~cluster.protocol.members.FailureLog`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from cluster.protocol.members import NO_CONTEXT, RowContext, ServiceReward, member_request, member_reward
from cluster.protocol.calls import CallOutcome
from cluster.protocol.schema import GroupRequest, GroupResult, MemberResult
from cluster.rewards import Completion, RewardOutcome, RewardSettings, group_outcomes, scored_outcome
from grrm_client.reward_client import RewardClient

__all__ = ["REJECTED", "GroupRewards", "reward_group", "reward_member"]

# What a request the schema refuses (a source, language or reference the service cannot take) ends as.
REJECTED = "rejected"


async def reward_member(
    client: RewardClient,
    completion: Completion,
    settings: RewardSettings,
    **where: Any,
) -> tuple[RewardOutcome, CallOutcome[MemberResult]]:
    """Send one completion as a member of its group (``where``: :func:`member_request`'s keywords) and
    return its reward once the group is scored, with the call that produced it (attempts, timing)."""
    try:
        member = member_request(completion, **where)
    except ValidationError as error:
        call: CallOutcome[MemberResult] = CallOutcome(result=None, attempts=0, failure=REJECTED, error=str(error))
    else:
        call = await client.score_member(member)
    return member_reward(completion, call.result, call.failure, settings), call


@dataclass(frozen=True)
class GroupRewards:
    """The outcomes of one group's completions, in their order, and the calls that produced them."""

    outcomes: list[RewardOutcome]
    call: CallOutcome[GroupResult] | None  # the whole-group call; None when sent as members (or not at all)
    calls: list[CallOutcome | None] = field(default_factory=list)  # per completion: the call behind its outcome

    @property
    def error(self) -> str | None:
        """What went wrong, for a log line (the first call's error or its answer's)."""
        for call in ([self.call] if self.call is not None else self.calls):
            if call is not None:
                error = call.error if call.result is None else call.result.error
                if error:
                    return error
        return None


async def reward_group(
    client: RewardClient,
    *,
    group_id: str,
    source: str,
    src_lang: str,
    trg_lang: str,
    completions: Sequence[Completion],
    settings: RewardSettings,
    context: RowContext = NO_CONTEXT,
    tenant: str | None = None,
) -> GroupRewards:
    """Score one whole group; every completion rewarded, in order.

    Every completion holds a translation: one group request, the candidates in order (the service
    shows identical texts once) with their response lengths. Otherwise its completions go as the
    members of a group of ``len(completions)``, those without a translation marked invalid, so that
    the service's recipe rewards them too (the ``format`` part, its ``default_reward``)."""
    if len(completions) >= 2 and all(completion.candidate is not None for completion in completions):
        return await _whole_group(client, group_id=group_id, source=source, src_lang=src_lang, trg_lang=trg_lang,
                                  completions=completions, settings=settings, context=context, tenant=tenant)
    answers = await asyncio.gather(*(
        reward_member(client, completion, settings, group_id=group_id, group_size=len(completions), index=index,
                      source=source, src_lang=src_lang, trg_lang=trg_lang, context=context, tenant=tenant)
        for index, completion in enumerate(completions)))
    return GroupRewards([outcome for outcome, _ in answers], None, [call for _, call in answers])


async def _whole_group(
    client: RewardClient, *, group_id: str, source: str, src_lang: str, trg_lang: str,
    completions: Sequence[Completion], settings: RewardSettings, context: RowContext, tenant: str | None,
) -> GroupRewards:
    lengths = [completion.length for completion in completions]
    optional: dict[str, Any] = {"tenant": tenant} if tenant is not None else {}
    if all(length > 0 for length in lengths):
        optional["response_tokens"] = [int(length) for length in lengths]
    try:
        request = GroupRequest(**optional, **context.fields(), group_id=group_id, source=source,
                               candidates=[completion.candidate for completion in completions],
                               src_lang=src_lang, trg_lang=trg_lang)
    except ValidationError as error:
        call: CallOutcome[GroupResult] = CallOutcome(result=None, attempts=0, failure=REJECTED, error=str(error))
    else:
        call = await client.score_group(request)
    result = call.result
    if result is not None and result.rewards is not None and len(result.rewards) == len(completions):
        outcomes: list[RewardOutcome] = [_candidate_outcome(result, position) for position in range(len(completions))]
    elif result is not None and result.valid and result.scores is not None and len(result.scores) == len(completions):
        # A service without a recipe: its scores, the arithmetic of cluster/rewards.py.
        outcomes = [scored_outcome(score, length, settings) for score, length in zip(result.scores, lengths, strict=True)]
    else:
        texts = [completion.candidate for completion in completions]
        failure = (result.failure if result is not None else call.failure) or "no_score"
        outcomes = group_outcomes(texts, lengths, None, settings, failure=failure)
    return GroupRewards(outcomes, call, [call] * len(completions))


def _candidate_outcome(result: GroupResult, position: int) -> ServiceReward:
    """One candidate's reward and parts from a group answer that carries the recipe's. In a group with a
    verdict, a candidate without a score is one the language gate took out (its only way to have none)."""
    scores = result.scores if result.valid else None
    score = scores[position] if scores is not None else None
    failure = None if score is not None else result.failure or ("wrong_language" if result.valid else "no_score")
    components = result.components[position] if result.components is not None else {}
    return ServiceReward(reward=float(result.rewards[position]), valid=score is not None,  # type: ignore[index]
                         raw_score=score, failure=failure, components=dict(components))
