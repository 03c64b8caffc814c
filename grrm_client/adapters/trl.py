"""GRRM rewards for TRL's ``GRPOTrainer`` (and ``trl.experimental``'s async GRPO trainer).

A TRL user's whole change is the import and one argument::

    from grrm_client.adapters.trl import GRRMReward

    trainer = GRPOTrainer(
        model=...,
        reward_funcs=GRRMReward(url="http://grrm-head:8000", num_generations=8),
        args=GRPOConfig(num_generations=8, ...),
        train_dataset=dataset,  # columns: prompt, source, src_lang, trg_lang (ref_text, ref_lang, notes)
    )

TRL (1.16, ``GRPOTrainer._calculate_rewards``) calls a reward function with keyword arguments:
``prompts``, ``completions``, ``completion_ids``, every other dataset column (one value per
completion), ``trainer_state``, ``log_extra`` and ``log_metric``; it awaits an async callable on
its own event loop and takes one float, or ``None`` (masked as NaN), per completion.

How a call becomes groups. The ``num_generations`` completions of one prompt are consecutive in
TRL's global batch, and each process scores only its own equal slice, so with several processes a
group can straddle two of them. A process's slice starts at ``process_index * len(completions)``;
a group wholly in the slice is one whole-group request, and the members of a straddling group are
sent one by one on the member path, under a group id every process computes alike
(``{run_id}:{call}:{group}``), so the service joins them. ``run_id`` is shared by the processes of
one training run (rank 0's, broadcast over ``torch.distributed`` at the first call) and new in every
run; ``call`` counts the calls, which every process makes in the same order. A call without
``trainer_state`` is the async trainer's rollout worker, which calls once per complete group in a
child process (this object pickles): its groups get ids of their own.

Each step's call also announces the step's groups to the service's autoscaling, and from the
second step on the next step ahead of it (``grrm_client/demand.py``; ``announce_demand=False`` turns
it off).

A row's reference and notes (the dataset's ``ref_text``, ``ref_lang`` and ``notes`` columns, or the
``*_key`` settings' names; a row without them sends none) go with its group, and each completion's
length in tokens (``completion_ids``) for the recipe's ``overlong`` part. The reward is the one the
service's recipe composed (``docs/recipes.md``); a reward that got no answer (the service unreachable
past the deadline, a request it refused) is ``None``, never a made-up number. Counters go to TRL's
logs through ``log_metric``: ``grrm/valid``, ``grrm/default``, ``grrm/failed`` and
``grrm/failed/<reason>``, ``grrm/retries``, ``grrm/rejoins``, and each recipe part as
``grrm/component/<name>/mean`` (the part's mean over the step's completions, one lacking it counting
0: TRL averages the values a step logs). Wrong settings or a dataset without the source column raise
a ``ValueError`` naming them (at construction, or at the first call).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field, model_validator

from cluster.rewards import RewardOutcome, read_completion
from cluster.protocol.members import COMPONENT_PREFIX, FailureLog, RowContext, components_of, from_recipe
from grrm_client.adapters import AdapterConfig
from grrm_client.demand import DemandAnnouncer, DemandSettings
from grrm_client.adapters.pipeline import reward_group, reward_member
from grrm_client.reward_client import RewardClient

__all__ = ["GRRMReward", "TRLRewardConfig", "completion_text", "slice_groups"]

logger = logging.getLogger(__name__)


class TRLRewardConfig(AdapterConfig, DemandSettings):
    """The TRL adapter's settings: the client's, how to read a batch, and TRL's layout."""

    num_generations: int = Field(ge=1, le=1024, description="TRL's num_generations: completions per prompt.")
    process_index: int | None = Field(None, ge=0, description="This process's rank (None: torch.distributed's, "
                                                               "else $RANK, else 0).")
    num_processes: int | None = Field(None, ge=1, description="Processes of the run (None: torch.distributed's, "
                                                               "else $WORLD_SIZE, else 1).")

    @model_validator(mode="after")
    def _rank_in_range(self) -> TRLRewardConfig:
        if self.process_index is not None and self.num_processes is not None and self.process_index >= self.num_processes:
            raise ValueError(f"process_index: {self.process_index} is not below num_processes {self.num_processes}")
        return self


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string as it is; a conversational one (a list of messages) as its
    last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # content blocks: the text parts
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return str(content)
    raise ValueError(f"completions: expected a string or a list of messages, got {type(completion).__name__}")


