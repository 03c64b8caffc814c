"""A trainer's completion as a member request, and a member's answer as its reward: the mapping both sides take.

Every trainer adapter (``grrm_client/adapters/pipeline.py``, around its client's calls) and the
service's OpenRLHF route (:mod:`cluster.protocol.openrlhf`, whose caller posts to the service
itself) turn a :class:`~cluster.rewards.Completion` into the
:class:`~cluster.protocol.schema.MemberRequest` the service joins into its group
(:func:`member_request`), and what came back into the member's
:class:`~cluster.rewards.RewardOutcome` (:func:`member_reward`).

The reward is the service's: an answer that carries one (its tenant's recipe, ``docs/recipes.md``)
is taken as it is, with its parts (:class:`ServiceReward`); the caller's own ``default_reward``
applies only where no answer came, and the arithmetic of ``cluster/rewards.py`` only to answers of
a service without a recipe. :class:`FailureLog` says which failure reasons a caller has not logged
yet (each logged once, every occurrence counted).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.protocol.schema import MemberRequest, MemberResult
from cluster.rewards import Completion, RewardOutcome, RewardSettings, member_outcome

__all__ = ["COMPONENT_PREFIX", "NO_CONTEXT", "FailureLog", "RowContext", "ServiceReward", "component_means",
           "components_of", "from_recipe", "member_request", "member_reward"]

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


@dataclass(frozen=True)
class RowKeys:
    """Where a trainer's row (or OpenRLHF's label) keeps its source, languages, reference and notes: the
    one declaration of the adapters' and the OpenRLHF route's defaults."""

    source_key: str = "source"
    src_lang_key: str = "src_lang"
    trg_lang_key: str = "trg_lang"
    ref_text_key: str = "ref_text"
    ref_lang_key: str = "ref_lang"
    notes_key: str = "notes"


ROW_KEYS = RowKeys()


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
