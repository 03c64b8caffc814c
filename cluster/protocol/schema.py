"""Typed objects that cross layers: what a caller asks for and what the cluster answers.

The same models validate HTTP bodies (FastAPI), travel through Ray Serve handles (they
pickle), and are what :class:`~cluster.scorer.GroupScorer` consumes and produces. Validation
here is about the protocol (types, languages, shape); size limits are deployment settings and
are checked by the service.

Request fields are strict: a value of the wrong type is refused, never coerced (no ``true`` or
``"3"`` or ``2.0`` for an integer, no ``1`` or ``"true"`` for a boolean, no bytes for a text), the
same over HTTP (422 naming the field) and through a handle (a ``ValidationError``). Handle callers
pass Python ``int``/``bool``/``str`` (convert numpy scalars with ``int()``/``bool()`` first).
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from cluster import gqm
from cluster.failures import FailureReason

# A text's hard ceiling (characters); deployments set tighter limits.
_MAX_TEXT = 1_000_000


def _check_text(value: str) -> str:
    # Surrogates cannot be encoded to UTF-8 and would break the engine's tokenizer far from here.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains characters that are not valid Unicode (lone surrogates)") from None
    control = next((c for c in value if c in _CONTROL_CHARACTERS), None)
    if control is not None:
        raise ValueError(f"contains the control character {control!r} (only tab, newline and carriage return are allowed)")
    return value


# C0 controls other than tab, newline and carriage return, and DEL: never part of a translation,
# and some (NUL) break tokenizers and logs far from here.
_CONTROL_CHARACTERS = frozenset(chr(c) for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


def _check_not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


def _check_language(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    try:
        gqm.language_name(value)
    except gqm.GQMInputError as error:
        raise ValueError(error.problem) from None
    # A full name goes into the prompt as given: a name is letters (with their marks), digits,
    # spaces and - ' ( ) , . / -- never a newline or a backtick that could forge the prompt.
    odd = next((c for c in value if unicodedata.category(c)[0] not in "LMN" and c not in _NAME_PUNCTUATION), None)
    if odd is not None:
        raise ValueError(f"a language name may hold letters, digits, spaces and - ' ( ) , . / only (found {odd!r})")
    return value


_NAME_PUNCTUATION = frozenset(" -'’(),./")


def candidate_problem(text: str) -> str | None:
    """Why the service would refuse ``text`` as a candidate (None: it takes it): the checks of
    every request's texts (valid Unicode, no control characters) and not blank."""
    try:
        _check_not_blank(_check_text(text))
    except ValueError as problem:
        return str(problem)
    return None


