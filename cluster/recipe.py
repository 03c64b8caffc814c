"""A reward recipe: a candidate's reward composed from named parts, each weighted, each visible.

A tenant's recipe (``tenants.default.recipe``, ``http.tenants[i].recipe``; docs/recipes.md) names its
parts; a part's name is its component's name in answers, its ``kind`` (the name, unless given) the
registered class that computes it (:data:`PART_KINDS`, like verl's reward managers):

* ``grrm``: the GQM score times ``scale`` (a post-edit group's last candidate: its score minus the
  group's mean, times ``scale``: GQM spec section 5c);
* ``language``: the language gate (``mode: gate``: a candidate not in the target language leaves the
  group before deduplication and gets the default reward) or a penalty (``mode: penalty``);
* ``overlong``: DAPO's soft overlong buffer on the response's length in tokens;
* ``format``: -1 when the extractor found no translation (the member was sent ``invalid``);
* ``bleu``, ``chrf``: sacrebleu's sentence scores / 100 against the row's ``ref_text``;
* ``length_ratio``: -|ln(ratio / expected_ratio)|, ratio = the candidate's characters over the source's;
* ``kind: model``: a second model deployment's value (:class:`MetricModel`).

``reward = sum(weight x value)`` over the parts that have a value; ``components`` holds those values
before weighting, so ``reward == base + sum(weight[name] x components[name])`` for every answer, where
``base`` is ``default_reward`` for a candidate without a GQM score and 0 otherwise. A candidate without
a score (a failure, no translation, gated, too few distinct, a prompt over budget) gets
``default_reward`` plus its ``format`` part only (the one part about the candidate itself that exists
without a score), as GRRM's reference gives the plain default; the other parts are left out of its
reward and its components. The default recipe (``grrm`` at weight 1 and scale 1, default 0) gives
each candidate its score: the answers before recipes existed.

Pure: the configuration, the parts and :func:`compose` (sacrebleu is pure computation). The async
flow of a group through gate, engine and parts is :mod:`cluster.recipe_runner`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster import gqm
from cluster.rewards import RewardSettings, overlong_penalty

__all__ = [
    "PART_KINDS",
    "BleuPart",
    "CandidateFacts",
    "ChrfPart",
    "Composed",
    "FormatPart",
    "GroupFacts",
    "GrrmPart",
    "LanguagePart",
    "LengthRatioPart",
    "MetricItem",
    "MetricModel",
    "ModelPart",
    "OverlongPart",
    "Part",
    "RecipeSettings",
    "compose",
    "grrm_recipe",
    "unscored",
]

PART_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$"
# The languages whose BLEU needs a tokenizer other than 13a's (which splits on spaces and punctuation).
_CHARACTER_LANGUAGES = frozenset({"ja", "ko", "th"})


# ------------------------------------------------------------------------------------------- facts


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """What every part may read about the group (the row)."""

    source: str
    src_lang: str
    trg_lang: str
    ref_text: str | None = None
    post_edit: bool = False
    # Every candidate's GQM score in request order (None: none), for the post-edit mean.
    scores: tuple[int | None, ...] = ()


@dataclass(frozen=True, slots=True)
class CandidateFacts:
    """What every part may read about one candidate."""

    position: int
    text: str | None  # None: no translation (the member was sent invalid)
    score: int | None  # its GQM score; None: it has none
    response_tokens: int | None = None  # None: the caller did not say
    language_ok: bool | None = None  # the language detector's verdict; None: not checked
    model_values: Mapping[str, float] = field(default_factory=dict)  # model part name -> its value


@dataclass(frozen=True, slots=True)
class Composed:
    """One candidate's reward and its parts' values before weighting."""

    reward: float
    components: dict[str, float]


@dataclass(frozen=True, slots=True)
class MetricItem:
    """One candidate as a model part's deployment scores it."""

    source: str
    candidate: str
    ref_text: str | None
    src_lang: str
    trg_lang: str


class MetricModel(Protocol):
    """A second model deployment a ``kind: model`` part reads (a QE or reference-based metric model)."""

    async def score(self, items: Sequence[MetricItem]) -> list[float | None]:
        """One value per item, in order; None where it has none (its call failed)."""
        ...


