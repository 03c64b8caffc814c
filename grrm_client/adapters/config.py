"""What every trainer adapter of the client reads: where a row keeps its source, languages, reference
and notes, how a completion's translation is extracted, and the default reward of a rollout that got no
answer (the reward itself is the service's recipe's: ``grrm_client/adapters/pipeline.py``).

Every adapter's settings extend it: TRL's (:mod:`grrm_client.adapters.trl`), slime's
(:mod:`grrm_client.adapters.slime`) and verl's (:class:`grrm_client.adapters.verl.config.BridgeConfig`,
read from verl's config, with verl's row keys as defaults).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from cluster.gqm import DEFAULT_EXTRACTOR, Extractor
from cluster.protocol.members import ROW_KEYS
from cluster.rewards import RewardSettings
from cluster.protocol.schema import DEFAULT_MAX_TEXT_CHARS
from grrm_client.config import ClientConfig

__all__ = ["AdapterConfig"]

# The adapters' own rewards' defaults (cluster/rewards.py declares them).
_REWARDS = RewardSettings()


class AdapterConfig(ClientConfig):
    """The client's settings, plus how a trainer's rows are read and rewarded."""

    extractor: Extractor = Field(DEFAULT_EXTRACTOR, description="How the translation is read from a completion "
                                                                "(the spec's extractors: codeblock, line, oneline, "
                                                                "none).")
    source_key: str = Field(ROW_KEYS.source_key, description="Where a row keeps its source text.")
    src_lang_key: str = Field(ROW_KEYS.src_lang_key, description="Where a row keeps its source language.")
    trg_lang_key: str = Field(ROW_KEYS.trg_lang_key, description="Where a row keeps its target language.")
    src_lang: str | None = Field(None, description="Source language of rows that carry none (None: required).")
    trg_lang: str | None = Field(None, description="Target language of rows that carry none (None: required).")
    ref_text_key: str = Field(ROW_KEYS.ref_text_key, description="Where a row may keep a reference translation (sent with "
                                                      "ref_lang; a row without one sends none).")
    ref_lang_key: str = Field(ROW_KEYS.ref_lang_key, description="Where a row may keep its reference's language.")
    notes_key: str = Field(ROW_KEYS.notes_key, description="Where a row may keep notes for the model (terminology, style).")
    default_reward: float = Field(
        _REWARDS.default_reward,
        description="Reward of a rollout that got no answer (the service unreachable, the deadline passed), "
                    "flagged; an answer's reward is its recipe's.")
    score_scale_factor: float = Field(
        _REWARDS.score_scale_factor,
        description="Reward = GRRM score x this factor, only for answers of a service without a recipe (the "
                    "recipe's grrm part scales otherwise).")
    # The service refuses texts over its limits.max_text_chars; counting such translations as invalid keeps
    # the rest of the group from waiting.
    max_text_chars: int = Field(
        DEFAULT_MAX_TEXT_CHARS, ge=1,
        description="Longer translations, in characters, are not sent; they count as invalid.")
    # Two runs (or a resumed run) sharing one service never meet in one group.
    run_id: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.\-]*$",
        description="Namespace of this run's group ids: the service sees `{run_id}:...`. None: a new one per run "
                    "(verl: derived from the Ray job running the trainer, grrm_client/adapters/verl/run_identity.py); "
                    "empty: the trainer's own group ids as they are, for an adapter whose ids are unique across runs "
                    "(verl's uid).")
    # Whether this adapter's group ids are unique across runs without a namespace (an empty run_id).
    ids_unique_across_runs: ClassVar[bool] = False

    @model_validator(mode="after")
    def _namespaced(self) -> AdapterConfig:
        if self.run_id == "" and not self.ids_unique_across_runs:
            raise ValueError(f"run_id: empty keeps the trainer's group ids as they are, which {type(self).__name__}'s "
                             "are not unique across runs: give a name, or None for a new one per run")
        return self

    def reward_settings(self) -> RewardSettings:
        """The settings of the rewards the adapter gives itself: the default where no answer came (and the
        arithmetic of ``cluster/rewards.py`` for a service without a recipe; no overlong penalty, which is
        the recipe's ``overlong`` part)."""
        return RewardSettings(default_reward=self.default_reward, score_scale_factor=self.score_scale_factor)
