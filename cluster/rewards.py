"""GRPO rewards from GRRM scores: the reference arithmetic of the GQM spec, section 5.

Pure Python (no Ray, no torch, no I/O), shared by every trainer adapter (verl's per-rollout
manager and whole-batch path, TRL, OpenRLHF, slime) and tested exhaustively on its own:

1. a rollout whose translation cannot be extracted is invalid and gets ``default_reward``;
2. identical extracted texts are shown once and share that text's score;
3. fewer than 2 distinct valid texts: every rollout of the group gets ``default_reward``;
4. a prompt over the token limit: the group gets ``default_reward``;
5. otherwise ``reward = score * score_scale_factor - overlong_penalty(response tokens)``;
6. a group whose scores could not be obtained (unparseable answers, engine or service failure)
   gets ``default_reward`` -- not ``default_reward * score_scale_factor`` -- flagged as a failure.

A default reward is never silent: every :class:`RewardOutcome` carries the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster import gqm
from cluster.protocol import schema

__all__ = [
    "BAD_ROW",
    "Completion",
    "FAILURES",
    "GroupPlan",
    "INTERNAL_ERROR",
    "INVALID_EXTRACTION",
    "INVALID_TEXT",
    "PROMPT_TOO_LONG",
    "RewardOutcome",
    "RewardSettings",
    "SEMANTIC_DEFAULTS",
    "TOO_FEW_DISTINCT",
    "WRONG_LANGUAGE",
    "default_outcome",
    "group_outcomes",
    "is_failure",
    "member_outcome",
    "overlong_penalty",
    "plan_group",
    "read_completion",
    "scored_outcome",
]

# Reasons for a default reward that are the reference semantics, not failures.
INVALID_EXTRACTION = "invalid_extraction"  # spec section 4: no translation in the rollout
INVALID_TEXT = "invalid_text"  # a translation the service cannot take (too long, bad characters)
TOO_FEW_DISTINCT = "too_few_distinct"  # nothing to compare in the group
PROMPT_TOO_LONG = "prompt_too_long"  # the group's GQM prompt is over the token limit
WRONG_LANGUAGE = "wrong_language"  # spec section 5b: the recipe's language gate removed it
SEMANTIC_DEFAULTS = frozenset({INVALID_EXTRACTION, INVALID_TEXT, TOO_FEW_DISTINCT, PROMPT_TOO_LONG, WRONG_LANGUAGE})

# Reasons of the bridge's own for a default reward (the others come from the service or transport).
BAD_ROW = "bad_row"
INTERNAL_ERROR = "internal_error"

# Reasons for a default reward that mean "the reward could not be obtained".
FAILURES = frozenset(
    {
        "parse_failed",  # no parseable verdict after the service's retries
        "engine_error",
        "timeout",  # generation or group assembly past its deadline (after our retries)
        "rejected",  # the group's input refused (by the service, or a row the bridge cannot send)
        "conflict",  # the member disagrees with what its group already holds
        "overloaded",  # a replica's assembler stayed full through our retries
        "shutting_down",  # replicas kept shutting down through our retries
        "invalid_request",  # the service refused the request (HTTP 422)
        "too_large",  # over a limit of the deployment (HTTP 413)
        "unauthorized",  # a missing or wrong bearer token (HTTP 401)
        "forbidden",  # a tenant its token may not act for (HTTP 403)
        "deadline",  # our own per-request deadline ran out
        "unavailable",  # back pressure / no replica / connection errors after every attempt
        "transport_error",  # an unexpected error talking to the service
        "no_score",  # the service answered valid without a score for this rollout (should not happen)
        "bad_row",  # the row lacks what the bridge reads (group, position, source, languages) or holds junk
        "internal_error",  # the bridge itself failed unexpectedly (a bug: the reward still never raises)
    }
)

def is_failure(reason: str | None) -> bool:
    """Whether a default-reward reason means the reward could not be obtained."""
    return reason is not None and reason not in SEMANTIC_DEFAULTS


@dataclass(frozen=True, slots=True)
class RewardSettings:
    """The arithmetic's parameters (built from :class:`grrm_client.adapters.verl.config.BridgeConfig`)."""

    default_reward: float = 0.0
    score_scale_factor: float = 1.0
    overlong_enable: bool = False
    max_resp_len: int = 0
    buffer_len: int = 0
    penalty_factor: float = 1.0

    def penalty(self, length: int) -> float:
        """The overlong penalty for a response of ``length`` tokens (0 when disabled)."""
        if not self.overlong_enable:
            return 0.0
        return overlong_penalty(
            length, max_resp_len=self.max_resp_len, buffer_len=self.buffer_len, penalty_factor=self.penalty_factor
        )


@dataclass(frozen=True, slots=True)
class RewardOutcome:
    """One rollout's reward and where it came from."""

    reward: float
    valid: bool  # from a GRRM comparison
    raw_score: int | None = None
    penalty: float = 0.0
    failure: str | None = None  # why the reward is the default; None when valid

    @property
    def failed(self) -> bool:
        """The reward could not be obtained (see :data:`FAILURES`)."""
        return is_failure(self.failure)