def slice_groups(offset: int, count: int, group_size: int) -> dict[int, list[tuple[int, int]]]:
    """The groups a process's slice touches: global group number -> [(position in the slice, index in
    the group)], for the slice's ``count`` completions starting at global position ``offset``."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for local in range(count):
        group, index = divmod(offset + local, group_size)
        groups.setdefault(group, []).append((local, index))
    return groups


class GRRMReward:
    """A TRL reward function that scores each group of completions with GRRM (see the module docstring)."""

    def __init__(self, url: str | None = None, app_name: str | None = None, *, num_generations: int,
                 **settings: Any) -> None:
        """``url``: the service's base URL (HTTP; a Serve route prefix included), or ``app_name``: the
        Serve application on this Ray cluster (a handle). Other settings: :class:`TRLRewardConfig`."""
        if (url is None) == (app_name is None):
            raise ValueError("GRRMReward: give exactly one of url= (HTTP) or app_name= (a Ray Serve handle)")
        where = {"transport": "http", "http_url": url.rstrip("/")} if url is not None else {
            "transport": "handle", "app_name": app_name}
        self.config = TRLRewardConfig(num_generations=num_generations, **where, **settings)
        self.settings = self.config.reward_settings()
        self.__name__ = "grrm"  # TRL logs a reward function's mean under rewards/<its name>/
        self._client: RewardClient | None = None
        self._demand: DemandAnnouncer | None = None
        self._run_id = self.config.run_id
        self._calls = 0
        self._reported_retries = 0
        self._reported_rejoins = 0
        self._failures = FailureLog()  # reasons already logged by this object

    def __getstate__(self) -> dict[str, Any]:
        # The async trainer pickles reward functions into its rollout worker: a client (its HTTP
        # connections, a Serve handle) belongs to one process and one event loop, and is made anew.
        state = dict(self.__dict__)
        state["_client"] = None
        state["_demand"] = None
        return state

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
                       **columns: Any) -> list[float | None]:
        """One reward per completion (``None``: it could not be obtained)."""
        trainer_state = columns.pop("trainer_state", None)
        log_metric: Callable[[str, float], None] | None = columns.pop("log_metric", None)
        log_extra: Callable[[str, list[Any]], None] | None = columns.pop("log_extra", None)
        count = len(completions)
        if len(prompts) != count:
            raise ValueError(f"prompts: {len(prompts)} prompts for {count} completions")
        sources = self._column(columns, self.config.source_key, None, count)
        src_langs = self._column(columns, self.config.src_lang_key, self.config.src_lang, count)
        trg_langs = self._column(columns, self.config.trg_lang_key, self.config.trg_lang, count)
        contexts = [RowContext.of(*values) for values in zip(
            *(self._optional_column(columns, key, count)
              for key in (self.config.ref_text_key, self.config.ref_lang_key, self.config.notes_key)), strict=True)]
        lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [0] * count
        read = [read_completion(completion_text(c), self.config.extractor, self.config.max_text_chars, length)
                for c, length in zip(completions, lengths, strict=True)]
        size = self.config.num_generations
        if trainer_state is None:
            # The async trainer's rollout worker: whole groups, no other process shares them.
            if count % size:
                raise ValueError(f"completions: {count} completions are not whole groups of num_generations={size}")
            offset, call = 0, uuid.uuid4().hex[:12]
        else:
            offset, call = self._process()[0] * count, str(self._calls)
            self._calls += 1
        run_id = self._shared_run_id()
        client = self._client_now()
        # A step of the GRPO trainer (not the async trainer's per-group calls): a generation phase.
        demand = self._demand_now(client, count) if trainer_state is not None else None
        if demand is not None:
            demand.requested(time.time(), group_size=1)  # the step's groups, whole, now
        outcomes: list[RewardOutcome | None] = [None] * count

        async def one(group: int, members: list[tuple[int, int]]) -> None:
            first = members[0][0]
            where = dict(group_id=f"{run_id}:{call}:{group}", source=sources[first], src_lang=src_langs[first],
                         trg_lang=trg_langs[first], context=contexts[first])
            for local, _ in members:
                if (sources[local], src_langs[local], trg_langs[local], contexts[local]) != (
                        where["source"], where["src_lang"], where["trg_lang"], where["context"]):
                    raise ValueError(f"{self.config.source_key}: the completions of group {group} disagree on their "
                                     "source, languages, reference or notes (is num_generations TRL's?)")
            if len(members) == size:
                scored = await reward_group(client, completions=[read[local] for local, _ in members],
                                            settings=self.settings, **where)
                for (local, _), outcome in zip(members, scored.outcomes, strict=True):
                    outcomes[local] = outcome
                return
            answers = await asyncio.gather(*(
                reward_member(client, group_size=size, index=index, completion=read[local], settings=self.settings,
                              **where)
                for local, index in members))
            for (local, _), (outcome, _) in zip(members, answers, strict=True):
                outcomes[local] = outcome

        await asyncio.gather(*(one(group, members) for group, members in slice_groups(offset, count, size).items()))
        if demand is not None:
            demand.requested(time.time(), counts=False)  # the phase lasts until its rewards are in
        done = [outcome for outcome in outcomes if outcome is not None]
        self._log(done, log_metric, log_extra)
        # The service's reward stands (its recipe's default included); None only where no answer came.
        return [outcome.reward if from_recipe(outcome) or not outcome.failed else None for outcome in done]

    def _column(self, columns: dict[str, Any], key: str, default: str | None, count: int) -> list[str]:
        values = columns.get(key)
        if values is None:
            if default is None:
                raise ValueError(f"{key}: the dataset has no such column (columns: {sorted(columns)}); set "
                                 f"{'source_key' if key == self.config.source_key else 'the *_key options'} or a "
                                 "default language")
            return [default] * count
        if len(values) != count:
            raise ValueError(f"{key}: {len(values)} values for {count} completions")
        return [str(value) for value in values]

    @staticmethod
    def _optional_column(columns: dict[str, Any], key: str, count: int) -> list[Any]:
        """A column rows may lack (a reference, notes): its values, or None for every completion."""
        values = columns.get(key)
        if values is None:
            return [None] * count
        if len(values) != count:
            raise ValueError(f"{key}: {len(values)} values for {count} completions")
        return list(values)

    def _process(self) -> tuple[int, int]:
        """(this process's rank, the run's processes)."""
        index, count = self.config.process_index, self.config.num_processes
        if index is None or count is None:
            distributed = _distributed()
            if distributed is not None:
                index = distributed.get_rank() if index is None else index
                count = distributed.get_world_size() if count is None else count
            else:
                index = int(os.environ.get("RANK", "0")) if index is None else index
                count = int(os.environ.get("WORLD_SIZE", "1")) if count is None else count
        return index, count

    def _shared_run_id(self) -> str:
        """This run's namespace: the configured one, else rank 0's new one, the same in every process."""
        if self._run_id is not None:
            return self._run_id
        run_id = f"trl-{uuid.uuid4().hex[:12]}"
        if self._process()[1] > 1:
            distributed = _distributed()
            if distributed is None:
                raise ValueError("run_id: required when several processes share groups without torch.distributed")
            box = [run_id]
            backend = distributed.get_backend()
            device = None
            if backend == "nccl":  # NCCL sends objects through this rank's GPU
                import torch

                device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            distributed.broadcast_object_list(box, src=0, device=device)
            run_id = box[0]
        self._run_id = run_id
        return run_id

    def _client_now(self) -> RewardClient:
        # Made in the process and on the event loop that use it (TRL's loop thread, the rollout worker's).
        if self._client is None:
            self._client = RewardClient(self.config)
        return self._client

    def _demand_now(self, client: RewardClient, count: int) -> DemandAnnouncer | None:
        """The announcer of this run's steps: the whole step's groups (every process's slice), or None."""
        if not self.config.announce_demand:
            return None
        if self._demand is None:
            groups = count * self._process()[1] // self.config.num_generations
            self._demand = DemandAnnouncer(client.announce_demand, max(1, groups), gap_s=self.config.phase_gap_s)
        return self._demand

    def _log(self, outcomes: list[RewardOutcome], log_metric: Callable[[str, float], None] | None,
             log_extra: Callable[[str, list[Any]], None] | None) -> None:
        for outcome in outcomes:
            if self._failures.first(outcome):  # every one is counted in grrm/failed/<reason>
                given = f"the recipe's default {outcome.reward}" if from_recipe(outcome) else "no reward (None)"
                logger.warning("grrm: %s for %s; logged once, counted in grrm/failed/%s",
                               given, outcome.failure, outcome.failure)
        if log_extra is not None:
            log_extra("grrm_failure", [outcome.failure or "" for outcome in outcomes])
        if log_metric is None:
            return
        failed = Counter(outcome.failure for outcome in outcomes if outcome.failed)
        log_metric("grrm/valid", float(sum(outcome.valid for outcome in outcomes)))
        log_metric("grrm/default", float(sum(not outcome.valid and not outcome.failed for outcome in outcomes)))
        log_metric("grrm/failed", float(sum(failed.values())))
        for reason, times in failed.items():
            log_metric(f"grrm/failed/{reason}", float(times))
        # One value per completion: TRL averages a step's values of a name over every process.
        parts = [components_of(outcome) for outcome in outcomes]
        for name in sorted({name for row in parts for name in row}):
            for row in parts:
                log_metric(f"{COMPONENT_PREFIX}/{name}/mean", float(row.get(name, 0.0)))
        client = self._client
        if client is not None:
            log_metric("grrm/retries", float(client.loop.retries - self._reported_retries))
            log_metric("grrm/rejoins", float(client.loop.rejoins - self._reported_rejoins))
            self._reported_retries, self._reported_rejoins = client.loop.retries, client.loop.rejoins


def _distributed() -> Any:
    """``torch.distributed`` when this process is part of an initialized process group, else None."""
    try:
        import torch.distributed as distributed
    except ImportError:
        return None
    return distributed if distributed.is_available() and distributed.is_initialized() else None
