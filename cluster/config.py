"""Typed scoring settings: how a group becomes a GQM prompt, a generation and a verdict."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cluster.gqm import MAX_CANDIDATES, PromptType


class ScoringConfig(BaseModel):
    """GRRM's recipe by default: greedy first attempt, retries sampled at temperature 1.0."""

    model_config = ConfigDict(extra="forbid")

    prompt_type: PromptType = "ranking_score"
    add_example: bool = False
    # Prompts longer than this (chat template included) are refused, not truncated.
    max_prompt_tokens: int = Field(4096, ge=16)
    max_answer_tokens: int = Field(4096, ge=1)
    temperature: float = Field(0.0, ge=0)
    retry_temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # Extra attempts after an unparseable answer (GRRM resamples the whole analysis).
    retries: int = Field(6, ge=0, le=32)
    seed: int = 0
    # Deadline for one generation attempt; a hung engine never holds a group forever.
    generation_timeout_s: float = Field(600.0, gt=0)
    # On an answer with an analysis but no parseable verdict, continue from the analysis with a
    # short regex-constrained generation of the verdict lines before resampling everything.
    verdict_repair: bool = False
    repair_max_tokens: int = Field(160, ge=8)
    # Most distinct candidates sent in one prompt (GQM labels A-Z).
    max_group_size: int = Field(MAX_CANDIDATES, ge=2, le=MAX_CANDIDATES)
