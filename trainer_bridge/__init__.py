"""Import paths verl users configure.

The verl adapter lives in :mod:`grrm_client.adapters.verl`, beside the other trainers' adapters.
verl configs name ``pkg://trainer_bridge.reward_manager`` (``reward.reward_manager.module.path``), which
re-exports the adapter's reward manager; ``VERL_USE_EXTERNAL_MODULES=trainer_bridge.verl_plugin`` opts in
to the bridge's counters in verl's step metrics (importing it installs the plugin).
"""
