"""A group through its tenant's recipe: the language gate, the engine, the model parts, the composition.

Both of a replica's paths run every group through :meth:`RecipeRunner.run` (the whole group sent at
once, and the group its assembler built from members), so both answer alike:

1. With a ``language`` part, each candidate's language is detected (off the event loop). In gate mode a
   candidate not in the target language leaves the group before deduplication: it is never shown to
   the model, fails ``wrong_language`` and gets ``default_reward``; a group left with fewer than 2
   distinct candidates gets ``too_few_distinct`` without an engine call (GQM spec section 5b). In a
   post-edit group only the post-edit (the last candidate) is checked, and its failing the gate gives
   the whole group the default (section 5c).
2. The candidates left go to the engine (``scorer``: the replica's engine lane); meanwhile the recipe's
   model parts score them on their own deployments.
3. The recipe composes each candidate's reward and components (:func:`cluster.recipe.compose`; off the
   event loop when it holds costly parts). A model part with no value for a scored candidate (its call
   failed) fails the whole group ``engine_error``, as the engine's own failure does: every candidate
   gets ``default_reward``, a group of equal rewards from which GRPO learns nothing rather than
   rewards some of which lack a part.

Pure: no Ray, no I/O of its own; the detector, the metric models and the way work leaves the event
loop are injected (``deployments/rewarding.py`` builds them for a replica).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cluster import gqm
from cluster.failures import FailureReason
from cluster.recipe import (
    CandidateFacts,
    Composed,
    GroupFacts,
    MetricItem,
    MetricModel,
    RecipeSettings,
    compose,
    unscored,
)
from cluster.protocol.schema import GroupRequest, GroupResult
from cluster.scorer import GroupScoring

__all__ = ["Passes", "RecipeOutcome", "RecipeRunner", "inline"]

_T = TypeVar("_T")

# The language gate: (target language, texts) -> whether each text passes (cluster/language_gate.py).
Passes = Callable[[str, Sequence[str]], list[bool]]
# How work leaves the event loop: asyncio.to_thread's signature.
OffLoop = Callable[..., Awaitable[Any]]


async def inline(function: Callable[..., _T], /, *args: Any) -> _T:
    """Run ``function`` on the caller's thread (pure tests; the replica passes ``asyncio.to_thread``)."""
    return function(*args)


@dataclass(slots=True)
class RecipeOutcome:
    """A group after its recipe: the engine's result and each candidate's fate, in request order."""

    result: GroupResult  # the engine's result for the candidates it was shown, or the group's flagged failure
    scores: list[int | None] | None  # per candidate (None: gated); None when the group has no verdict
    failures: list[FailureReason | None]  # per candidate: wrong_language where the gate removed it
    rewards: list[float]
    components: list[dict[str, float]]
    malformed: bool = False  # the engine's result did not match the candidates it was shown

    def group_result(self, group: GroupRequest) -> GroupResult:
        """The whole group's answer: the result with every candidate's score, reward and components."""
        return self.result.model_copy(update={"group_id": group.group_id, "scores": self.scores,
                                              "rewards": self.rewards, "components": self.components})


def _kept(group: GroupRequest, kept: list[int], tokens: list[int | None]) -> GroupRequest:
    """The group as the engine is shown it: the candidates at ``kept`` (the language gate's), in order."""
    if len(kept) == len(group.candidates):
        return group
    return group.model_copy(update={
        "candidates": [group.candidates[index] for index in kept],
        "response_tokens": None if group.response_tokens is None else [tokens[index] for index in kept]})


