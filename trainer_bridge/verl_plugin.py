"""``VERL_USE_EXTERNAL_MODULES=trainer_bridge.verl_plugin``: opt in to the bridge's counters in verl's step
metrics (:mod:`grrm_client.adapters.verl.verl_metrics`; docs/trainers/verl.md). verl imports it in each of
its processes, inside ``import verl``; importing it installs the plugin, or refuses a verl it does not know."""

from grrm_client.adapters.verl.verl_metrics import install

install()
