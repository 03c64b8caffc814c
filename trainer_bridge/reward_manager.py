"""``pkg://trainer_bridge.reward_manager``: verl's reward manager for GRRM, under the path verl configs
name (:mod:`grrm_client.adapters.verl.reward_manager`; importing it registers ``grrm`` with verl)."""

from grrm_client.adapters.verl.reward_manager import GRRMRewardManager

__all__ = ["GRRMRewardManager"]
