"""Import paths verl users already configure, kept working.

The verl adapter lives in :mod:`grrm_client.adapters.verl`, beside the other trainers' adapters.
verl configs name ``pkg://trainer_bridge.reward_manager`` (``reward.reward_manager.module.path``),
and ``VERL_USE_EXTERNAL_MODULES=trainer_bridge.verl_plugin`` loads the step-metrics plugin where the
package is only on ``PYTHONPATH``: both modules here re-export the adapter's, nothing else.
"""
