"""OpenRLHF's remote reward model: its request mapped onto GRRM members, their answers onto its response.

OpenRLHF 0.11 (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor``) posts each sample on its own,
concurrently for the ``n_samples_per_prompt`` samples of a prompt, as
``{"query": [prompt + response], "prompts": [prompt], "labels": [label]}`` (the query decoded with its
special tokens), within 180 s, and reads ``rewards``, ``scores`` and ``extra_logs`` from the answer.
The payload has no group id and no ``n``: the group size comes from the URL's query (``?n=8``); the
source text and languages from the label, a JSON object (or a JSON string of one) with ``source``,
``src_lang`` and ``trg_lang`` (the languages may default to ``openrlhf.src_lang`` / ``trg_lang``), and
optionally a reference (``ref_text`` with ``ref_lang``) and ``notes`` (``openrlhf.*_key`` name other
keys). The payload carries no token counts: the recipe's ``overlong`` part penalises no OpenRLHF
sample (OpenRLHF's own DAPO buffer, ``overlong_buffer_len``, applies one in the trainer).

The response is the query after its prompt, less a trailing end-of-turn token, read with
``openrlhf.extractor``. The samples of one prompt share a key (prompt, label and ``n``), the group id
of their members; each member has an id of its own (the service forms groups of ``n`` in arrival
order, ``cluster/open_groups.py``). OpenRLHF takes numbers only (its samples generator makes a tensor
of every ``extra_logs`` value, and every sample of a batch must carry the same keys): a reward that
got no answer is ``openrlhf.default_reward`` flagged in ``extra_logs`` (``grrm_failed`` 1); otherwise
it is the service recipe's (``docs/recipes.md``), and each part the route names (its tenant's recipe)
is the sample's ``grrm/component/<name>/mean`` (0 where its answer lacks it: OpenRLHF averages each
key over the batch).

The service answers it at ``POST /openrlhf/get_reward`` (``deployments/http/openrlhf.py`` sends the
members and bounds the wait); this module is the mapping, through :mod:`cluster.protocol.members`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, model_validator

from cluster.gqm import DEFAULT_EXTRACTOR, Extractor
from cluster.rewards import Completion, RewardOutcome, RewardSettings, read_completion
from cluster.protocol.schema import MemberRequest, MemberResult
from cluster.protocol.members import COMPONENT_PREFIX, ROW_KEYS, RowContext, components_of, member_request, member_reward

__all__ = ["END_OF_TURN", "OpenRLHFRequest", "OpenRLHFResponse", "OpenRLHFSettings", "PayloadError", "Sample",
           "read_payload", "read_sample", "response_of", "rewards_response"]

# End-of-turn tokens OpenRLHF's decoded query may end with (ChatML, Llama 3, Gemma, SentencePiece).
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "</s>", "<eos>")


# The adapters' own rewards' defaults (cluster/rewards.py declares them); the keys a row keeps its context
# under are ROW_KEYS (cluster/protocol/members.py), as the adapters' are.
_REWARDS = RewardSettings()


class OpenRLHFSettings(BaseModel):
    """``POST /openrlhf/get_reward``: OpenRLHF's remote reward model (``--reward.remote_url``)."""

    model_config = ConfigDict(extra="forbid")

    extractor: Extractor = Field(DEFAULT_EXTRACTOR, description="How the translation is read from the response "
                                                                "(the query after its prompt).")
    src_lang: str | None = Field(None, description="Source language when a sample's label names none.")
    trg_lang: str | None = Field(None, description="Target language when a sample's label names none.")
    ref_text_key: str = Field(
        ROW_KEYS.ref_text_key,
        description="The label's key of a reference translation (optional; with ref_lang).")
    ref_lang_key: str = Field(
        ROW_KEYS.ref_lang_key,
        description="The label's key of the reference's language (optional).")
    notes_key: str = Field(
        ROW_KEYS.notes_key,
        description="The label's key of notes for the model (optional).")
    default_reward: float = Field(
        _REWARDS.default_reward,
        description="Reward (flagged) of a sample that got no answer in time; an answer's reward is the tenant "
                    "recipe's.")
    score_scale_factor: float = Field(
        _REWARDS.score_scale_factor,
        description="Reward = GRRM score x this factor, only for answers without a recipe's reward.")
    # OpenRLHF gives up on a request after 180 s and sends it again as a new sample, which would
    # join a new group: answer (with the flagged default if need be) before that.
    answer_within_s: float = Field(170.0, gt=0, description="Every sample is answered within this many "
                                                            "seconds (OpenRLHF's client waits 180 s).")

    def reward_settings(self) -> RewardSettings:
        """The reward arithmetic's settings (``cluster/rewards.py``)."""
        return RewardSettings(default_reward=self.default_reward, score_scale_factor=self.score_scale_factor)


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's reward request: one entry per sample in each list (keys it may add are ignored)."""

    model_config = ConfigDict(extra="ignore")

    query: list[StrictStr] = Field(min_length=1, max_length=1024,
                                   description="Each sample's prompt and response, decoded with special tokens.")
    prompts: list[StrictStr] = Field(description="Each sample's prompt.")
    labels: list[Any] | None = Field(None, description="Each sample's label: a JSON object (or a JSON string "
                                                       "of one) with source, src_lang and trg_lang.")

    @model_validator(mode="after")
    def _aligned(self) -> OpenRLHFRequest:
        if len(self.prompts) != len(self.query):
            raise ValueError(f"prompts: {len(self.prompts)} prompts for {len(self.query)} queries")
        if self.labels is not None and len(self.labels) != len(self.query):
            raise ValueError(f"labels: {len(self.labels)} labels for {len(self.query)} queries")
        return self


