"""The one path from a trainer's completions to rewards, which every adapter takes.

A trainer's response is first read into a :class:`~cluster.rewards.Completion`
(:func:`cluster.rewards.read_completion`). Then either:

* member by member (verl's per-rollout manager, TRL's straddling groups, OpenRLHF's samples):
  :func:`member_request` turns a completion into the :class:`~cluster.schema.MemberRequest` the
  service joins into its group, and :func:`member_reward` turns what came back into the member's
  :class:`~cluster.rewards.RewardOutcome`; :func:`reward_member` does both around one client call;
* or a whole group at once (slime, TRL's whole groups, verl's batch path): :func:`reward_group`
  sends the distinct valid texts as one request and rewards every completion.

Neither raises for a service problem: a reward that could not be obtained is an outcome flagged
``failed``, and :class:`FailureLog` says which reasons an adapter has not logged yet (each adapter
logs a reason once, and counts every occurrence).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from cluster.rewards import Completion, RewardOutcome, RewardSettings, group_outcomes, member_outcome, plan_group
from cluster.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from grrm_client.reward_client import CallOutcome, RewardClient

__all__ = ["REJECTED", "FailureLog", "GroupRewards", "member_request", "member_reward", "reward_group",
           "reward_member"]

# What a request the schema refuses (a source or language the service cannot take) ends as.
REJECTED = "rejected"


def member_request(
    completion: Completion,
    *,
    group_id: str,
    group_size: int,
    source: str,
    src_lang: str,
    trg_lang: str,
    index: int | None = None,
    tenant: str | None = None,
    sent_at: float | None = None,
) -> MemberRequest:
    """The member request of one completion: ``index`` its position in the group, or, when the trainer
    gives none, an id of its own (the service then orders the group by its texts). A completion
    without a translation is sent marked ``invalid``: it completes its group without being shown.

    Raises pydantic's ``ValidationError`` (naming the field) for a source or language the service
    cannot take: every member of the group fails alike, so none is left waiting on the service."""
    optional = {"tenant": tenant} if tenant is not None else {}
    return MemberRequest(
        **optional,
        group_id=group_id,
        group_size=group_size,
        index=index,
        # The same id on every re-send of this call (the client re-sends this object), and only its.
        member_id=None if index is not None else uuid.uuid4().hex,
        source=source,
        candidate=completion.candidate or "",
        invalid=completion.candidate is None,
        src_lang=src_lang,
        trg_lang=trg_lang,
        sent_at=sent_at,
    )


def member_reward(
    completion: Completion, result: MemberResult | None, failure: str | None, settings: RewardSettings
) -> RewardOutcome:
    """A member's reward from the service's answer (``result``) or, when none came, why (``failure``).
    A completion without a translation keeps its own reason: its reward never depended on the service."""
    return member_outcome(
        extracted=completion.candidate is not None,
        score=result.score if result is not None and result.valid else None,
        failure=completion.invalid_reason or (failure if result is None else result.failure),
        length=completion.length,
        settings=settings,
    )


async def reward_member(
    client: RewardClient,
    completion: Completion,
    settings: RewardSettings,
    **where: object,
) -> tuple[RewardOutcome, CallOutcome[MemberResult]]:
    """Send one completion as a member of its group (``where``: :func:`member_request`'s keywords) and
    return its reward once the group is scored, with the call that produced it (attempts, timing)."""
    try:
        member = member_request(completion, **where)  # type: ignore[arg-type]
    except ValidationError as error:
        call: CallOutcome[MemberResult] = CallOutcome(result=None, attempts=0, failure=REJECTED, error=str(error))
    else:
        call = await client.score_member(member)
    return member_reward(completion, call.result, call.failure, settings), call


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


@dataclass
class FailureLog:
    """Which failure reasons an adapter has not logged yet: a dead service must not flood a trainer's
    log with one line per reward, so each reason is logged once (and every occurrence counted)."""

    logged: set[str] = field(default_factory=set)

    def first(self, outcome: RewardOutcome) -> bool:
        """Whether ``outcome`` failed for a reason not logged before (it counts as logged from now)."""
        if not outcome.failed or outcome.failure in self.logged:
            return False
        self.logged.add(outcome.failure)
        return True
