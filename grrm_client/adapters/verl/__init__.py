"""verl's adapter: the reward manager a verl trainer loads to reach the GRRM reward cluster.

The adapter is :class:`~grrm_client.adapters.verl.reward_manager.GRRMRewardManager`, verl's per-rollout
reward manager (verl configs name it ``pkg://trainer_bridge.reward_manager``). Beside it, one job each:

* :mod:`~grrm_client.adapters.verl.config` -- :class:`BridgeConfig`, its settings (``reward.reward_kwargs``);
* :mod:`~grrm_client.adapters.verl.rollout` -- reading a verl row (group, index, source, completion);
* :mod:`~grrm_client.adapters.verl.extra_info` -- each row's ``reward_extra_info`` and its times;
* :mod:`~grrm_client.adapters.verl.run_identity` -- one training run's group-id namespace;
* :mod:`~grrm_client.adapters.verl.capacity` -- whether the reward-loop workers can hold the waiting rollouts;
* :mod:`~grrm_client.adapters.verl.metrics`, :mod:`~grrm_client.adapters.verl.exposure` -- a step's reward
  metrics (counts by outcome, recipe parts, exposed reward time against its limit);
* :mod:`~grrm_client.adapters.verl.batch` -- rewards for a complete ``DataProto`` (the whole-batch path);
* :mod:`~grrm_client.adapters.verl.verl_metrics` -- the opt-in plugin that puts those metrics in verl's own
  step metrics (``VERL_USE_EXTERNAL_MODULES=trainer_bridge.verl_plugin``).

Importing the package is light (no verl, torch, Ray, vLLM or SGLang); the manager and the batch
path import verl / torch when they are imported, and change nothing in verl but registering ``grrm``.
"""
