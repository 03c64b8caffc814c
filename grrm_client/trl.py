"""``from grrm_client.trl import GRRMReward``, as TRL scripts have it: :mod:`grrm_client.adapters.trl`."""

from grrm_client.adapters.trl import GRRMReward, TRLRewardConfig

__all__ = ["GRRMReward", "TRLRewardConfig"]
