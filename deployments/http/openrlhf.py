"""OpenRLHF's remote reward model: ``POST /openrlhf/get_reward?n=8`` takes OpenRLHF's payload unchanged.

OpenRLHF 0.11 (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor``) posts each sample on its own,
concurrently for the ``n_samples_per_prompt`` samples of a prompt, as
``{"query": [prompt + response], "prompts": [prompt], "labels": [label]}`` (the query decoded with its
special tokens), within 180 s, and reads ``rewards``, ``scores`` and ``extra_logs`` from the answer.
The payload has no group id and no ``n``: the group size comes from the URL's query (``?n=8``); the
source text and languages from the label, a JSON object (or a JSON string of one) with ``source``,
``src_lang`` and ``trg_lang`` (the languages may default to ``openrlhf.src_lang`` / ``trg_lang``).

The response is the query after its prompt, less a trailing end-of-turn token, read with
``openrlhf.extractor``. The samples of one prompt share a key (prompt, label and ``n``); on the
replica that owns the key they form groups of ``n`` in arrival order (``cluster/open_groups.py``),
each scored once as one GQM prompt. Every sample is answered within ``openrlhf.answer_within_s``
(below OpenRLHF's 180 s, after which it would send the sample again as a new one): with its reward,
or, when the reward could not be obtained, with ``openrlhf.default_reward`` flagged in ``extra_logs``
(``grrm_failed`` 1; the reason in the service's log, once per reason) -- OpenRLHF takes numbers only
(its samples generator makes a tensor of every ``extra_logs`` value), and a failed request would only
be re-sent into a new group. A payload it cannot read is a 422 naming the field.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, model_validator

from cluster.rewards import Completion, member_outcome, read_completion
from cluster.schema import DEFAULT_TENANT, MemberRequest
from deployments.client import ScorerClient
from deployments.config import AppConfig
from deployments.http.errors import HTTPProblem
from grrm_client.handle_send import UNANSWERED_ERRORS, unanswered_code

__all__ = ["END_OF_TURN", "OpenRLHFRequest", "OpenRLHFResponse", "openrlhf_rewards", "read_sample", "response_of"]

logger = logging.getLogger("ray.serve")

# Failure reasons this process has logged (each once).
_REPORTED: set[str] = set()

# End-of-turn tokens OpenRLHF's decoded query may end with (ChatML, Llama 3, Gemma, SentencePiece).
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "</s>", "<eos>")


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


@dataclass(frozen=True)
class Sample:
    """One sample as the service scores it."""

    key: str  # shared by the samples of one prompt (and label, and n)
    source: str
    src_lang: str
    trg_lang: str
    response: str


def response_of(query: str, prompt: str, field: str) -> str:
    """The response in a query: what follows the prompt, less one trailing end-of-turn token."""
    if not query.startswith(prompt):
        raise ValueError(f"{field}: the query does not start with its prompt (was the prompt decoded differently?)")
    response = query[len(prompt):].rstrip()
    for token in END_OF_TURN:
        if response.endswith(token):
            return response[: -len(token)]
    return response


def read_sample(query: str, prompt: str, label: Any, n: int, config: AppConfig, position: int) -> Sample:
    """One sample of a payload, or a ValueError naming the field at fault."""
    settings = config.openrlhf
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
    digest = hashlib.blake2b("\0".join((str(n), prompt, values["source"], values["src_lang"], values["trg_lang"]))
                             .encode(), digest_size=12).hexdigest()
    return Sample(key=f"openrlhf:{digest}", response=response_of(query, prompt, f"query[{position}]"), **values)


async def openrlhf_rewards(body: OpenRLHFRequest, n: int, client: ScorerClient, config: AppConfig,
                           tenant: str = DEFAULT_TENANT) -> OpenRLHFResponse:
    """Every sample's reward (see the module docstring). Every sample is read before any is sent,
    so a payload with one bad sample is refused whole and leaves nobody waiting on the service."""
    labels = body.labels if body.labels is not None else [None] * len(body.query)
    settings = config.openrlhf
    try:
        samples = [read_sample(query, prompt, label, n, config, position)
                   for position, (query, prompt, label) in enumerate(zip(body.query, body.prompts, labels, strict=True))]
        completions = [read_completion(sample.response, settings.extractor, config.limits.max_text_chars)
                       for sample in samples]
        members = [_member(sample, completion, n, position, tenant)
                   for position, (sample, completion) in enumerate(zip(samples, completions, strict=True))]
    except ValueError as problem:
        raise HTTPProblem("invalid_request", str(problem)) from None
    for position, sample in enumerate(samples):
        if len(sample.source) > config.limits.max_text_chars:
            raise HTTPProblem("too_large", f"labels[{position}].source: longer than limits.max_text_chars "
                                           f"({config.limits.max_text_chars})")
    failures = await asyncio.gather(*(_score(member, client, settings.answer_within_s) for member in members))
    outcomes = [
        member_outcome(extracted=completion.candidate is not None, score=score,
                       failure=completion.invalid_reason or failure, length=0, settings=settings.reward_settings())
        for completion, (score, failure) in zip(completions, failures, strict=True)
    ]
    for outcome in outcomes:
        if outcome.failed and outcome.failure not in _REPORTED:
            # Once per reason and ingress process: OpenRLHF's per-sample logs take numbers only.
            _REPORTED.add(outcome.failure)
            logger.warning("openrlhf: default reward %s for %s (logged once; counted in grrm_failed)",
                           settings.default_reward, outcome.failure)
    rewards = [outcome.reward for outcome in outcomes]
    return OpenRLHFResponse(rewards=rewards, scores=rewards, extra_logs={
        "grrm_valid": [float(outcome.valid) for outcome in outcomes],
        "grrm_default": [float(not outcome.valid and not outcome.failed) for outcome in outcomes],
        "grrm_failed": [float(outcome.failed) for outcome in outcomes],
    })


def _member(sample: Sample, completion: Completion, n: int, position: int, tenant: str) -> MemberRequest:
    """The member request of one sample (an id of its own), or a ValueError naming the field."""
    try:
        return MemberRequest(tenant=tenant, group_id=sample.key, group_size=n, member_id=uuid.uuid4().hex, source=sample.source,
                             candidate=completion.candidate or "", invalid=completion.candidate is None,
                             src_lang=sample.src_lang, trg_lang=sample.trg_lang, sent_at=time.time())
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "labels"
        raise ValueError(f"labels[{position}].{field}: {first['msg']}") from None


async def _score(member: MemberRequest, client: ScorerClient, within_s: float) -> tuple[int | None, str | None]:
    """(the member's score or None, why none): never raises, never waits past ``within_s``."""
    try:
        result = await asyncio.wait_for(client.score_open_member(member), within_s)
    except (asyncio.TimeoutError, TimeoutError):
        return None, "timeout"
    except UNANSWERED_ERRORS as error:
        return None, unanswered_code(error)
    return (result.score if result.valid else None), result.failure
