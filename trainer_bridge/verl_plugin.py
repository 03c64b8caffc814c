"""``VERL_USE_EXTERNAL_MODULES=trainer_bridge.verl_plugin``: the bridge's step metrics in verl's, under
the path users set (:mod:`grrm_client.adapters.verl.plugin`, installed on import). Runs inside
``import verl``: imports nothing of verl."""

from grrm_client.adapters.verl.plugin import install

__all__ = ["install"]
