"""Builders of real verl structures for the bridge tests, and an in-process reward cluster.

* :func:`agent_loop_row` builds the one-row ``DataProto`` verl 0.9.1's agent loop hands to
  ``RewardLoopWorker.compute_score`` (``AgentLoopWorker._compute_score``: unpadded prompt and
  response, all-ones attention mask, the batch's non-tensor fields of that row plus
  ``__num_turns__``, ``tool_extra_fields``, ``prompt_len``, ``response_len``).
* :func:`padded_batch` builds the trainer's batch after generation (left-padded prompts,
  right-padded responses, attention and response masks, ``uid`` and ``priority``).
* :class:`LocalTransport` is the reward cluster without Ray: the real ``GroupAssembler``,
  ``GroupScorer`` and recipe runner (``cluster/recipe_runner.py``: a tenant's reward composed as a
  replica composes it) on the scripted engine, behind the bridge's transport interface.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl import DataProto

from cluster.assembly import AssemblySettings, GroupAssembler
from cluster.assembly_observers import RecentGroups
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions, make_engine
from cluster.recipe import RecipeSettings
from cluster.recipe_runner import RecipeRunner
from cluster.protocol.schema import DemandAccepted, DemandAnnouncement, GroupRequest, GroupResult, MemberRequest, MemberResult
from cluster.scorer import GroupScorer

SOURCE = "The cat sat on the mat."


def codeblock(text: str, thinking: str = "Let me think about it.") -> str:
    """A codeblock-think policy response whose translation is ``text``."""
    return f"{thinking}\n```\n{text}\n```"


def quality_text(group: int, rollout: int, quality: int) -> str:
    """A translation the scripted engine scores ``quality`` (its ``[q=N]`` marker)."""
    return f"Die Katze {group}-{rollout} sass auf der Matte [q={quality}]."


def _row_fields(uid: str, source: str, extra: dict[str, Any]) -> dict[str, Any]:
    """What every trainer's row carries: the group id and the dataset's own fields."""
    return {
        "uid": uid,
        "data_source": "wmt-test",
        "raw_prompt": [{"role": "user", "content": f"Translate into German: {source}"}],
        "reward_model": {"ground_truth": ""},
        "extra_info": {"source": source, "src_lang": "en", "trg_lang": "de", **extra},
    }


def row_fields(uid: str, priority: int, source: str = SOURCE, **extra: Any) -> dict[str, Any]:
    """The non-tensor fields of one row as verl's legacy agent loop carries them (``priority``)."""
    return {**_row_fields(uid, source, extra), "priority": priority, "agent_name": "single_turn_agent", "index": priority}


def session_row_fields(uid: str, session_id: int, source: str = SOURCE, **extra: Any) -> dict[str, Any]:
    """The non-tensor fields of one row as verl 0.9.1's default (v1) trainer hands it to a reward
    manager: the n sessions of a prompt share its ``uid`` and carry ``session_id`` 0..n-1; there is
    no ``priority`` (keys as measured on the real trainer, ``AgentLoopWorkerTQ._run_prompt``)."""
    fields = _row_fields(uid, source, extra)
    return {
        **fields,
        "session_id": session_id,
        "ability": "translation",
        "prompt": fields["raw_prompt"],
        "index": 0,
        "global_steps": 1,
        "dummy_tensor": 0,
        "interaction_kwargs": {},
        "tools_kwargs": {},
    }


def fully_async_row_fields(sample_id: str, dataset_index: int, source: str = SOURCE, **extra: Any) -> dict[str, Any]:
    """The non-tensor fields of one row as verl 0.9.1's fully_async_policy hands it to a reward
    manager: one dataset sample repeated n times (``detach_utils.prepare_single_generation_data``),
    ``uid`` = ``uid_{sample_id}`` the same in every run, ``index`` (the dataset row) equal for all n
    copies, and neither ``session_id`` nor ``priority``."""
    return {**_row_fields(f"uid_{sample_id}", source, extra), "index": dataset_index, "agent_name": "single_turn_agent"}


def encode_response(tokenizer: Any, response: str, eos: bool = True) -> list[int]:
    ids = tokenizer.encode(response, add_special_tokens=False)
    return ids + [tokenizer.eos_token_id] if eos else ids


