"""``--custom-rm-path grrm_client.slime.group_rm``, as slime launch scripts have it:
:mod:`grrm_client.adapters.slime` (the same functions, so the same process-wide client)."""

from grrm_client.adapters.slime import SlimeRewardConfig, group_rm, reset

__all__ = ["SlimeRewardConfig", "group_rm", "reset"]
