"""Typed scoring settings: how a group becomes a GQM prompt, a generation and a verdict."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.gqm import MAX_CANDIDATES, PromptType
from cluster.prompt_guard import GuardMode


class ScoringConfig(BaseModel):
    """GRRM's recipe by default: greedy first attempt, retries sampled at temperature 1.0."""

    model_config = ConfigDict(extra="forbid")

    prompt_type: PromptType = "ranking_score"
    add_example: bool = False
    # A source or candidate that could change the prompt's structure (a code fence, a special
    # token of the tokenizer; cluster/prompt_guard.py) is neutralized (a space breaks the
    # sequence), or its group refused ("reject"), or pasted as is ("off": trusted texts only).
    prompt_guard: GuardMode = "neutralize"
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
    # Most distinct candidates sent in one prompt (GQM labels A-Z). Larger groups are split
    # (split_large_groups) or refused ("rejected").
    max_group_size: int = Field(MAX_CANDIDATES, ge=2, le=MAX_CANDIDATES)
    # Large groups (cluster/ensemble.py): above max_group_size, score overlapping subgroups that
    # share `split_anchors` candidates (at most subgroup size - 1), all on this replica so the
    # source prefix is cached, and merge them with a Bradley-Terry fit into one score vector.
    split_large_groups: bool = True
    # Size of each subgroup; None = max_group_size. Subgroups are balanced, never larger.
    split_subgroup_size: int | None = Field(None, ge=2, le=MAX_CANDIDATES)
    split_anchors: int = Field(2, ge=1, le=MAX_CANDIDATES - 1)
    # Position-bias ensemble: score every (sub)group in this many candidate orders and merge
    # them (1 = off). `antithetic`: the order, its reverse, random orders each with its reverse.
    permutations: int = Field(1, ge=1, le=16)
    permutation_design: Literal["antithetic", "random"] = "antithetic"
    # The merge's soft Bradley-Terry outcomes: a score difference of `merge_temperature` points
    # is one logit of win probability (0 = hard win/tie/loss outcomes, classical BT).
    merge_temperature: float = Field(2.0, ge=0)
    # Gaussian prior on the Bradley-Terry strengths (keeps them finite; small = data decides).
    merge_prior: float = Field(1e-4, gt=0)
    # A group whose plan needs more prompts than this is refused ("rejected"), so one request
    # cannot fan out into an unbounded number of generations.
    max_prompts_per_group: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _subgroups_fit(self) -> ScoringConfig:
        if self.split_subgroup_size is not None and self.split_subgroup_size > self.max_group_size:
            raise ValueError(
                f"split_subgroup_size: {self.split_subgroup_size} exceeds max_group_size {self.max_group_size}"
            )
        return self