def agent_loop_row(tokenizer: Any, response: str, fields: dict[str, Any], eos: bool = True) -> DataProto:
    """The DataProto verl's agent loop sends to a reward worker for one finished rollout."""
    prompt_ids = tokenizer.apply_chat_template(fields["raw_prompt"], tokenize=True, add_generation_prompt=True)
    if not isinstance(prompt_ids, list):  # transformers 5 may return a BatchEncoding
        prompt_ids = list(prompt_ids["input_ids"])
    response_ids = encode_response(tokenizer, response, eos)
    prompts = torch.tensor([prompt_ids], dtype=torch.int64)
    responses = torch.tensor([response_ids], dtype=torch.int64)
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.ones_like(input_ids)
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attention_mask,
            "input_ids": input_ids,
            "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0),
        },
        batch_size=1,
    )
    non_tensor = {key: _object_array([value]) for key, value in fields.items()}
    non_tensor.update(
        {
            "__num_turns__": np.array([2]),
            "tool_extra_fields": _object_array([{}]),
            "prompt_len": np.array([len(prompt_ids)]),
            "response_len": np.array([len(response_ids)]),
        }
    )
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def padded_batch(
    tokenizer: Any,
    responses: list[str],
    fields: list[dict[str, Any]],
    prompt_length: int = 48,
    response_length: int = 64,
    eos: bool = True,
) -> DataProto:
    """The trainer's batch after generation: left-padded prompts, right-padded responses."""
    pad = tokenizer.pad_token_id
    rows = []
    for response, row in zip(responses, fields, strict=True):
        prompt_ids = tokenizer.apply_chat_template(row["raw_prompt"], tokenize=True, add_generation_prompt=True)
        if not isinstance(prompt_ids, list):
            prompt_ids = list(prompt_ids["input_ids"])
        prompt_ids = prompt_ids[-prompt_length:]
        response_ids = encode_response(tokenizer, response, eos)[:response_length]
        rows.append((prompt_ids, response_ids))
    size = len(rows)
    prompts = torch.full((size, prompt_length), pad, dtype=torch.int64)
    responses_t = torch.full((size, response_length), pad, dtype=torch.int64)
    attention = torch.zeros((size, prompt_length + response_length), dtype=torch.int64)
    for i, (prompt_ids, response_ids) in enumerate(rows):
        if prompt_ids:
            prompts[i, -len(prompt_ids):] = torch.tensor(prompt_ids)
            attention[i, prompt_length - len(prompt_ids):prompt_length] = 1
        if response_ids:
            responses_t[i, : len(response_ids)] = torch.tensor(response_ids)
            attention[i, prompt_length : prompt_length + len(response_ids)] = 1
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses_t,
            "input_ids": torch.cat([prompts, responses_t], dim=1),
            "attention_mask": attention,
            "response_mask": attention[:, prompt_length:].clone(),
        },
        batch_size=size,
    )
    keys = fields[0].keys()
    non_tensor = {key: _object_array([row[key] for row in fields]) for key in keys}
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def _object_array(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def verl_config(n: int, model_path: str = "", reward_kwargs: dict | None = None, module_path: str | None = None,
                train_batch_size: int | None = None):
    """The slice of verl's trainer config a reward-loop worker and its manager read (a DictConfig)."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": model_path, "tokenizer_path": None},
                "rollout": {"n": n, "response_length": 256},
            },
            "data": {"max_response_length": 256, **({"train_batch_size": train_batch_size} if train_batch_size else {})},
            "reward": {
                "num_workers": 2,
                "custom_reward_function": {"path": None, "name": "compute_score"},
                "reward_model": {"enable": False, "enable_resource_pool": False},
                "reward_manager": {
                    "source": "importlib",
                    "name": "GRRMRewardManager",
                    "module": {"path": module_path or "pkg://trainer_bridge.reward_manager", "name": "custom_reward_manager"},
                },
                "reward_kwargs": dict(reward_kwargs or {}),
            },
        }
    )


def recipe(default_reward: float = -0.5, scale: float = 0.1, **parts: dict[str, Any]) -> RecipeSettings:
    """A service's recipe: a GQM score times ``scale``, ``default_reward``, and ``parts`` beside (the
    rewards are the recipe's, whatever the adapter's own settings say)."""
    return RecipeSettings.model_validate({"default_reward": default_reward,
                                          "parts": {"grrm": {"scale": scale}, **parts}})


@dataclass
class LocalTransport:
    """The reward cluster in this process: GroupAssembler + GroupScorer + scripted engine, every group
    through ``recipe`` (the default recipe: each reward its score) as a replica runs it.

    ``drop_first_answers``: lose the answer of the first k calls after the service handled
    them (a retry then reaches a replica that has already seen the member).
    """

    recipe: RecipeSettings = field(default_factory=RecipeSettings)
    scripted: ScriptedEngineOptions = field(default_factory=ScriptedEngineOptions)
    scoring: ScoringConfig = field(default_factory=lambda: ScoringConfig(retries=1))
    assembly_timeout_s: float = 10.0
    drop_first_answers: int = 0
    calls: int = 0

    def __post_init__(self) -> None:
        self.engine = make_engine(EngineConfig(kind="scripted", scripted=self.scripted))
        self.scorer = GroupScorer(self.engine, self.scoring, replica="local-replica")
        self.rewards = RecipeRunner(lambda tenant: self.recipe, replica="local-replica")
        self.assembler: GroupAssembler | None = None
        self.recent = RecentGroups()  # the groups the assembler scored
        self.group_requests: list[GroupRequest] = []
        self.announcements: list[DemandAnnouncement] = []

    async def _ready(self) -> GroupAssembler:
        if self.assembler is None:
            await self.engine.start()
            self.assembler = GroupAssembler(
                self.scorer, AssemblySettings(assembly_timeout_s=self.assembly_timeout_s, replica="local-replica"),
                rewards=self.rewards, observers=(self.recent,))
        return self.assembler

    async def member(self, member: MemberRequest, timeout_s: float, attempt: int = 0, attempts_left: int = 1) -> MemberResult:
        from cluster.protocol.calls import RetryableError

        assembler = await self._ready()
        self.calls += 1
        result = await assembler.submit(member)
        if self.drop_first_answers > 0:
            self.drop_first_answers -= 1
            raise RetryableError("unavailable", "answer lost on the way back (simulated)")
        return result

    async def group(self, group: GroupRequest, timeout_s: float, attempt: int = 0, attempts_left: int = 1) -> GroupResult:
        await self._ready()
        self.calls += 1
        self.group_requests.append(group)
        return (await self.rewards.run(group, self.scorer)).group_result(group)

    async def announce(self, announcement: DemandAnnouncement, timeout_s: float) -> DemandAccepted:
        self.announcements.append(announcement)
        return DemandAccepted(replica="local-replica", tenant=announcement.tenant, groups=announcement.groups)

    async def aclose(self) -> None:
        return None


def shuffled(items: list, seed: int) -> list:
    copy = list(items)
    random.Random(seed).shuffle(copy)
    return copy