def language_code(language: str) -> str:
    """The two-letter code of a language given as a code or as the prompt's name (unknown names: as given)."""
    if len(language) <= 2:
        return language
    for code, name in gqm.LANGUAGE_NAMES.items():
        if name.lower() == language.lower():
            return code
    return language


# ------------------------------------------------------------------------------------------- parts

PART_KINDS: dict[str, type[Part]] = {}
_P = TypeVar("_P", bound="Part")


def part_kind(cls: type[_P]) -> type[_P]:
    """Register a part class under its ``kind`` (the default of its ``kind`` field)."""
    PART_KINDS[cls.model_fields["kind"].default] = cls
    return cls


class Part(BaseModel):
    """A recipe part's settings and what it computes for a candidate."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    weight: float = Field(1.0, allow_inf_nan=False, description="What the part's value is multiplied by in the "
                                                                "reward (a finite number).")
    # Computed off the event loop (tokenizing, n-gram statistics), not inline arithmetic.
    costly: ClassVar[bool] = False

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        """The part's value for a scored candidate (None: the part has none for it, e.g. no reference)."""
        raise NotImplementedError

    def unscored_value(self, candidate: CandidateFacts) -> float | None:
        """The part's value for a candidate without a GQM score: none, but for ``format``."""
        return None


@part_kind
class GrrmPart(Part):
    """The GQM score, scaled."""

    kind: Literal["grrm"] = Field("grrm", description="`grrm`.")
    scale: float = Field(1.0, allow_inf_nan=False, description="The value is the GQM score (0-10) times this "
                                                               "(GRRM's score_scale_factor: 0.01).")

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        if candidate.score is None:
            return None
        if group.post_edit:
            # Spec 5c: the post-edit against the machine translations it was made from.
            scores = [score for score in group.scores if score is not None]
            return (candidate.score - sum(scores) / len(scores)) * self.scale
        return candidate.score * self.scale


@part_kind
class LanguagePart(Part):
    """The language gate (GQM spec section 5b), or a penalty for a candidate in another language."""

    kind: Literal["language"] = Field("language", description="`language`.")
    mode: Literal["gate", "penalty"] = Field(
        "gate", description="`gate`: a candidate not in the target language gets default_reward, fails "
                            "`wrong_language` and is never shown to the model (the part has no value of its own: "
                            "weight is unused); `penalty`: it is shown, and the value is -penalty.")
    penalty: float = Field(1.0, ge=0, allow_inf_nan=False,
                           description="`penalty` mode: the amount a candidate in another language loses (value "
                                       "-penalty; 0 for one in the target language).")

    @property
    def gates(self) -> bool:
        """Whether this part removes candidates in another language from their group."""
        return self.mode == "gate"

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        if self.gates or candidate.language_ok is None:
            return None
        return 0.0 if candidate.language_ok else -self.penalty


@part_kind
class OverlongPart(Part):
    """DAPO's soft overlong penalty on the response's length (GQM spec section 5, ``cluster/rewards.py``)."""

    kind: Literal["overlong"] = Field("overlong", description="`overlong`.")
    max_response_tokens: int = Field(ge=1, description="The response length (tokens) at which the full penalty "
                                                       "applies (GRRM: 4096).")
    buffer_tokens: int = Field(ge=1, description="The penalty rises linearly over this many tokens before "
                                                 "max_response_tokens (GRRM: 2048).")
    penalty: float = Field(ge=0, allow_inf_nan=False, description="The full penalty (value -penalty at "
                                                                  "max_response_tokens and beyond; GRRM: 0.04).")

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongPart:
        if self.buffer_tokens > self.max_response_tokens:
            raise ValueError(f"buffer_tokens: {self.buffer_tokens} exceeds max_response_tokens "
                             f"{self.max_response_tokens}")
        return self

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        if candidate.response_tokens is None:
            return None
        return -overlong_penalty(candidate.response_tokens, max_resp_len=self.max_response_tokens,
                                 buffer_len=self.buffer_tokens, penalty_factor=self.penalty)


@part_kind
class FormatPart(Part):
    """-1 when the extractor found no translation in the response (the member was sent ``invalid``), else 0."""

    kind: Literal["format"] = Field("format", description="`format`.")

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        return -1.0 if candidate.text is None else 0.0

    def unscored_value(self, candidate: CandidateFacts) -> float | None:
        return -1.0 if candidate.text is None else 0.0


_BleuTokenize = Literal["auto", "13a", "intl", "zh", "char", "none"]


