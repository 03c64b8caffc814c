"""What a verl trainer imports to reach the GRRM reward cluster.

Modules, one job each:

* :mod:`trainer_bridge.config` -- :class:`BridgeConfig` (from kwargs or verl's config): the
  client's settings (``grrm_client.ClientConfig``) plus row reading and reward arithmetic;
* :mod:`trainer_bridge.rewards` -- the pure reward arithmetic (spec section 5);
* :mod:`trainer_bridge.rollout` -- reading a verl row (group, index, source, translation);
* :mod:`trainer_bridge.reward_manager` -- ``GRRMRewardManager``, verl's per-rollout manager;
* :mod:`trainer_bridge.batch` -- rewards for a complete ``DataProto``;
* :mod:`trainer_bridge.metrics` -- a step's reward metrics (counts by outcome, exposed reward time);
* :mod:`trainer_bridge.verl_metrics` -- those metrics in verl's own step metrics.

The service is reached through ``grrm_client``'s :class:`RewardClient` (re-exported here).
Importing the package is light (no verl, torch, Ray, vLLM or SGLang); the manager and the batch
path import verl / torch when they are imported.
"""

from grrm_client import CallOutcome, RewardClient
from trainer_bridge.config import BridgeConfig, OverlongSettings
from trainer_bridge.rewards import RewardOutcome, RewardSettings

__all__ = ["BridgeConfig", "CallOutcome", "OverlongSettings", "RewardClient", "RewardOutcome", "RewardSettings"]
