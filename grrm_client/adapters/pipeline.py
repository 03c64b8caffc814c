"""The one path from a trainer's completions to rewards, which every adapter takes.

A trainer's response is first read into a :class:`~cluster.rewards.Completion`
(:func:`cluster.rewards.read_completion`), its row's reference and notes into a :class:`RowContext`.
Then either:

* member by member (verl's per-rollout manager, TRL's straddling groups, OpenRLHF's samples):
  :func:`member_request` turns a completion into the :class:`~cluster.schema.MemberRequest` the
  service joins into its group, and :func:`member_reward` turns what came back into the member's
  :class:`~cluster.rewards.RewardOutcome`; :func:`reward_member` does both around one client call;
* or a whole group at once (slime, TRL's whole groups, verl's batch path): :func:`reward_group`
  sends the group as one request when every completion holds a translation, else its completions
  as members (so that the service's recipe rewards a rollout without one too).

The reward is the service's: an answer that carries one (its tenant's recipe, ``docs/recipes.md``)
is taken as it is, with its parts (:class:`ServiceReward`); the adapter's own ``default_reward``
applies only where no answer came (the service unreachable, the deadline), and the arithmetic of
``cluster/rewards.py`` only to answers of a service without a recipe.

Neither raises for a service problem: a reward that could not be obtained is an outcome flagged
``failed``, and :class:`FailureLog` says which reasons an adapter has not logged yet (each adapter
logs a reason once, and counts every occurrence).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from cluster.rewards import (
    Completion,
    RewardOutcome,
    RewardSettings,
    group_outcomes,
    member_outcome,
    scored_outcome,
)
from cluster.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from grrm_client.reward_client import CallOutcome, RewardClient

__all__ = ["COMPONENT_PREFIX", "NO_CONTEXT", "REJECTED", "FailureLog", "GroupRewards", "RowContext", "ServiceReward",
           "component_means", "components_of", "from_recipe", "member_request", "member_reward", "reward_group",
           "reward_member"]

# What a request the schema refuses (a source, language or reference the service cannot take) ends as.
REJECTED = "rejected"
# Every trainer logs each recipe part per step under one name, `grrm/component/<name>/mean` (docs/trainers/).
COMPONENT_PREFIX = "grrm/component"


@dataclass(frozen=True, slots=True)
class ServiceReward(RewardOutcome):
    """A reward the service composed with its tenant's recipe, and the parts it was made of
    (part name -> value before weighting; empty for a default reward without parts)."""

    components: Mapping[str, float] = field(default_factory=dict, hash=False)


def from_recipe(outcome: RewardOutcome) -> bool:
    """Whether ``outcome``'s reward is the service's (an answer carried it), not the adapter's own."""
    return isinstance(outcome, ServiceReward)


def components_of(outcome: RewardOutcome) -> Mapping[str, float]:
    """The recipe parts behind ``outcome`` (empty when its reward is not the service's)."""
    return outcome.components if isinstance(outcome, ServiceReward) else {}


def component_means(parts: Iterable[Mapping[str, float]], prefix: str = COMPONENT_PREFIX) -> dict[str, float]:
    """``{prefix}/<name>/mean`` for every part of a step's rollouts: the part's mean over all of them, a
    rollout whose answer lacks it counting 0 (a default reward, a row without a reference for bleu)."""
    rows = list(parts)
    names = sorted({name for row in rows for name in row})
    return {f"{prefix}/{name}/mean": math.fsum(float(row.get(name, 0.0)) for row in rows) / len(rows)
            for name in names}


def _text(value: Any) -> str | None:
    """A row's optional text: None for a missing, NaN (pandas' missing value) or blank one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value)
    return text if text.strip() else None


@dataclass(frozen=True, slots=True)
class RowContext:
    """What a row may carry for the model beside its source (GQM spec section 1b): a reference
    translation with its language, and notes; the same on every completion of the row's group."""

    ref_text: str | None = None
    ref_lang: str | None = None
    notes: str | None = None

    @classmethod
    def of(cls, ref_text: Any = None, ref_lang: Any = None, notes: Any = None) -> RowContext:
        """From a row's raw values: a missing, NaN or blank value is none. A half reference pair is
        kept as it is: the request refuses it, naming the half that is missing."""
        return cls(_text(ref_text), _text(ref_lang), _text(notes))

    def fields(self) -> dict[str, str]:
        """The request fields it sets (those present)."""
        return {name: value for name, value in (("ref_text", self.ref_text), ("ref_lang", self.ref_lang),
                                                ("notes", self.notes)) if value is not None}


NO_CONTEXT = RowContext()


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
    context: RowContext = NO_CONTEXT,
) -> MemberRequest:
    """The member request of one completion: ``index`` its position in the group, or, when the trainer
    gives none, an id of its own (the service then orders the group by its texts). A completion
    without a translation is sent marked ``invalid``: it completes its group without being shown.
    The completion's response length (when the trainer gave one) goes as ``response_tokens``, for the
    recipe's overlong part; the row's reference and notes as ``context``.

    Raises pydantic's ``ValidationError`` (naming the field) for a source, language or reference the
    service cannot take: every member of the group fails alike, so none is left waiting on the service."""
    optional: dict[str, Any] = {"tenant": tenant} if tenant is not None else {}
    if completion.length > 0:
        optional["response_tokens"] = int(completion.length)
    return MemberRequest(
        **optional,
        **context.fields(),
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

    An answer with a ``reward`` is the reward, with its parts (:class:`ServiceReward`). Without an
    answer, the adapter's default (``settings``); from a service without a recipe, the arithmetic
    of ``cluster/rewards.py``. A completion without a translation keeps its own reason."""
    reason = completion.invalid_reason or (failure if result is None else result.failure)
    if result is not None and result.reward is not None:
        scored = completion.candidate is not None and result.valid and result.score is not None
        return ServiceReward(reward=float(result.reward), valid=scored, raw_score=result.score if scored else None,
                             failure=None if scored else reason or "no_score", components=dict(result.components))
    return member_outcome(
        extracted=completion.candidate is not None,
        score=result.score if result is not None and result.valid else None,
        failure=reason,
        length=completion.length,
        settings=settings,
    )


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