class RecipeRunner:
    """Runs groups through their tenant's recipe (see the module docstring)."""

    def __init__(self, recipe_of: Callable[[str], RecipeSettings], *, passes: Passes | None = None,
                 metric_models: Mapping[str, MetricModel] | None = None, off_loop: OffLoop = inline,
                 replica: str = ""):
        """``recipe_of``: tenant -> its recipe; ``passes``: the language gate (needed by recipes with a
        language part); ``metric_models``: deployment name -> client (needed by recipes' model parts);
        ``off_loop``: how detection and costly composition leave the event loop; ``replica``: names this
        replica in the answers the runner gives itself."""
        self.recipe_of = recipe_of
        self.passes = passes
        self.metric_models = dict(metric_models or {})
        self.off_loop = off_loop
        self.replica = replica

    def check(self, where: str, recipe: RecipeSettings) -> None:
        """Refuse a recipe this runner cannot apply (``where``: the recipe's field, for the message)."""
        if recipe.language is not None and self.passes is None:
            raise ValueError(f"{where}.parts: a language part needs the language detector, which this replica "
                             "has not got")
        for name, part in recipe.model_parts().items():
            if part.deployment not in self.metric_models:
                known = ", ".join(sorted(self.metric_models)) or "none"
                raise ValueError(f"{where}.parts.{name}.deployment: no metric model {part.deployment!r} in the "
                                 f"application (metric_models: {known})")

    def unscored(self, tenant: str, invalid: bool = False) -> Composed:
        """The reward of a candidate of ``tenant`` without a score (``invalid``: it had no translation)."""
        return unscored(self.recipe_of(tenant), CandidateFacts(position=0, text=None if invalid else "", score=None))

    def refused(self, group: GroupRequest, result: GroupResult) -> GroupResult:
        """A group answered without scoring (refused, overloaded): every candidate's default reward."""
        composed = self.unscored(group.tenant)
        count = len(group.candidates)
        return result.model_copy(update={"rewards": [composed.reward] * count,
                                         "components": [dict(composed.components) for _ in range(count)]})

    async def run(self, group: GroupRequest, scorer: GroupScoring,
                  response_tokens: Sequence[int | None] | None = None) -> RecipeOutcome:
        """Gate, score (``scorer``: the engine's path for a group of the candidates left) and compose.
        ``response_tokens``: each candidate's response length (default: the group's ``response_tokens``).
        Raises what ``scorer`` raises (the engine's death)."""
        recipe = self.recipe_of(group.tenant)
        count = len(group.candidates)
        tokens = list(response_tokens if response_tokens is not None else group.response_tokens or [None] * count)
        language_ok = await self._languages(recipe, group)
        gated = [recipe.gates and ok is False for ok in language_ok]
        failures: list[FailureReason | None] = ["wrong_language" if out else None for out in gated]
        kept = [index for index in range(count) if not gated[index]]
        refusal = self._gate_refusal(group, gated, kept)
        if refusal is not None:
            return await self._composed(recipe, group, refusal, None, failures, tokens, language_ok, {})
        shown = _kept(group, kept, tokens)
        models = self._start_model_parts(recipe, group, kept)
        try:
            result = await scorer.score_group(shown)
        except BaseException:
            for task in models.values():
                task.cancel()
            raise
        malformed = result.valid and (result.scores is None or len(result.scores) != len(kept))
        if malformed:
            count_text = "no" if result.scores is None else len(result.scores)
            result = result.model_copy(update={
                "valid": False, "scores": None, "failure": "engine_error",
                "error": f"group {group.group_id}: score_group returned {count_text} scores for {len(kept)} candidates"})
        if not result.valid:
            for task in models.values():
                task.cancel()
            outcome = await self._composed(recipe, group, result, None, failures, tokens, language_ok, {})
            outcome.malformed = malformed
            return outcome
        scores: list[int | None] = [None] * count
        for index, value in zip(kept, result.scores or (), strict=True):
            scores[index] = value
        values, missing = await self._model_values(models, group, scores)
        if missing:
            failed = result.model_copy(update={"valid": False, "scores": None, "failure": "engine_error",
                                               "error": f"group {group.group_id}: {missing}"})
            return await self._composed(recipe, group, failed, None, failures, tokens, language_ok, {})
        return await self._composed(recipe, group, result, scores, failures, tokens, language_ok, values)

    # ------------------------------------------------------------------------------------ gate

    async def _languages(self, recipe: RecipeSettings, group: GroupRequest) -> list[bool | None]:
        """Each candidate's language verdict (None: not checked): the post-edit only in a post-edit group."""
        count = len(group.candidates)
        if recipe.language is None:
            return [None] * count
        if self.passes is None:
            raise RuntimeError("the recipe has a language part and this runner no language gate (check() first)")
        checked = [count - 1] if group.post_edit else list(range(count))
        verdicts = await self.off_loop(self.passes, group.trg_lang, [group.candidates[i] for i in checked])
        language_ok: list[bool | None] = [None] * count
        for index, verdict in zip(checked, verdicts, strict=True):
            language_ok[index] = bool(verdict)
        return language_ok

    def _gate_refusal(self, group: GroupRequest, gated: list[bool], kept: list[int]) -> GroupResult | None:
        """The group's flagged result when the gate leaves nothing to score (None: score what is left)."""
        if not any(gated):
            return None  # the engine's path decides, as without a gate
        if group.post_edit and gated[-1]:
            return self._flagged(group, "wrong_language", "the post-edit (the last candidate) is not in the "
                                                          f"target language {group.trg_lang}: the language gate")
        distinct = len({group.candidates[index] for index in kept})
        if distinct >= gqm.MIN_CANDIDATES:
            return None
        return self._flagged(group, "too_few_distinct",
                             f"{sum(gated)} of {len(gated)} candidates are not in the target language "
                             f"{group.trg_lang} (the language gate); {distinct} distinct left: nothing to compare")

    def _flagged(self, group: GroupRequest, failure: FailureReason, error: str) -> GroupResult:
        return GroupResult(group_id=group.group_id, valid=False, failure=failure,
                           error=f"group {group.group_id}: {error}", replica=self.replica)

    # ----------------------------------------------------------------------------- model parts

    def _start_model_parts(self, recipe: RecipeSettings, group: GroupRequest,
                           kept: list[int]) -> dict[str, asyncio.Task[list[float | None]]]:
        """A task per metric deployment the recipe reads, scoring the candidates that may get a reward
        (the post-edit alone in a post-edit group), each distinct text once, beside the engine."""
        deployments = {part.deployment for part in recipe.model_parts().values()}
        if not deployments:
            return {}
        rewarded = [len(group.candidates) - 1] if group.post_edit else kept
        texts = list(dict.fromkeys(group.candidates[index] for index in rewarded))
        items = [MetricItem(source=group.source, candidate=text, ref_text=group.ref_text, src_lang=group.src_lang,
                            trg_lang=group.trg_lang) for text in texts]
        loop = asyncio.get_running_loop()
        return {deployment: loop.create_task(self._metric_values(deployment, items), name=f"metric-{deployment}")
                for deployment in sorted(deployments)}

    async def _metric_values(self, deployment: str, items: list[MetricItem]) -> list[float | None]:
        values = await self.metric_models[deployment].score(items)
        if len(values) != len(items):
            raise ValueError(f"metric model {deployment} returned {len(values)} values for {len(items)} candidates")
        return list(values)

    async def _model_values(self, models: Mapping[str, asyncio.Task[list[float | None]]], group: GroupRequest,
                            scores: list[int | None]) -> tuple[dict[int, dict[str, float]], str | None]:
        """Each rewarded candidate's model values (position -> deployment -> value), or why one is missing."""
        if not models:
            return {}, None
        rewarded = [len(group.candidates) - 1] if group.post_edit else [i for i, s in enumerate(scores) if s is not None]
        texts = list(dict.fromkeys(group.candidates[index] for index in rewarded))
        values: dict[int, dict[str, float]] = {index: {} for index in rewarded}
        for deployment, task in models.items():
            try:
                by_text = dict(zip(texts, await task, strict=True))
            except Exception as error:  # noqa: BLE001 - a failed metric call fails the group, named
                return {}, f"recipe model part {deployment}: its call failed ({type(error).__name__}: {error})"
            for index in rewarded:
                value = by_text.get(group.candidates[index])
                if value is None:
                    return {}, (f"recipe model part {deployment}: no value for candidate {index} (its metric "
                                "model's call failed)")
                values[index][deployment] = float(value)
        return values, None

    # --------------------------------------------------------------------------------- compose

    async def _composed(self, recipe: RecipeSettings, group: GroupRequest, result: GroupResult,
                        scores: list[int | None] | None, failures: list[FailureReason | None],
                        tokens: list[int | None], language_ok: list[bool | None],
                        model_values: Mapping[int, Mapping[str, float]]) -> RecipeOutcome:
        facts = GroupFacts(source=group.source, src_lang=group.src_lang, trg_lang=group.trg_lang,
                           ref_text=group.ref_text if group.ref_text and group.ref_text.strip() else None,
                           post_edit=group.post_edit, scores=tuple(scores or ()))
        candidates = [CandidateFacts(position=index, text=text, score=None if scores is None else scores[index],
                                     response_tokens=tokens[index], language_ok=language_ok[index],
                                     model_values=model_values.get(index, {}))
                      for index, text in enumerate(group.candidates)]
        scored = scores is not None
        # Only a scored group computes parts beyond arithmetic (BLEU, chrF): those leave the event loop.
        composed = (await self.off_loop(compose, recipe, facts, candidates) if scored and recipe.costly
                    else compose(recipe, facts, candidates))
        return RecipeOutcome(result=result, scores=scores, failures=failures,
                             rewards=[one.reward for one in composed], components=[one.components for one in composed])