class Usage(BaseModel):
    """Engine tokens spent on one group, over every attempt."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens the engine served from its prefix cache (engines that report it: vLLM).
    cached_prompt_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
        )

    @classmethod
    def of(cls, generation) -> Usage:
        """The usage of one engine generation."""
        return cls(
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            cached_prompt_tokens=int(generation.extra.get("cached_tokens", 0)),
        )


# Who a request is for: a training run, an evaluation, a `grrm score` job. Names are short and plain
# (they label metrics and scope group ids); without one, a request is the default tenant's.
DEFAULT_TENANT = "default"
# The service's default limit on one text (limits.max_text_chars); a client sends no longer one.
DEFAULT_MAX_TEXT_CHARS = 20_000
# The environment variable a bearer token is read from by default: the service's and its clients'.
DEFAULT_TOKEN_ENV = "GRRM_API_TOKEN"
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
_TENANT = Field(DEFAULT_TENANT, pattern=TENANT_PATTERN,
                description="Who the request is for (a run, a job): letters, digits, '_', '.', '-', at most 64, "
                            "starting with a letter or digit. Group ids are scoped by it.")


def scoped_group_id(tenant: str, group_id: str) -> str:
    """The id a replica keeps a tenant's group under: two tenants' equal ids never meet.

    A tenant name holds no '/', so ``tenant/group_id`` is unambiguous; the default tenant's ids stay
    as they are unless they hold a '/' themselves (then they too get their tenant's prefix)."""
    if tenant == DEFAULT_TENANT and "/" not in group_id:
        return group_id
    return f"{tenant}/{group_id}"


def unscoped_group_id(scoped: str) -> tuple[str, str]:
    """(tenant, group id) of an id made by :func:`scoped_group_id`."""
    if "/" not in scoped:
        return DEFAULT_TENANT, scoped
    tenant, group_id = scoped.split("/", 1)
    return tenant, group_id


_REF_TEXT = Field(None, max_length=_MAX_TEXT,
                  description="A reference translation of the source (give ref_lang with it): shown to the model "
                              "after the candidates (GQM spec section 1b), and what the recipe's bleu and chrf parts "
                              "compare with. The same on every member of a group.")
_REF_LANG = Field(None, max_length=64, description="The reference's language: a two-letter code or a full name (give "
                                                   "ref_text with it).")
_NOTES = Field(None, max_length=_MAX_TEXT,
               description="Free-text notes for the model (terminology, style), shown after the candidates and the "
                           "reference. They count against the prompt's token budget like any other text.")


def _check_reference_pair(ref_text: str | None, ref_lang: str | None) -> None:
    """A reference comes with its language, and a language with its reference (the reference code
    silently drops a half pair; the service refuses it, naming the half that is missing)."""
    has_text = ref_text is not None and bool(ref_text.strip())
    has_lang = ref_lang is not None and bool(ref_lang.strip())
    if has_lang and not has_text:
        raise ValueError("ref_lang: given without ref_text (give both, or neither)")
    if has_text and not has_lang:
        raise ValueError("ref_text: given without ref_lang (give both, or neither)")


def _check_optional_language(value: str | None) -> str | None:
    if value is None or not value.strip():
        return value
    return _check_language(value)


def _check_optional_text(value: str | None) -> str | None:
    return None if value is None else _check_text(value)


class GroupRequest(BaseModel):
    """A whole group: one source and its candidate translations."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    tenant: StrictStr = _TENANT
    group_id: StrictStr | None = Field(
        None, min_length=1, max_length=256,
        description="The caller's id of the group: requests with the same id go to the same replica (its prefix "
                    "cache), and a scored group's answer is kept for retries under it. Without one, any replica.")
    source: StrictStr = Field(max_length=_MAX_TEXT, description="The source text.")
    candidates: list[StrictStr] = Field(
        min_length=gqm.MIN_CANDIDATES, description="The candidate translations, labelled A, B, C, ... in this order "
                                                   "in the prompt; identical texts are shown once and share a score.")
    src_lang: StrictStr = Field(max_length=64, description="Source language: a two-letter code or a full name.")
    trg_lang: StrictStr = Field(max_length=64, description="Target language: a two-letter code or a full name.")
    ref_text: StrictStr | None = _REF_TEXT
    ref_lang: StrictStr | None = _REF_LANG
    notes: StrictStr | None = _NOTES
    response_tokens: list[StrictInt] | None = Field(
        None, description="Each candidate's response length in tokens, in candidate order: what the recipe's "
                          "overlong part reads (without it, the part gives no penalty).")
    post_edit: StrictBool = Field(
        False, description="The last candidate is a post-edit of the others (the machine translations it was made "
                           "from): its reward is its score against the group's mean (GQM spec section 5c); the "
                           "candidates are not deduplicated.")

    validate_text = field_validator("source")(_check_text)
    validate_source = field_validator("source")(_check_not_blank)
    validate_languages = field_validator("src_lang", "trg_lang")(_check_language)
    validate_context_texts = field_validator("ref_text", "notes")(_check_optional_text)
    validate_ref_lang = field_validator("ref_lang")(_check_optional_language)

    @model_validator(mode="after")
    def _check_context(self) -> GroupRequest:
        _check_reference_pair(self.ref_text, self.ref_lang)
        if self.response_tokens is not None:
            if len(self.response_tokens) != len(self.candidates):
                raise ValueError(f"response_tokens: {len(self.response_tokens)} lengths for "
                                 f"{len(self.candidates)} candidates")
            if any(length < 0 for length in self.response_tokens):
                raise ValueError("response_tokens: a length must not be negative")
        return self

    @field_validator("candidates")
    @classmethod
    def _check_candidates(cls, candidates: list[str]) -> list[str]:
        for index, candidate in enumerate(candidates):
            try:
                _check_not_blank(_check_text(candidate))
            except ValueError as error:
                raise ValueError(f"candidates[{index}] {error}") from None
        return candidates


class MemberRequest(BaseModel):
    """One member of a group, sent on its own (verl's reward loop asks per rollout)."""

    model_config = ConfigDict(extra="forbid")

    tenant: StrictStr = _TENANT
    group_id: StrictStr = Field(min_length=1, max_length=256,
                                description="The group this member belongs to: its members meet on one replica under "
                                            "this id (scoped by tenant) and are scored together.")
    group_size: StrictInt = Field(ge=1, le=1024, description="How many members the group has (the same on each).")
    # Who the member is within its group, given exactly one way:
    # - `index`: its position 0..group_size-1, when the caller knows it (verl's session_id, or
    #   priority % n): the candidates appear in the prompt in index order;
    # - `member_id`: an id of the caller's choosing, unique within the group and the same on every
    #   re-send, when the caller has no position (verl's fully_async_policy repeats a sample n times
    #   without numbering the copies): the replica orders the candidates by their texts, so the
    #   prompt does not depend on the order in which members arrive.
    index: StrictInt | None = Field(None, ge=0, description="Its position 0..group_size-1 (give this or member_id).")
    member_id: StrictStr | None = Field(
        None, min_length=1, max_length=128,
        description="An id of the caller's choosing, unique in the group and the same on every re-send, when the "
                    "caller has no position (give this or index).")
    source: StrictStr = Field(max_length=_MAX_TEXT, description="The group's source text (the same on each member).")
    candidate: StrictStr = Field(max_length=_MAX_TEXT, description="This member's translation.")
    src_lang: StrictStr = Field(max_length=64, description="Source language: a two-letter code or a full name.")
    trg_lang: StrictStr = Field(max_length=64, description="Target language: a two-letter code or a full name.")
    # The rollout's translation could not be extracted (spec section 4): the member still
    # completes its group (nobody waits for it) but is not shown to the model and gets no score.
    # Its `candidate` is ignored (send "").
    invalid: StrictBool = Field(False, description="No translation could be read from the rollout: it completes "
                                                   "its group but is not shown to the model and gets no score.")
    # When the caller first sent this member (Unix seconds, the same on every re-send): timing only.
    sent_at: StrictFloat | None = Field(None, ge=0, description="When the caller first sent it (Unix seconds, the "
                                                                "same on every re-send): timing only.")
    ref_text: StrictStr | None = _REF_TEXT
    ref_lang: StrictStr | None = _REF_LANG
    notes: StrictStr | None = _NOTES
    response_tokens: StrictInt | None = Field(
        None, ge=0, le=100_000_000, description="This rollout's response length in tokens: what the recipe's "
                                                "overlong part reads (without it, the part gives no penalty).")

    validate_text = field_validator("source", "candidate")(_check_text)
    validate_source = field_validator("source")(_check_not_blank)
    validate_languages = field_validator("src_lang", "trg_lang")(_check_language)
    validate_context_texts = field_validator("ref_text", "notes")(_check_optional_text)
    validate_ref_lang = field_validator("ref_lang")(_check_optional_language)

    @model_validator(mode="after")
    def _identity_in_group(self) -> MemberRequest:
        if self.index is None and self.member_id is None:
            raise ValueError("index: required unless member_id is given (a member needs a position or an id)")
        if self.index is not None and self.member_id is not None:
            raise ValueError("member_id: give either index or member_id, not both")
        if self.index is not None and self.index >= self.group_size:
            raise ValueError(f"index: {self.index} is out of range for group_size {self.group_size}")
        if not self.invalid and not self.candidate.strip():
            raise ValueError("candidate: must not be empty or only whitespace (mark the member invalid instead)")
        _check_reference_pair(self.ref_text, self.ref_lang)
        return self

    @property
    def key(self) -> int | str:
        """What identifies this member within its group: its index, else its member_id."""
        return self.index if self.index is not None else self.member_id  # type: ignore[return-value]


class DemandAnnouncement(BaseModel):
    """Work a caller expects to send: e.g. a GRPO step's groups, announced as its generation phase
    starts, so that the pool has the replicas for them when they come (the autoscaling policy's
    forecast). Times are relative to the receiving replica's clock: no clock is shared."""

    model_config = ConfigDict(extra="forbid")

    tenant: StrictStr = _TENANT
    groups: StrictInt = Field(ge=0, le=10_000_000, description="How many groups are coming (a step's prompts: "
                                                               "one group of n rollouts each). 0 withdraws the "
                                                               "tenant's announcement.")
    starts_in_s: StrictFloat = Field(0.0, ge=0, le=86_400, description="Seconds from now until the first of them comes "
                                                                  "(0: the phase starts now).")
    lasts_s: StrictFloat = Field(gt=0, le=86_400, description="Seconds the phase lasts from its start: its last group "
                                                        "comes by then.")
    profile: list[StrictFloat] = Field(
        default_factory=list, max_length=64,
        description="The share of the groups expected in each of equal slices of the phase, in order (empty: "
                    "evenly). GRPO groups, complete at their last rollout, crowd a phase's end; the pool grows "
                    "for the busiest slice a cold start before it.")

    @model_validator(mode="after")
    def _profile_has_shares(self) -> DemandAnnouncement:
        if any(not math.isfinite(share) or share < 0 for share in self.profile):
            raise ValueError("profile: every share must be a finite number >= 0")
        if self.profile and sum(self.profile) <= 0:
            raise ValueError("profile: the shares must not all be 0 (leave it empty for evenly)")
        if not math.isfinite(sum(self.profile)):
            raise ValueError("profile: the shares' sum overflows (give them as fractions, e.g. summing to 1)")
        return self


class DemandAccepted(BaseModel):
    """The answer to a :class:`DemandAnnouncement`: which replica keeps it for the autoscaling policy."""

    replica: str = Field(description="The replica that reports the announcement to the autoscaling policy (the "
                                     "HTTP ingress's, which hands a copy to a running scorer replica).")
    tenant: str = Field(description="The tenant it counts for.")
    groups: int = Field(description="The groups announced (0: the tenant's announcement was withdrawn).")


def _sends() -> Any:
    """A result's ``sends`` (the same field on group and member results)."""
    return Field(1, ge=1, description="Sends to the replicas this answer took: more than 1 when the service re-routed "
                                      "the call after its replica died. The caller's client counts them as its "
                                      "attempts (max_attempts bounds the sends of all layers).")


class GroupResult(BaseModel):
    """The verdict on one group. ``scores`` is None unless ``valid``: never a made-up score."""

    group_id: str | None = Field(None, description="The request's group_id.")
    scores: list[int | None] | None = Field(
        None, description="One score (0-10) per candidate, in request order; None unless valid: never a made-up "
                          "score. A candidate the recipe's language gate removed has None (its failure: "
                          "wrong_language).")
    ranking: str | None = Field(None, description="The model's ranking line, e.g. 'B > A = C'.")
    valid: bool = Field(False, description="Whether the group got a verdict.")
    error: str | None = Field(None, description="Why not, for people (decide on `failure`, never on this text).")
    failure: FailureReason | None = Field(None, description="Why not, as a failure kind (cluster/failures.py).")
    attempts: int = Field(0, description="Generations it took (retries of unparseable answers included).")
    repairs: int = Field(0, description="Verdicts obtained by constrained repair of an unparseable answer.")
    replica: str = Field("", description="The replica that scored it.")
    sends: int = _sends()
    usage: Usage = Field(default_factory=Usage, description="Prompt and answer tokens the engine spent on it.")
    latency_s: float = Field(0.0, description="Seconds the replica spent on it.")
    stages: dict[str, float] = Field(default_factory=dict,
                                     description="Seconds per stage (generation, parse, repair, assembly).")
    answer: str | None = Field(None, description="The last raw model answer (HTTP: only with http.include_answers).")
    guarded_texts: dict[str, int] = Field(
        default_factory=dict, description="Texts that could have changed the prompt's structure, by what was done "
                                          "with them (neutralized, rejected, unguarded); empty for most groups.")
    rewards: list[float] | None = Field(
        None, description="Each candidate's reward, in request order, composed by its tenant's recipe (docs/recipes.md): "
                          "the recipe's default_reward where the candidate got no score. None from a service without "
                          "a recipe.")
    components: list[dict[str, float]] | None = Field(
        None, description="Each candidate's recipe parts (part name -> its value before weighting), in request order.")


class MemberTiming(BaseModel):
    """When a member's group went through its replica (Unix seconds on the replica's clock).

    ``received_at`` is when this member reached the replica that answered it; the others belong
    to its group: when its last member arrived, and when its scoring started and ended (None when
    the group was not scored, e.g. a timeout or a refusal). An answer read from the scored groups
    that a replica keeps for retries carries the times of that one scoring.
    """

    received_at: float
    complete_at: float | None = None
    scoring_started_at: float | None = None
    scoring_ended_at: float | None = None


class MemberResult(BaseModel):
    """The verdict on one member of a group."""

    group_id: str = Field(description="The request's group_id.")
    index: int | None = Field(None, description="Its position in the group's verdict (group_scores): its request's "
                                                "index, or the position the replica gave a member_id (None until "
                                                "scored).")
    member_id: str | None = Field(None, description="The request's member_id.")
    score: int | None = Field(None, description="Its score (0-10); None unless valid.")
    valid: bool = Field(False, description="Whether it got a score.")
    error: str | None = Field(None, description="Why not, for people (decide on `failure`, never on this text).")
    failure: FailureReason | None = Field(None, description="Why not, as a failure kind (cluster/failures.py).")
    replica: str = Field("", description="The replica that answered.")
    sends: int = _sends()
    attempts: int = Field(0, description="Generations the group's scoring took.")
    group_scores: list[int | None] | None = Field(
        None, description="The whole group's scores, so one member's caller sees the whole verdict (None at the "
                          "positions of invalid members).")
    timing: MemberTiming | None = Field(None, description="When its group went through its replica.")
    reward: float | None = Field(None, description="Its reward, composed by its tenant's recipe (docs/recipes.md): the "
                                                   "recipe's default_reward when it got no score. None from a service "
                                                   "without a recipe.")
    components: dict[str, float] = Field(default_factory=dict,
                                         description="Its recipe parts (part name -> its value before weighting).")