@functools.lru_cache(maxsize=16)
def _bleu(tokenize: str) -> Any:
    from sacrebleu.metrics import BLEU  # pure computation; imported where a recipe scores BLEU

    return BLEU(tokenize=tokenize, effective_order=True)


@functools.lru_cache(maxsize=16)
def _chrf(word_order: int) -> Any:
    from sacrebleu.metrics import CHRF

    return CHRF(word_order=word_order)


@part_kind
class BleuPart(Part):
    """sacrebleu's sentence BLEU / 100 against the row's reference (no reference: no value)."""

    kind: Literal["bleu"] = Field("bleu", description="`bleu`.")
    costly: ClassVar[bool] = True
    tokenize: _BleuTokenize = Field(
        "auto", description="sacrebleu's tokenizer: `auto` is `zh` for a Chinese target, `char` for Japanese, "
                            "Korean and Thai, `13a` otherwise.")

    def tokenizer(self, trg_lang: str) -> str:
        """The sacrebleu tokenizer for a target language."""
        if self.tokenize != "auto":
            return self.tokenize
        code = language_code(trg_lang)
        return "zh" if code == "zh" else "char" if code in _CHARACTER_LANGUAGES else "13a"

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        if group.ref_text is None or candidate.text is None:
            return None
        return _bleu(self.tokenizer(group.trg_lang)).sentence_score(candidate.text, [group.ref_text]).score / 100


@part_kind
class ChrfPart(Part):
    """sacrebleu's sentence chrF / 100 against the row's reference (no reference: no value)."""

    kind: Literal["chrf"] = Field("chrf", description="`chrf`.")
    costly: ClassVar[bool] = True
    word_order: int = Field(0, ge=0, le=2, description="chrF's word n-gram order: 0 is chrF, 2 is chrF++.")

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        if group.ref_text is None or candidate.text is None:
            return None
        return _chrf(self.word_order).sentence_score(candidate.text, [group.ref_text]).score / 100


@part_kind
class LengthRatioPart(Part):
    """-|ln(ratio / expected_ratio)|, ratio = the candidate's characters over the source's (both stripped):
    0 at the expected ratio, -ln 2 at twice or half of it."""

    kind: Literal["length_ratio"] = Field("length_ratio", description="`length_ratio`.")
    expected_ratio: float = Field(1.0, gt=0, allow_inf_nan=False,
                                  description="The length ratio (candidate characters over source characters) that "
                                              "costs nothing: about 3 for zh -> en, 0.3 for en -> zh.")

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        if candidate.text is None:
            return None
        source, text = len(group.source.strip()), len(candidate.text.strip())
        if source == 0 or text == 0:
            return None
        return -abs(math.log(text / source / self.expected_ratio))


@part_kind
class ModelPart(Part):
    """A second model deployment's value for the candidate (a QE or reference-based metric model)."""

    kind: Literal["model"] = Field("model", description="`model`.")
    deployment: str = Field(min_length=1, max_length=128,
                            description="The metric model deployment that scores it (its name in the application).")

    def value(self, candidate: CandidateFacts, group: GroupFacts) -> float | None:
        # Set by the runner for every scored candidate (keyed by deployment); a failed call fails the group.
        return candidate.model_values.get(self.deployment)


PartSettings = Annotated[Union[tuple(PART_KINDS.values())], Field(discriminator="kind")]  # noqa: UP007


# ------------------------------------------------------------------------------------------ recipe


