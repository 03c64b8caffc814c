"""A generative metric model as a reward part: one candidate, its source (and reference) -> a value in 0..1.

A metric model of a recipe (a QE or reference-based judge beside the GRRM scorer, ``metric_models`` in
the application's config) is any chat model behind the engine interface, asked GQM's single-candidate
(SQM) prompt (``docs/gqm.md`` section 2) and read as SQM is read: an integer 0..10 alone on the answer's
last line. With a reference the prompt carries it in SQM's notes block, headed as GQM's reference block
heads it (``German reference:``): a reference-based metric with no prompt of its own to drift from
GRRM's; without one it is a QE metric. The value is the score divided by 10 (0..1, as BLEU and chrF
are divided by 100).

:class:`MetricJudge` scores the items of one group together (their prompts go to the engine at once,
which batches them), each prompt as the scorer does one (``cluster/scorer.py``): a greedy first attempt,
an unparseable answer continued from its analysis with a regex-constrained score (``verdict_repair``:
what lets even a random tiny model answer), then resampled (``retries``). An item whose answer never
parses, whose prompt is over budget or refused by the prompt guard, or that the engine failed on is
``None``: no value is made up. The engine's death (:class:`EngineDeadError`)
propagates, for the replica that holds the engine to give it up.

Pure logic: no Ray; the engine is the only I/O.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Protocol

from cluster import gqm, prompt_guard
from cluster.config import ScoringConfig
from cluster.engines.base import Engine, EngineDeadError, SamplingSettings, apply_chat_template, count_tokens
from cluster.scorer import SCORE_RANGE

__all__ = ["SCORE_REGEX", "MetricJudge", "MetricText", "metric_prompt", "reference_notes", "read_score"]

logger = logging.getLogger(__name__)

# What a constrained repair may write: one in-range score, nothing else.
SCORE_REGEX = "(10|[0-9])"


class MetricText(Protocol):
    """What a metric model reads of one candidate (``cluster.recipe.MetricItem`` has these)."""

    source: str
    candidate: str
    ref_text: str | None
    src_lang: str
    trg_lang: str


def reference_notes(ref_text: str | None, ref_lang: str) -> str | None:
    """The notes that give the model a reference: ``<Language> reference:`` and the stripped text, as
    GQM's reference block heads it (spec section 1b); None without a (non-blank) reference."""
    if ref_text is None or not ref_text.strip():
        return None
    return f"{gqm.language_name(ref_lang, 'ref_lang')} reference:\n{ref_text.strip()}"


def metric_prompt(source: str, candidate: str, src_lang: str, trg_lang: str, ref_text: str | None = None) -> str:
    """The user message a metric model reads: GQM's SQM prompt, the reference (in the target language)
    in its notes block where there is one (:func:`reference_notes`)."""
    return gqm.build_single_prompt(source, candidate, src_lang, trg_lang, notes=reference_notes(ref_text, trg_lang))


def read_score(answer: str) -> int | None:
    """The SQM verdict: an integer 0..10 alone on the answer's last line (spec section 2), else None."""
    line = gqm.last_line(answer)
    if not line.isascii() or not line.isdigit():
        return None
    score = int(line)
    return score if score in SCORE_RANGE else None


class MetricJudge:
    """Scores candidates with one engine (see the module docstring).

    ``scoring`` is the :class:`~cluster.config.ScoringConfig` a metric model's config holds: of it the
    judge uses the prompt guard, the token budgets, the sampling (temperatures, top-p, seed), retries,
    verdict repair and the generation timeout; the group settings (prompt type, splits, permutations)
    have no meaning for one candidate.
    """

    def __init__(self, engine: Engine, scoring: ScoringConfig | None = None):
        self.engine = engine
        self.scoring = scoring or ScoringConfig()

    @functools.cached_property
    def special_tokens(self) -> tuple[str, ...]:
        """The strings the engine's tokenizer reads as special tokens (read at first use: after start)."""
        return prompt_guard.special_tokens(self.engine.tokenizer)

    def build_prompt(self, item: MetricText) -> str | None:
        """The prompt as the model sees it (chat template applied), its texts through the prompt guard;
        None where the guard refuses a text (``prompt_guard: reject``) or the prompt is over
        ``max_prompt_tokens``."""
        guarded = prompt_guard.guard_texts(item.source, [item.candidate], self.special_tokens,
                                           self.scoring.prompt_guard, ref_text=item.ref_text)
        if guarded.rejected:
            return None
        message = metric_prompt(guarded.source, guarded.candidates[0], item.src_lang, item.trg_lang, guarded.ref_text)
        text = apply_chat_template(self.engine.tokenizer, message)
        if count_tokens(self.engine.tokenizer, text) > self.scoring.max_prompt_tokens:
            return None
        return text

    async def score(self, items: Sequence[MetricText]) -> list[float | None]:
        """Each item's value in 0..1, in order; None where no score could be read (see the module docstring).

        The prompts go to the engine together (it batches them); items with the same prompt (a group's
        duplicate candidates) are generated once, and one prompt's failure is that prompt's only."""
        texts = [self.build_prompt(item) for item in items]
        distinct = list(dict.fromkeys(text for text in texts if text is not None))
        scores = dict(zip(distinct, await asyncio.gather(*(self.score_prompt(text) for text in distinct))))
        return [None if text is None or scores[text] is None else scores[text] / gqm.SCORE_MAX for text in texts]

    async def score_prompt(self, prompt: str) -> int | None:
        """One prompt's score 0..10: attempts (the first greedy, then resampled), each unparseable answer
        repaired where ``verdict_repair`` is on; None when none parses or the engine failed it."""
        config = self.scoring
        for attempt in range(config.retries + 1):
            sampling = SamplingSettings(
                temperature=config.temperature if attempt == 0 else config.retry_temperature,
                top_p=config.top_p, max_tokens=config.max_answer_tokens, seed=config.seed + attempt)
            answer = await self._generate(prompt, sampling)
            if answer is None:
                return None
            score = read_score(answer)
            if score is None and config.verdict_repair:
                score = await self._repair(prompt, answer, attempt)
            if score is not None:
                return score
        return None

    async def _repair(self, prompt: str, answer: str, attempt: int) -> int | None:
        """Continue an unparseable answer's analysis with a score the engine may only write in range."""
        sampling = SamplingSettings(temperature=0.0, max_tokens=self.scoring.repair_max_tokens,
                                    seed=self.scoring.seed + attempt, regex=SCORE_REGEX)
        analysis = answer.rstrip()
        verdict = await self._generate(prompt + analysis + "\n\n", sampling)
        return None if verdict is None else read_score(verdict)

    async def _generate(self, prompt: str, sampling: SamplingSettings) -> str | None:
        """The engine's answer, or None when it failed (logged); the engine's death raises."""
        try:
            [generation] = await asyncio.wait_for(self.engine.generate([prompt], sampling),
                                                  timeout=self.scoring.generation_timeout_s)
        except EngineDeadError:
            raise
        except Exception as error:  # noqa: BLE001 - a failed prompt is a None value, never a made-up one
            logger.warning("metric model: engine %s failed a prompt: %s: %s", self.engine.name,
                           type(error).__name__, error)
            return None
        return generation.text