class OpenRLHFResponse(BaseModel):
    """What OpenRLHF reads: one reward and score per sample, and per-sample values it logs."""

    rewards: list[float]
    scores: list[float]
    # OpenRLHF turns each value into a tensor (samples_generator.py): numbers only.
    extra_logs: dict[str, list[float]]


class PayloadError(ValueError):
    """A payload that cannot be scored, with the message naming the field at fault; ``kind`` is the
    failure kind the service answers it with (``cluster/failures.py``)."""

    def __init__(self, message: str, kind: Literal["invalid_request", "too_large"] = "invalid_request"):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Sample:
    """One sample as the service scores it."""

    key: str  # shared by the samples of one prompt (and label, and n)
    source: str
    src_lang: str
    trg_lang: str
    response: str
    context: RowContext = RowContext()  # the label's reference and notes


def response_of(query: str, prompt: str, field: str) -> str:
    """The response in a query: what follows the prompt, less one trailing end-of-turn token."""
    if not query.startswith(prompt):
        raise ValueError(f"{field}: the query does not start with its prompt (was the prompt decoded differently?)")
    response = query[len(prompt):].rstrip()
    for token in END_OF_TURN:
        if response.endswith(token):
            return response[: -len(token)]
    return response


def read_sample(query: str, prompt: str, label: Any, n: int, settings: OpenRLHFSettings, position: int) -> Sample:
    """One sample of a payload, or a ValueError naming the field at fault."""
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except ValueError:
            label = None
    if not isinstance(label, dict):
        raise ValueError(f"labels[{position}]: expected a JSON object with source, src_lang and trg_lang")
    values = {}
    for name, default in (("source", None), ("src_lang", settings.src_lang), ("trg_lang", settings.trg_lang)):
        value = label.get(name, default)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"labels[{position}].{name}: required (a non-empty string)")
        values[name] = value
    context = RowContext.of(*(label.get(key) for key in (settings.ref_text_key, settings.ref_lang_key,
                                                          settings.notes_key)))
    digest = hashlib.blake2b("\0".join((str(n), prompt, values["source"], values["src_lang"], values["trg_lang"],
                                        *(value or "" for value in (context.ref_text, context.ref_lang, context.notes))))
                             .encode(), digest_size=12).hexdigest()
    return Sample(key=f"openrlhf:{digest}", response=response_of(query, prompt, f"query[{position}]"),
                  context=context, **values)


def read_payload(body: OpenRLHFRequest, n: int, settings: OpenRLHFSettings, max_text_chars: int,
                 tenant: str | None = None) -> list[tuple[MemberRequest, Completion]]:
    """Every sample's member request and completion, or a :class:`PayloadError` naming the field at
    fault. Every sample is read before any is sent, so a payload with one bad sample is refused whole
    and leaves nobody waiting on the service."""
    labels = body.labels if body.labels is not None else [None] * len(body.query)
    try:
        samples = [read_sample(query, prompt, label, n, settings, position)
                   for position, (query, prompt, label) in enumerate(zip(body.query, body.prompts, labels, strict=True))]
        completions = [read_completion(sample.response, settings.extractor, max_text_chars) for sample in samples]
        members = [_member(sample, completion, n, position, tenant)
                   for position, (sample, completion) in enumerate(zip(samples, completions, strict=True))]
    except ValueError as problem:
        raise PayloadError(str(problem)) from None
    for position, sample in enumerate(samples):
        if len(sample.source) > max_text_chars:
            raise PayloadError(f"labels[{position}].source: longer than limits.max_text_chars ({max_text_chars})",
                               "too_large")
    return list(zip(members, completions, strict=True))


def _member(sample: Sample, completion: Completion, n: int, position: int, tenant: str | None) -> MemberRequest:
    """The member request of one sample (an id of its own), or a ValueError naming the field."""
    try:
        return member_request(completion, group_id=sample.key, group_size=n, source=sample.source,
                              src_lang=sample.src_lang, trg_lang=sample.trg_lang, tenant=tenant, sent_at=time.time(),
                              context=sample.context)
    except ValidationError as error:
        first = error.errors()[0]
        # A problem of the whole request (a half reference pair) names its field in the message.
        field = "".join(f".{part}" for part in first["loc"])
        raise ValueError(f"labels[{position}]{field}: {first['msg']}") from None


def rewards_response(
    completions: Sequence[Completion],
    answers: Sequence[tuple[MemberResult | None, str | None]],
    settings: OpenRLHFSettings,
    parts: Sequence[str] = (),
) -> tuple[OpenRLHFResponse, list[RewardOutcome]]:
    """OpenRLHF's response from each sample's answer (the service's result, or why none came), and the
    outcomes behind it (for the caller's once-per-reason log). ``parts``: the recipe's part names, each
    logged for every sample (OpenRLHF needs the same keys on every sample of a batch)."""
    reward_settings = settings.reward_settings()
    outcomes = [member_reward(completion, result, failure, reward_settings)
                for completion, (result, failure) in zip(completions, answers, strict=True)]
    rewards = [outcome.reward for outcome in outcomes]
    response = OpenRLHFResponse(rewards=rewards, scores=rewards, extra_logs={
        "grrm_valid": [float(outcome.valid) for outcome in outcomes],
        "grrm_default": [float(not outcome.valid and not outcome.failed) for outcome in outcomes],
        "grrm_failed": [float(outcome.failed) for outcome in outcomes],
        **{f"{COMPONENT_PREFIX}/{name}/mean": [float(components_of(outcome).get(name, 0.0)) for outcome in outcomes]
           for name in parts},
    })
    return response, outcomes