def overlong_penalty(length: int, *, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong penalty, as a non-negative amount to subtract.

    0 up to ``max_resp_len - buffer_len`` tokens, rising linearly to ``penalty_factor`` at
    ``max_resp_len``, and ``penalty_factor`` beyond (spec section 5: it "stays there").
    """
    if buffer_len <= 0:
        raise ValueError(f"buffer_len: must be positive (got {buffer_len})")
    if length < 0:
        raise ValueError(f"length: must not be negative (got {length})")
    exceed = length - (max_resp_len - buffer_len)
    if exceed <= 0:
        return 0.0
    return min(exceed / buffer_len, 1.0) * penalty_factor


def default_outcome(reason: str, settings: RewardSettings) -> RewardOutcome:
    """The default reward, flagged with ``reason`` (never scaled, never penalised)."""
    return RewardOutcome(reward=float(settings.default_reward), valid=False, failure=reason)


def scored_outcome(score: int, length: int, settings: RewardSettings) -> RewardOutcome:
    """``score * score_scale_factor - overlong_penalty(length)``."""
    penalty = settings.penalty(length)
    return RewardOutcome(
        reward=float(score) * settings.score_scale_factor - penalty, valid=True, raw_score=int(score), penalty=penalty
    )


def member_outcome(
    *, extracted: bool, score: int | None, failure: str | None, length: int, settings: RewardSettings
) -> RewardOutcome:
    """One rollout's outcome from its member answer (the per-rollout path).

    ``extracted`` False: invalid rollout (default). ``score`` None: the group got no verdict for
    it, for ``failure`` (default, flagged). Otherwise the scaled, penalised score.
    """
    if not extracted:
        return default_outcome(failure or INVALID_EXTRACTION, settings)
    if score is None:
        return default_outcome(failure or "no_score", settings)
    return scored_outcome(score, length, settings)


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """What the reward model is shown for one group: each distinct valid text once."""

    distinct: tuple[str, ...]  # first-seen order
    positions: tuple[int | None, ...]  # per rollout: its text's index in ``distinct``, None if invalid

    @property
    def comparable(self) -> bool:
        """At least 2 distinct valid texts (otherwise nothing is sent and all get the default)."""
        return len(self.distinct) >= 2


def plan_group(texts: Sequence[str | None]) -> GroupPlan:
    """Deduplicate a group's extracted texts (None = invalid rollout)."""
    index: dict[str, int] = {}
    positions: list[int | None] = []
    for text in texts:
        if text is None:
            positions.append(None)
        else:
            positions.append(index.setdefault(text, len(index)))
    return GroupPlan(distinct=tuple(index), positions=tuple(positions))


def group_outcomes(
    texts: Sequence[str | None],
    lengths: Sequence[int],
    distinct_scores: Sequence[int] | None,
    settings: RewardSettings,
    failure: str | None = None,
    invalid_reasons: Sequence[str | None] | None = None,
) -> list[RewardOutcome]:
    """Every rollout's outcome for one group (the whole-group path).

    ``texts``: extracted translations (None = invalid); ``lengths``: response tokens per rollout;
    ``distinct_scores``: the model's scores for :func:`plan_group`'s distinct texts, or None when
    the group got none (then ``failure`` says why; unused for non-comparable groups);
    ``invalid_reasons``: optional per-rollout reason for an invalid text (default
    ``invalid_extraction``).
    """
    if len(texts) != len(lengths):
        raise ValueError(f"lengths: {len(lengths)} lengths for {len(texts)} texts")
    plan = plan_group(texts)
    if distinct_scores is not None and plan.comparable and len(distinct_scores) != len(plan.distinct):
        raise ValueError(f"distinct_scores: {len(distinct_scores)} scores for {len(plan.distinct)} distinct texts")
    outcomes = []
    for rollout, (position, length) in enumerate(zip(plan.positions, lengths, strict=True)):
        if position is None:
            reason = invalid_reasons[rollout] if invalid_reasons is not None else None
            outcomes.append(default_outcome(reason or INVALID_EXTRACTION, settings))
        elif not plan.comparable:
            outcomes.append(default_outcome(TOO_FEW_DISTINCT, settings))
        elif distinct_scores is None:
            outcomes.append(default_outcome(failure or "no_score", settings))
        else:
            outcomes.append(scored_outcome(distinct_scores[position], length, settings))
    return outcomes


@dataclass(frozen=True, slots=True)
class Completion:
    """One policy response as the reward model sees it (spec section 4)."""

    extracted: bool  # the extractor found a translation
    candidate: str | None  # the text to show the reward model; None = invalid rollout
    invalid_reason: str | None  # why candidate is None (INVALID_EXTRACTION, INVALID_TEXT)
    length: int = 0  # response tokens (for the overlong penalty)


def read_completion(response: str, extractor: gqm.Extractor, max_text_chars: int, length: int = 0) -> Completion:
    """Extract the translation from a response and check that the service takes it as a candidate
    (valid Unicode, no control characters, not blank, at most ``max_text_chars``)."""
    translation = gqm.extract_translation(response, extractor)
    if translation is None:
        return Completion(extracted=False, candidate=None, invalid_reason=INVALID_EXTRACTION, length=length)
    if len(translation) > max_text_chars or schema.candidate_problem(translation) is not None:
        return Completion(extracted=True, candidate=None, invalid_reason=INVALID_TEXT, length=length)
    return Completion(extracted=True, candidate=translation, invalid_reason=None, length=length)
