"""From a group to scores: dedup, prompt, generate, parse, retry. One engine, many groups."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from cluster import gqm
from cluster.config import ScoringConfig
from cluster.engines.base import Engine, Generation, SamplingSettings, apply_chat_template, count_tokens
from cluster.schema import FailureReason, GroupRequest, GroupResult, Usage

# Score range the prompt asks for; out-of-range answers count as unparseable for every type
# whose scores are model-written (for `ranking` the parser derives them from tiers).
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


class GroupScorer:
    """Scores GQM groups with one engine.

    Groups are scored concurrently: each :meth:`score_group` call awaits its own generation
    and the engine batches concurrent calls (continuous batching in vLLM/SGLang).
    """

    def __init__(self, engine: Engine, config: ScoringConfig | None = None, replica: str = ""):
        self.engine = engine
        self.config = config or ScoringConfig()
        self.replica = replica

    def build_prompt(self, group: GroupRequest, distinct: Sequence[str]) -> str:
        """The GQM prompt as the model sees it (through its chat template)."""
        user_message = gqm.build_group_prompt(
            group.source,
            list(distinct),
            group.src_lang,
            group.trg_lang,
            self.config.prompt_type,
            self.config.add_example,
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
        """Score one group; a group that cannot be scored comes back flagged, never made up."""
        started = time.perf_counter()
        result = await self._score(group)
        result.group_id = group.group_id
        result.replica = self.replica
        result.latency_s = time.perf_counter() - started
        return result

    async def _score(self, group: GroupRequest) -> GroupResult:
        config = self.config
        distinct, position = dedup_candidates(group.candidates)
        if len(distinct) < gqm.MIN_CANDIDATES:
            return _failed("too_few_distinct", "the group has fewer than 2 distinct candidates")
        if len(distinct) > config.max_group_size:
            return _failed(
                "rejected",
                f"candidates: {len(distinct)} distinct candidates exceed max_group_size {config.max_group_size}",
            )
        prompt = self.build_prompt(group, distinct)
        prompt_tokens = count_tokens(self.engine.tokenizer, prompt)
        if prompt_tokens > config.max_prompt_tokens:
            return _failed(
                "prompt_too_long",
                f"prompt has {prompt_tokens} tokens, more than max_prompt_tokens {config.max_prompt_tokens}",
            )

        usage = Usage()
        stages = {"generation": 0.0, "parse": 0.0}
        answer: str | None = None
        repairs = 0
        for attempt in range(config.retries + 1):
            generation_started = time.perf_counter()
            try:
                generation = await self._generate(prompt, self.sampling_for_attempt(attempt))
            except TimeoutError:
                return _failed(
                    "timeout",
                    f"generation ran past generation_timeout_s {config.generation_timeout_s}",
                    attempts=attempt + 1,
                    usage=usage,
                    stages=stages,
                    answer=answer,
                )
            except Exception as error:  # noqa: BLE001 - any engine failure is reported, not raised
                return _failed(
                    "engine_error",
                    f"engine {self.engine.name} failed: {type(error).__name__}: {error}",
                    attempts=attempt + 1,
                    usage=usage,
                    stages=stages,
                    answer=answer,
                )
            parse_started = time.perf_counter()
            stages["generation"] += parse_started - generation_started
            usage = usage + Usage(
                prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens
            )
            answer = generation.text
            distinct_scores = read_verdict(answer, len(distinct), config.prompt_type)
            stages["parse"] += time.perf_counter() - parse_started
            if distinct_scores is None and config.verdict_repair:
                repair_started = time.perf_counter()
                repaired = await self._repair(prompt, answer, len(distinct), attempt)
                stages["repair"] = stages.get("repair", 0.0) + time.perf_counter() - repair_started
                if repaired is not None:
                    answer, repair_usage, distinct_scores = repaired
                    usage = usage + repair_usage
                    repairs += distinct_scores is not None
            if distinct_scores is not None:
                return GroupResult(
                    scores=[distinct_scores[index] for index in position],
                    ranking=ranking_line(answer, config.prompt_type),
                    valid=True,
                    attempts=attempt + 1,
                    repairs=repairs,
                    usage=usage,
                    stages=stages,
                    answer=answer,
                )
        return _failed(
            "parse_failed",
            f"no parseable verdict in {config.retries + 1} attempts",
            attempts=config.retries + 1,
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
        except Exception:  # noqa: BLE001 - a failed repair falls back to resampling
            return None
        repaired = f"{analysis}\n\n{generation.text}" if analysis else generation.text
        usage = Usage(prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens)
        return repaired, usage, read_verdict(repaired, n, self.config.prompt_type)

    async def _generate(self, prompt: str, sampling: SamplingSettings) -> Generation:
        generations = await asyncio.wait_for(
            self.engine.generate([prompt], sampling), timeout=self.config.generation_timeout_s
        )
        return generations[0]


def _failed(failure: FailureReason, error: str, **fields) -> GroupResult:
    return GroupResult(valid=False, failure=failure, error=error, **fields)
