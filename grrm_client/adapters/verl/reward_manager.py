"""verl's reward-loop manager for GRRM: one rollout in, one reward out, scored as a group.

verl 0.9.1 asks for a reward per rollout as soon as that rollout finishes, from a randomly
chosen reward-loop worker (``RewardLoopWorker.compute_score`` -> ``manager.run_single(data)``).
GRRM needs the whole group in one prompt, so :meth:`GRRMRewardManager.run_single` sends the
rollout as a *member* of its group (``group_id`` = verl's ``uid`` in this training run's namespace,
see :mod:`grrm_client.adapters.verl.run_identity`; ``group_size`` = rollout n; ``index`` = the rollout's
position, or a ``member_id`` of its own when the trainer gives none, see
:mod:`grrm_client.adapters.verl.rollout`); the cluster's router
brings all members of a group to one replica, which scores the group once its last member has
arrived and answers every member. Scoring of early groups therefore overlaps the generation of
later rollouts.

Each member carries the row's reference and notes, when it has them, and the rollout's response
length in tokens (the recipe's ``overlong`` part). Its reward is the one the service's recipe
composed (``docs/recipes.md``), with each part in ``reward_extra_info["components"]`` and the step's
``grrm/component/<name>/mean`` (:mod:`grrm_client.adapters.verl.metrics`); the manager's own
``default_reward`` is for a rollout that got no answer.

A rollout whose translation cannot be extracted is still sent, marked ``invalid``: it completes
its group without being shown to the model, so the other members never wait for a rollout that
has nothing to show. The service gives it the recipe's default reward.

Select it in verl with::

    reward.reward_manager.source=importlib
    reward.reward_manager.module.path=pkg://trainer_bridge.reward_manager
    reward.reward_manager.name=GRRMRewardManager

(a file path to this module works too). Its settings come from ``reward.reward_kwargs``
(:class:`grrm_client.adapters.verl.config.BridgeConfig`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, register

from cluster.rewards import BAD_ROW, INTERNAL_ERROR, TOO_FEW_DISTINCT, RewardOutcome, default_outcome
from cluster.protocol.calls import CallOutcome
from grrm_client import RewardClient
from cluster.protocol.members import FailureLog
from grrm_client.adapters.pipeline import reward_member
from grrm_client.adapters.verl.capacity import concurrency_problem, groups_per_step
from grrm_client.adapters.verl.config import BridgeConfig, validation_group_warning
from grrm_client.adapters.verl.extra_info import RewardTiming, extra_info
from grrm_client.adapters.verl.metrics import RewardCounters
from grrm_client.adapters.verl.rollout import Rollout, group_size_of, read_rollout, rollout_index
from grrm_client.adapters.verl.run_identity import current_run_id, namespaced_group_id, run_tenant
from grrm_client.demand import DemandAnnouncer

__all__ = ["GRRMRewardManager"]

logger = logging.getLogger(__name__)

# What reading a row raises when the row lacks a key or holds a value of the wrong kind.
_ROW_ERRORS = (KeyError, ValueError, TypeError, IndexError, AttributeError)


class GRRMRewardManager(RewardManagerBase):
    """Per-rollout GRRM rewards through the member API of the reward cluster."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        *,
        bridge_config: BridgeConfig | None = None,
        client: RewardClient | None = None,
    ):
        """Built by verl as ``cls(config=, tokenizer=, compute_score=, reward_router_address=,
        reward_model_tokenizer=)``; ``compute_score`` and the router address are unused (the
        reward comes from the cluster). Tests may pass ``bridge_config`` and ``client``.
        A wrong setting raises here, at start, naming it; so does a trainer config whose waiting
        rollouts its reward workers cannot hold (:mod:`grrm_client.adapters.verl.capacity`)."""
        super().__init__(config, tokenizer, compute_score)
        self.bridge = bridge_config or BridgeConfig.from_verl_config(config)
        problem = concurrency_problem(config, self.bridge.reward_worker_concurrency)
        if problem:
            raise ValueError(f"grrm: {problem}")
        self.settings = self.bridge.reward_settings()
        self.client = client or RewardClient(self.bridge)
        self.counters = RewardCounters()
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer
        self.run_id = current_run_id() if self.bridge.run_id is None else self.bridge.run_id
        self.tenant = run_tenant(self.bridge.tenant, self.run_id)
        self._failures = FailureLog()  # default-reward reasons already logged by this manager
        self._in_flight = 0  # run_single calls in this worker now (each holds one of its slots)
        self._crowded = False  # warned that they near the worker's concurrency
        # A step's groups: one per prompt of the generation batch (None: unknown, nothing is announced).
        groups = groups_per_step(config)
        # The client is looked up at each announcement: whoever built the manager may swap it.
        self.demand = (DemandAnnouncer(lambda **announcement: self.client.announce_demand(**announcement), groups,
                                       gap_s=self.bridge.phase_gap_s, tenant=self.tenant)
                       if self.bridge.announce_demand and groups else None)
        warning = validation_group_warning(config, self.bridge)
        if warning:
            logger.warning("grrm: %s", warning)

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """The reward of one rollout (the last sequence of ``data``, as verl's own managers do).

        Never raises: a reward manager that raises ends verl's training run. Whatever goes wrong
        (a row without what the bridge reads, an unreachable service, a bug) becomes the default
        reward, flagged in ``reward_extra_info`` (``failed``, ``failure``), counted, and logged
        once per reason.
        """
        timing = RewardTiming(sent_at=time.time(), worker_in_flight=self._enter())
        try:
            return await self._reward(data, timing)
        except Exception as error:  # noqa: BLE001 - see the docstring
            return self._default(INTERNAL_ERROR, f"{type(error).__name__}: {error}", timing)
        finally:
            self._in_flight -= 1

    def _enter(self) -> int:
        """Count one more call in this worker; warn once when they near its concurrency."""
        self._in_flight += 1
        limit = self.bridge.reward_worker_concurrency
        if self._in_flight >= 0.9 * limit and not self._crowded:
            self._crowded = True
            logger.error(
                "grrm: %d reward calls are waiting in this reward-loop worker, which runs at most %d at once: "
                "beyond that, members queue behind members that wait for them and their groups time out. "
                "Raise reward.num_workers (grrm/worker_in_flight_max in the step metrics shows the peak).",
                self._in_flight, limit,
            )
        return self._in_flight

    async def _reward(self, data: DataProto, timing: RewardTiming) -> dict[str, Any]:
        try:
            item = data[-1:][0]
            rollout = read_rollout(item, self.bridge, self.tokenizer)
            group_size = group_size_of(item.non_tensor_batch, self.bridge)
            index = rollout_index(item.non_tensor_batch, group_size, self.bridge.index_key) if group_size > 1 else 0
        except _ROW_ERRORS as error:
            return self._default(BAD_ROW, f"{type(error).__name__}: {error}", timing)
        if group_size < 2:
            return self._answer(rollout, default_outcome(TOO_FEW_DISTINCT, self.settings), timing)
        if self.demand is not None:
            self.demand.requested(timing.sent_at, group_size=group_size)
        group_id = namespaced_group_id(self.run_id, rollout.uid)
        outcome, call = await reward_member(
            self.client, rollout, self.settings, tenant=self.tenant, group_id=group_id, group_size=group_size,
            index=index, source=rollout.source, src_lang=rollout.src_lang, trg_lang=rollout.trg_lang,
            sent_at=timing.sent_at, context=rollout.context,
        )
        timing = timing.answered(time.time(), call.result.timing if call.result is not None else None, call.rejoins)
        return self._answer(rollout, outcome, timing, call, group_id=group_id, detail=self._detail(rollout, call))

    @staticmethod
    def _detail(rollout: Rollout, call: CallOutcome) -> str:
        error = call.error if call.result is None else call.result.error
        return f"group {rollout.uid}: {error or '-'} (after {call.attempts} attempts)"

    def _answer(
        self,
        rollout: Rollout,
        outcome: RewardOutcome,
        timing: RewardTiming,
        call: CallOutcome | None = None,
        group_id: str = "",
        detail: str = "",
    ) -> dict[str, Any]:
        result = call.result if call is not None else None
        if not timing.answered_at:
            timing = timing.answered(time.time())
        info = extra_info(
            outcome,
            extracted=rollout.extracted,
            attempts=result.attempts if result is not None else 0,
            request_attempts=call.attempts if call is not None else 0,
            replica=result.replica if result is not None else "",
            mask_failed=self.bridge.mask_failed,
            group_id=group_id,
            timing=timing,
        )
        return self._record(outcome, info, detail)

    def _default(self, reason: str, detail: str, timing: RewardTiming) -> dict[str, Any]:
        """The default reward for a row the bridge could not even read or send."""
        outcome = default_outcome(reason, self.settings)
        info = extra_info(outcome, extracted=False, mask_failed=self.bridge.mask_failed, timing=timing.answered(time.time()))
        return self._record(outcome, info, detail)

    def _record(self, outcome: RewardOutcome, info: dict[str, Any], detail: str) -> dict[str, Any]:
        self.counters.record(info)
        if self._failures.first(outcome):  # every occurrence is counted: grrm/default/<reason> in the step metrics
            logger.warning(
                "grrm: default reward %s for %s: %s (logged once; further ones are counted in grrm/default/%s)",
                outcome.reward, outcome.failure, detail, outcome.failure,
            )
        return {"reward_score": outcome.reward, "reward_extra_info": info}

    def metrics(self) -> dict[str, float]:
        """This manager's counts since it was built (see :class:`grrm_client.adapters.verl.metrics.RewardCounters`)."""
        return self.counters.as_metrics()


# Also selectable as `reward.reward_manager.name=grrm` with the default `source=register`,
# wherever this module is imported before verl validates its config. Loading this file by
# path defines the class a second time: the first registration stays.
if "grrm" not in REWARD_MANAGER:
    register("grrm")(GRRMRewardManager)
