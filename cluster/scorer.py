"""From a group to scores: dedup, plan, prompt, generate, parse, retry, merge. One engine, many groups.

A group is scored by one prompt, or, for large groups (``split_large_groups``) and position-bias
ensembles (``permutations``), by several prompts planned and merged in :mod:`cluster.ensemble`.
Every prompt goes through :meth:`GroupScorer.score_prompt` (retries and verdict repair included).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cluster import ensemble, gqm, prompt_guard
from cluster.config import ScoringConfig
from cluster.engines.base import (
    Engine,
    EngineDeadError,
    Generation,
    SamplingSettings,
    apply_chat_template,
    count_tokens,
)
from cluster.protocol.schema import FailureReason, GroupRequest, GroupResult, Usage

# Score range the prompt asks for; out-of-range answers count as unparseable for every type
# whose scores are model-written. `ranking` scores are derived from tiers instead: 0 (the lowest
# tier) to tiers - 1, so up to 25 for 26 candidates, and are not held to this range.
SCORE_RANGE = range(gqm.SCORE_MIN, gqm.SCORE_MAX + 1)


def dedup_candidates(candidates: Sequence[str]) -> tuple[list[str], list[int]]:
    """Distinct texts in first-seen order, and for each original candidate its distinct index."""
    positions: dict[str, int] = {}
    for candidate in candidates:
        positions.setdefault(candidate, len(positions))
    return list(positions), [positions[candidate] for candidate in candidates]


def ranking_line(answer: str, prompt_type: str) -> str | None:
    """The ranking line of an answer (``B > A = C``), when the answer has one."""
    lines = [line.strip() for line in answer.strip().split("\n")]
    if prompt_type == "ranking":
        return lines[-1] or None
    if prompt_type == "ranking_score" and len(lines) >= 2 and any(mark in lines[-2] for mark in ">="):
        return lines[-2]
    return None


def read_verdict(answer: str, n: int, prompt_type: str) -> list[int] | None:
    """Parse an answer and apply the project's range policy on model-written scores."""
    scores = gqm.parse_group_answer(answer, n, prompt_type)  # type: ignore[arg-type]
    if scores is None:
        return None
    if prompt_type != "ranking" and any(score not in SCORE_RANGE for score in scores):
        return None
    return scores


@dataclass
class PromptOutcome:
    """What one prompt produced: its members' scores (in prompt order) or why not, and its cost."""

    scores: list[int] | None = None
    failure: FailureReason | None = None
    error: str | None = None
    attempts: int = 0
    repairs: int = 0
    usage: Usage = field(default_factory=Usage)
    stages: dict[str, float] = field(default_factory=dict)
    answer: str | None = None

    def as_failure(self) -> GroupResult:
        """The flagged group result of a group whose only prompt failed."""
        assert self.failure is not None
        return _failed(
            self.failure,
            self.error or self.failure,
            attempts=self.attempts,
            repairs=self.repairs,
            usage=self.usage,
            stages=self.stages,
            answer=self.answer,
        )


class GroupScoring(Protocol):
    """What scores one group's candidates: a :class:`GroupScorer`, or a replica's engine lane in front of one
    (``cluster/engine_lane.py``). A group's recipe (:class:`~cluster.recipe_runner.RecipeRunner`) scores
    through it, for a whole group and for one its replica assembled from members."""

    async def score_group(self, group: GroupRequest) -> GroupResult:
        """The group's scores, or why it has none (a flagged result); raises
        :class:`~cluster.engines.base.EngineDeadError` when the engine died while scoring it."""
        ...


