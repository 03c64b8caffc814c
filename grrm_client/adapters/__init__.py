"""Every trainer's adapter, over one member pipeline.

* :mod:`grrm_client.adapters.config` -- :class:`AdapterConfig`: the client's settings plus how a
  trainer's rows are read and rewarded (every adapter's settings extend it);
* :mod:`grrm_client.adapters.pipeline` -- the one path from completions to rewards: a completion
  becomes a member (or the completions of a group one whole-group request), its answer a reward;
* :mod:`grrm_client.adapters.verl` -- verl's reward manager, batch path and step metrics (verl
  configs keep naming ``pkg://trainer_bridge.reward_manager``);
* :mod:`grrm_client.adapters.trl` -- a TRL ``GRPOTrainer`` reward function;
* :mod:`grrm_client.adapters.slime` -- slime's custom group reward model.

OpenRLHF posts to the service itself (``POST /openrlhf/get_reward``): its payload's mapping onto
members is the protocol's (:mod:`cluster.protocol.openrlhf`), which the service's route takes.

Importing the package is light: each adapter imports its trainer's libraries when it is imported.
"""

from grrm_client.adapters.config import AdapterConfig

__all__ = ["AdapterConfig"]
