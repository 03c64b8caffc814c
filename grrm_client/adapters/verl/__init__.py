"""verl's adapter: what a verl trainer imports to reach the GRRM reward cluster.

Modules, one job each:

* :mod:`~grrm_client.adapters.verl.config` -- :class:`BridgeConfig` (from kwargs or verl's config): an
  :class:`~grrm_client.adapters.config.AdapterConfig` plus verl's row keys and reward-loop sizing
  (the overlong penalty is the service recipe's ``overlong`` part);
* :mod:`~grrm_client.adapters.verl.rollout` -- reading a verl row (group, index, source, completion);
* :mod:`~grrm_client.adapters.verl.reward_manager` -- ``GRRMRewardManager``, verl's per-rollout manager
  (over :mod:`grrm_client.adapters.pipeline`; verl configs name it ``pkg://trainer_bridge.reward_manager``);
* :mod:`~grrm_client.adapters.verl.batch` -- rewards for a complete ``DataProto``;
* :mod:`~grrm_client.adapters.verl.extra_info` -- each row's ``reward_extra_info`` (the reward and its
  recipe parts are the service's answer's);
* :mod:`~grrm_client.adapters.verl.timing` -- when a reward went through the bridge and the service;
* :mod:`~grrm_client.adapters.verl.metrics` -- a step's reward metrics (counts by outcome, exposed reward time);
* :mod:`~grrm_client.adapters.verl.verl_metrics` and :mod:`~grrm_client.adapters.verl.plugin` -- those
  metrics in verl's own step metrics (a ``verl.plugins`` entry point);
* :mod:`~grrm_client.adapters.verl.capacity`, :mod:`~grrm_client.adapters.verl.run_identity` -- what
  the trainer's config says about waiting rollouts, and one run's group-id namespace.

Importing the package is light (no verl, torch, Ray, vLLM or SGLang); the manager and the batch
path import verl / torch when they are imported.
"""

from cluster.rewards import RewardOutcome, RewardSettings
from cluster.protocol.calls import CallOutcome
from grrm_client import RewardClient
from grrm_client.adapters.verl.config import BridgeConfig

__all__ = ["BridgeConfig", "CallOutcome", "RewardClient", "RewardOutcome", "RewardSettings"]