class GroupScorer(GroupScoring):
    """Scores GQM groups with one engine.

    Groups are scored concurrently: each :meth:`score_group` call awaits its own generation
    and the engine batches concurrent calls (continuous batching in vLLM/SGLang).

    Engine trouble is a flagged result, except the engine's death: :class:`EngineDeadError`
    propagates, because no verdict exists and the group must be scored on another engine.
    """

    def __init__(self, engine: Engine, config: ScoringConfig | None = None, replica: str = ""):
        self.engine = engine
        self.config = config or ScoringConfig()
        self.replica = replica

    def build_prompt(self, group: GroupRequest, distinct: Sequence[str]) -> str:
        """The GQM prompt as the model sees it (through its chat template).

        The group's reference and notes follow the candidates (spec section 1b), in every
        prompt of the group's plan. Texts are pasted as given: :meth:`score_group` passes them
        through the prompt guard first (:meth:`guard_texts`), so no source, candidate, reference
        or note can change the prompt's structure.
        """
        user_message = gqm.build_group_prompt(
            group.source,
            list(distinct),
            group.src_lang,
            group.trg_lang,
            self.config.prompt_type,
            self.config.add_example,
            ref_text=group.ref_text,
            ref_lang=group.ref_lang,
            notes=group.notes,
        )
        return apply_chat_template(self.engine.tokenizer, user_message)

    def sampling_for_attempt(self, attempt: int) -> SamplingSettings:
        """Attempt 0 uses the reward temperature (greedy); retries sample at retry_temperature."""
        config = self.config
        return SamplingSettings(
            temperature=config.temperature if attempt == 0 else config.retry_temperature,
            top_p=config.top_p,
            max_tokens=config.max_answer_tokens,
            seed=config.seed + attempt,
        )

    async def score_groups(self, groups: Sequence[GroupRequest]) -> list[GroupResult]:
        """Score many groups concurrently; results in request order."""
        return list(await asyncio.gather(*(self.score_group(group) for group in groups)))

    async def score_group(self, group: GroupRequest) -> GroupResult:
        """Score one group; a group that cannot be scored comes back flagged, never made up.

        Its texts pass the prompt guard first (:meth:`guard_texts`); ``guarded_texts`` in the
        result counts those that could have changed the prompt's structure.
        Raises :class:`EngineDeadError` when the engine died (or hung) while scoring it.
        """
        started = time.perf_counter()
        guarded = self.guard_texts(group)
        if guarded.rejected:
            result = _failed(
                "rejected",
                f"{', '.join(guarded.forging)}: contains a code fence (```) or a special token of the model's "
                "tokenizer, which would change the prompt's structure (scoring.prompt_guard is reject)",
            )
        else:
            if guarded.action == "neutralized" and guarded.forging:
                group = group.model_copy(update={"source": guarded.source, "candidates": guarded.candidates,
                                                 "ref_text": guarded.ref_text, "notes": guarded.notes})
            result = await self._score(group)
        result.guarded_texts = guarded.counts
        result.group_id = group.group_id
        result.replica = self.replica
        result.latency_s = time.perf_counter() - started
        return result

    def guard_texts(self, group: GroupRequest) -> prompt_guard.GuardedTexts:
        """The group's texts (source, candidates, reference, notes) as its prompts will hold them,
        and which could forge the prompt's structure (code fences, the tokenizer's special
        tokens): ``scoring.prompt_guard`` decides whether they are neutralized, refused or left
        as they are (:mod:`cluster.prompt_guard`)."""
        return prompt_guard.guard_texts(group.source, group.candidates, self.special_tokens, self.config.prompt_guard,
                                        ref_text=group.ref_text, notes=group.notes)

    @functools.cached_property
    def special_tokens(self) -> tuple[str, ...]:
        """The strings the engine's tokenizer reads as special tokens (read at first use: after start)."""
        return prompt_guard.special_tokens(self.engine.tokenizer)

    def plan(self, group: GroupRequest, distinct: Sequence[str]) -> list[ensemble.SubPrompt]:
        """The prompts that score ``distinct``: one, or subgroups and/or permutations.

        One prompt of every distinct candidate in order unless the group is larger than
        ``max_group_size`` (split, when ``split_large_groups``) or ``permutations > 1``. The plan
        is seeded by the config seed and the group's texts: the same group, the same prompts.
        """
        config = self.config
        split = config.split_large_groups and len(distinct) > config.max_group_size
        return ensemble.plan_prompts(
            len(distinct),
            max_size=(config.split_subgroup_size or config.max_group_size) if split else gqm.MAX_CANDIDATES,
            anchors=config.split_anchors,
            permutations=config.permutations,
            seed=ensemble.group_seed(config.seed, group.source, *distinct),
            design=config.permutation_design,
        )

    async def _score(self, group: GroupRequest) -> GroupResult:
        config = self.config
        # A post-edit group is scored as sent (spec section 5c): a post-edit identical to one of
        # its MT texts is still its own, last, candidate. Ensembles keep working on it: merged
        # scores come back per candidate, so the last is still the post-edit's.
        distinct, position = (
            (list(group.candidates), list(range(len(group.candidates))))
            if group.post_edit
            else dedup_candidates(group.candidates)
        )
        if len(distinct) < gqm.MIN_CANDIDATES:
            return _failed("too_few_distinct", "the group has fewer than 2 distinct candidates")
        shown = "candidates (a post-edit group's, not deduplicated)" if group.post_edit else "distinct candidates"
        if len(distinct) > config.max_group_size and not config.split_large_groups:
            return _failed(
                "rejected",
                f"candidates: {len(distinct)} {shown} exceed max_group_size {config.max_group_size}"
                " (split_large_groups is off)",
            )
        plan = self.plan(group, distinct)
        if len(plan) > config.max_prompts_per_group:
            return _failed(
                "rejected",
                f"candidates: {len(distinct)} {shown} need {len(plan)} prompts, more than "
                f"max_prompts_per_group {config.max_prompts_per_group}",
            )
        if len(plan) == 1:
            # The plain path: one prompt of every distinct candidate, in order.
            outcome = await self.score_prompt(group, distinct)
            if outcome.scores is None:
                return outcome.as_failure()
            return GroupResult(
                scores=[outcome.scores[index] for index in position],
                ranking=ranking_line(outcome.answer or "", config.prompt_type),
                valid=True,
                attempts=outcome.attempts,
                repairs=outcome.repairs,
                usage=outcome.usage,
                stages=outcome.stages,
                answer=outcome.answer,
            )
        return await self._score_ensemble(group, distinct, position, plan)

    async def _score_ensemble(
        self, group: GroupRequest, distinct: list[str], position: list[int], plan: list[ensemble.SubPrompt]
    ) -> GroupResult:
        """Score every planned prompt concurrently and merge the verdicts (cluster/ensemble.py).

        Usage, attempts, repairs and stage times are summed over all prompts. The group is
        invalid when the prompts that produced a verdict do not connect every candidate.
        """
        config = self.config
        outcomes = await asyncio.gather(
            *(self.score_prompt(group, [distinct[member] for member in prompt.members]) for prompt in plan)
        )
        usage = Usage()
        stages: dict[str, float] = {}
        for outcome in outcomes:
            usage = usage + outcome.usage
            for stage, seconds in outcome.stages.items():
                stages[stage] = stages.get(stage, 0.0) + seconds
        totals = {
            "attempts": sum(outcome.attempts for outcome in outcomes),
            "repairs": sum(outcome.repairs for outcome in outcomes),
            "usage": usage,
            "stages": stages,
        }
        verdicts = [
            (prompt.members, outcome.scores) for prompt, outcome in zip(plan, outcomes) if outcome.scores is not None
        ]
        failed = [outcome for outcome in outcomes if outcome.scores is None]
        merge_started = time.perf_counter()
        merged = ensemble.merge_verdicts(
            len(distinct),
            verdicts,
            temperature=config.merge_temperature,
            prior=config.merge_prior,
            prompt_type=config.prompt_type,
        )
        stages["merge"] = time.perf_counter() - merge_started
        if merged is None:
            # Name the commonest sub-prompt failure (the first on a tie) as the group's.
            reasons = [outcome.failure for outcome in failed if outcome.failure is not None]
            failure = max(reasons, key=reasons.count) if reasons else "parse_failed"
            counts = ", ".join(f"{reason}: {reasons.count(reason)}" for reason in dict.fromkeys(reasons))
            return _failed(
                failure,
                f"{len(failed)} of {len(plan)} prompts failed ({counts}; first: {failed[0].error if failed else '-'}); "
                "the verdicts left do not compare every candidate with the others",
                answer=(failed[0] if failed else outcomes[-1]).answer,
                **totals,
            )
        answers = [outcome.answer for outcome in outcomes if outcome.answer is not None]
        return GroupResult(
            scores=[merged.scores[index] for index in position],
            # Letters name distinct candidates in their original order, as on the plain path.
            ranking=gqm.render_answer(merged.scores, "ranking") if len(distinct) <= gqm.MAX_CANDIDATES else None,
            valid=True,
            answer=answers[-1] if answers else None,
            **totals,
        )

    async def score_prompt(self, group: GroupRequest, candidates: Sequence[str]) -> PromptOutcome:
        """Score one prompt of distinct ``candidates`` (in prompt order): the path every plan uses.

        Builds and measures the prompt, then generates, parses, repairs (``verdict_repair``) and
        resamples (``retries``) until a verdict parses. Raises for the engine's death only
        (:class:`EngineDeadError`, also when a generation timed out and the engine then failed a
        health check: it hangs); other engine trouble is a flagged outcome.
        """
        config = self.config
        prompt = self.build_prompt(group, candidates)
        prompt_tokens = count_tokens(self.engine.tokenizer, prompt)
        if prompt_tokens > config.max_prompt_tokens:
            return PromptOutcome(
                failure="prompt_too_long",
                error=f"prompt has {prompt_tokens} tokens, more than max_prompt_tokens {config.max_prompt_tokens}",
            )

        usage = Usage()
        stages = {"generation": 0.0, "parse": 0.0}
        answer: str | None = None
        repairs = 0
        for attempt in range(config.retries + 1):
            generation_started = time.perf_counter()
            try:
                generation = await self._generate(prompt, self.sampling_for_attempt(attempt))
            except EngineDeadError:
                raise
            except Exception as error:  # noqa: BLE001 - any engine failure is reported, not raised
                timed_out = isinstance(error, TimeoutError)
                if timed_out:
                    await self._raise_if_hung()
                return PromptOutcome(
                    failure="timeout" if timed_out else "engine_error",
                    error=f"generation ran past generation_timeout_s {config.generation_timeout_s}"
                    if timed_out
                    else f"engine {self.engine.name} failed: {type(error).__name__}: {error}",
                    attempts=attempt + 1,
                    repairs=repairs,
                    usage=usage,
                    stages=stages,
                    answer=answer,
                )
            parse_started = time.perf_counter()
            stages["generation"] += parse_started - generation_started
            usage = usage + Usage.of(generation)
            answer = generation.text
            scores = read_verdict(answer, len(candidates), config.prompt_type)
            stages["parse"] += time.perf_counter() - parse_started
            if scores is None and config.verdict_repair:
                repair_started = time.perf_counter()
                repaired = await self._repair(prompt, answer, len(candidates), attempt)
                stages["repair"] = stages.get("repair", 0.0) + time.perf_counter() - repair_started
                if repaired is not None:
                    answer, repair_usage, scores = repaired
                    usage = usage + repair_usage
                    repairs += scores is not None
            if scores is not None:
                return PromptOutcome(
                    scores=scores, attempts=attempt + 1, repairs=repairs, usage=usage, stages=stages, answer=answer
                )
        return PromptOutcome(
            failure="parse_failed",
            error=f"no parseable verdict in {config.retries + 1} attempts",
            attempts=config.retries + 1,
            repairs=repairs,
            usage=usage,
            stages=stages,
            answer=answer,
        )

    async def _repair(
        self, prompt: str, answer: str, n: int, attempt: int
    ) -> tuple[str, Usage, list[int] | None] | None:
        """Continue an unparseable answer's analysis with a regex-constrained verdict.

        Returns the repaired answer, the tokens the repair cost and its scores (None if even the
        repaired verdict does not parse), or None when the engine failed at it.
        """
        analysis = answer.rstrip()
        continuation = prompt + analysis + "\n\n"
        sampling = SamplingSettings(
            temperature=0.0,
            max_tokens=self.config.repair_max_tokens,
            seed=self.config.seed + attempt,
            regex=gqm.verdict_regex(n, self.config.prompt_type),
        )
        try:
            generation = await self._generate(continuation, sampling)
        except EngineDeadError:
            raise
        except Exception:  # noqa: BLE001 - a failed repair falls back to resampling
            return None
        repaired = f"{analysis}\n\n{generation.text}" if analysis else generation.text
        usage = Usage.of(generation)
        return repaired, usage, read_verdict(repaired, n, self.config.prompt_type)

    async def _raise_if_hung(self) -> None:
        """After a generation ran past its deadline: a slow prompt, or a hung engine? A hung engine
        fails its health check too (bounded by the same deadline); that is the engine's death."""
        try:
            await asyncio.wait_for(self.engine.check_health(), timeout=self.config.generation_timeout_s)
        except Exception as error:  # noqa: BLE001 - any failed or late health check means hung
            raise EngineDeadError(
                f"engine {self.engine.name} hung: a generation ran past generation_timeout_s "
                f"{self.config.generation_timeout_s} and its health check failed ({type(error).__name__}: {error})"
            ) from error

    async def _generate(self, prompt: str, sampling: SamplingSettings) -> Generation:
        # The longest prompt (the largest group) first, for engines that schedule by priority.
        generations = await asyncio.wait_for(
            self.engine.generate([prompt], sampling, priority=-len(prompt)), timeout=self.config.generation_timeout_s
        )
        return generations[0]


def _failed(failure: FailureReason, error: str, **fields) -> GroupResult:
    return GroupResult(valid=False, failure=failure, error=error, **fields)