class RecipeSettings(BaseModel):
    """A tenant's reward recipe: the default reward and the parts a reward is composed of (docs/recipes.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    default_reward: float = Field(
        RewardSettings().default_reward, allow_inf_nan=False,
        description="The reward of a candidate without a GQM score (a failure, no translation, the language gate, "
                    "too few distinct candidates, a prompt over budget), plus its `format` part where the recipe "
                    "has one (GRRM: -0.04).")
    parts: dict[str, PartSettings] = Field(  # type: ignore[valid-type]
        default_factory=lambda: {"grrm": {}}, validate_default=True,
        description="Part name -> its settings; the name is the component's name in answers, and its kind unless "
                    "`kind` says otherwise (grrm, language, overlong, format, bleu, chrf, length_ratio, model). "
                    "Default: grrm at weight 1, scale 1 (each candidate's reward is its score).")

    @field_validator("parts", mode="before")
    @classmethod
    def _kinds(cls, parts: Any) -> Any:
        """A part's kind is its name unless it says; an unknown kind is refused naming the part."""
        if not isinstance(parts, Mapping):
            return parts
        given: dict[str, Any] = {}
        for name, settings in parts.items():
            if not isinstance(name, str) or not re.match(PART_NAME_PATTERN, name):
                raise ValueError(f"parts: {name!r} is not a part name (a letter, then letters, digits, _ or -; at "
                                 "most 64)")
            if isinstance(settings, Part):
                given[name] = settings
                continue
            if settings is None:
                settings = {}
            if not isinstance(settings, Mapping):
                raise ValueError(f"parts.{name}: expected the part's settings (a mapping), got {settings!r}")
            kind = settings.get("kind", name)
            if kind not in PART_KINDS:
                raise ValueError(f"parts.{name}: unknown part kind {kind!r} (known: {', '.join(PART_KINDS)}; a "
                                 "second model deployment is `kind: model` with its `deployment`)")
            try:
                given[name] = PART_KINDS[kind].model_validate({**settings, "kind": kind})
            except ValidationError as error:
                problems = "; ".join(
                    f"parts.{'.'.join(str(at) for at in (name, *problem['loc']))}: "
                    f"{problem['msg'].removeprefix('Value error, ')}" for problem in error.errors(include_url=False))
                raise ValueError(problems) from None
        return given

    @model_validator(mode="after")
    def _one_gate(self) -> RecipeSettings:
        languages = [name for name, part in self.parts.items() if isinstance(part, LanguagePart)]
        if len(languages) > 1:
            raise ValueError(f"parts: {', '.join(languages)} are all language parts (a recipe has at most one)")
        return self

    @property
    def language(self) -> LanguagePart | None:
        """The recipe's language part, if it has one."""
        return next((part for part in self.parts.values() if isinstance(part, LanguagePart)), None)

    @property
    def gates(self) -> bool:
        """Whether candidates in another language leave their groups (a language part in gate mode)."""
        language = self.language
        return language is not None and language.gates

    @property
    def costly(self) -> bool:
        """Whether composing takes more than arithmetic (then it runs off the event loop)."""
        return any(part.costly for part in self.parts.values())

    def model_parts(self) -> dict[str, ModelPart]:
        """The recipe's model parts by name."""
        return {name: part for name, part in self.parts.items() if isinstance(part, ModelPart)}


def grrm_recipe() -> RecipeSettings:
    """GRRM's own recipe (its authors' reward code): scale 0.01, default -0.04, DAPO's overlong buffer of 2,048
    tokens before 4,096 at 0.04, the language gate on."""
    return RecipeSettings.model_validate({
        "default_reward": -0.04,
        "parts": {"grrm": {"scale": 0.01}, "language": {"mode": "gate"},
                  "overlong": {"max_response_tokens": 4096, "buffer_tokens": 2048, "penalty": 0.04}},
    })


# ----------------------------------------------------------------------------------------- compose


def unscored(recipe: RecipeSettings, candidate: CandidateFacts) -> Composed:
    """The reward of a candidate without a GQM score: ``default_reward``, plus its ``format`` part."""
    components: dict[str, float] = {}
    reward = recipe.default_reward
    for name, part in recipe.parts.items():
        value = part.unscored_value(candidate)
        if value is not None:
            components[name] = value
            reward += part.weight * value
    return Composed(reward=reward, components=components)


def compose(recipe: RecipeSettings, group: GroupFacts, candidates: Sequence[CandidateFacts]) -> list[Composed]:
    """Each candidate's reward and components (see the module docstring). In a post-edit group only the
    last candidate is rewarded: the machine translations before it get ``default_reward`` and no
    components (they are the context of the post-edit, not a policy's rollouts)."""
    last = len(candidates) - 1
    composed = []
    for candidate in candidates:
        if group.post_edit and candidate.position != last:
            composed.append(Composed(reward=recipe.default_reward, components={}))
        elif candidate.score is None:
            composed.append(unscored(recipe, candidate))
        else:
            components: dict[str, float] = {}
            reward = 0.0
            for name, part in recipe.parts.items():
                value = part.value(candidate, group)
                if value is not None:
                    components[name] = value
                    reward += part.weight * value
            composed.append(Composed(reward=reward, components=components))
    return composed
