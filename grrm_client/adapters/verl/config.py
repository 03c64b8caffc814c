"""The bridge's typed configuration: how to reach the reward cluster and how to turn scores into rewards.

Built once, either from plain keyword arguments (``BridgeConfig(transport="http", ...)``) or
from the config verl hands a reward manager (:meth:`BridgeConfig.from_verl_config`). verl
0.9.1 builds managers as ``cls(config=<the whole trainer config>, tokenizer=..., ...)``; the
bridge reads its settings from ``reward.reward_kwargs`` (the section verl's own DAPO manager
reads), so a launch command adds them with Hydra's ``+`` prefix::

    +reward.reward_kwargs.app_name=grrm +reward.reward_kwargs.extractor=codeblock

DAPO's spelling of the overlong buffer (``reward_kwargs.overlong_buffer_cfg.{enable,len,
penalty_factor}`` plus ``reward_kwargs.max_resp_len``) is accepted too. Missing values come from
the trainer config: the group size from ``actor_rollout_ref.rollout.n``, the overlong
``max_resp_len`` from ``actor_rollout_ref.rollout.response_length`` (or ``data.max_response_length``).
A wrong key or value is an error naming it, at start, not a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.rewards import RewardSettings
from grrm_client.adapters.config import AdapterConfig
from grrm_client.demand import DemandSettings

# DAPO's names for the overlong buffer (verl.experimental.reward_loop.reward_manager.dapo).
_DAPO_OVERLONG_KEYS = {"enable": "enable", "len": "buffer_len", "penalty_factor": "penalty_factor"}


class OverlongSettings(BaseModel):
    """DAPO's soft overlong buffer (spec section 5): no penalty up to ``max_resp_len - buffer_len``
    response tokens, rising linearly to ``penalty_factor`` at ``max_resp_len``, flat after."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(False, description="Apply the overlong penalty to scored rollouts.")
    max_resp_len: int | None = Field(None, ge=1, description="Response length, in tokens, at which the penalty "
                                                             "reaches penalty_factor (required when enabled).")
    buffer_len: int = Field(0, ge=0, description="Length of the buffer, in tokens, over which the penalty rises "
                                                 "(positive when enabled; at most max_resp_len).")
    penalty_factor: float = Field(1.0, ge=0, description="The largest penalty, subtracted from the scaled score "
                                                         "at max_resp_len and beyond.")

    @model_validator(mode="after")
    def _consistent(self) -> OverlongSettings:
        if not self.enable:
            return self
        if self.max_resp_len is None:
            raise ValueError("overlong.max_resp_len: required when overlong.enable is true")
        if self.buffer_len <= 0:
            raise ValueError("overlong.buffer_len: must be positive when overlong.enable is true")
        if self.buffer_len > self.max_resp_len:
            raise ValueError(
                f"overlong.buffer_len ({self.buffer_len}) exceeds overlong.max_resp_len ({self.max_resp_len})"
            )
        return self


class BridgeConfig(AdapterConfig, DemandSettings):
    """Everything the trainer side needs: an :class:`AdapterConfig` (how to reach the cluster and retry,
    how to read a rollout, the reward arithmetic) with verl's row keys as defaults, plus what only
    verl has: its reward-loop workers, the group id and size in its rows, the overlong penalty. The
    keys are flat, as verl passes them."""

    model_config = ConfigDict(extra="forbid")

    max_concurrent_groups: int = Field(256, ge=1, description="Groups scored at once by the whole-batch path.")
    # A member waiting for its group holds one call; the bridge refuses to start when the trainer can have more
    # rollouts waiting than its reward.num_workers can hold (grrm_client/adapters/verl/capacity.py).
    reward_worker_concurrency: int = Field(
        1000, ge=1, description="Concurrent calls one verl reward-loop worker runs (Ray's default for async actors, "
                                "which verl 0.9.1 does not change). Set it only if you raised the actors' "
                                "max_concurrency.")

    # -- reading a rollout: verl's row keys ------------------------------------------------------
    # A non_tensor_batch key, then dict keys separated by dots
    # ("extra_info.source" = non_tensor_batch["extra_info"]["source"]).
    source_key: str = Field("extra_info.source", description="Where a row keeps its source text: a "
                                                             "non_tensor_batch key, then dict keys separated by dots.")
    src_lang_key: str = Field("extra_info.src_lang", description="Where a row keeps its source language (same "
                                                                 "form as source_key).")
    trg_lang_key: str = Field("extra_info.trg_lang", description="Where a row keeps its target language (same "
                                                                 "form as source_key).")
    uid_key: str = Field("uid", description="Row key of the GRPO group id (verl puts a uuid per prompt in "
                                            "non_tensor_batch['uid']).")
    # Two runs (or a resumed run) sharing one service never meet in one group.
    run_id: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.\-]*$",
        description="Namespace of group ids: the service sees `{run_id}:{uid}`. None: derived from the Ray job "
                    "running the trainer (grrm_client/adapters/verl/run_identity.py); empty: verl's uid as it is.")
    # See grrm_client/adapters/verl/rollout.py.
    index_key: str | None = Field(
        None, description="Row key of the rollout's position in its group, for the member API. None: what the "
                          "trainer provides, `session_id` (verl's default trainer) else `priority` % group_size "
                          "(legacy agent loop), else none (fully_async_policy: the member is sent with an id of its "
                          "own and the service orders the group). A key name: int(row[index_key]) % group_size.")
    group_size: int | None = Field(None, ge=1, le=1024, description="Rollouts per group (None: "
                                                                    "actor_rollout_ref.rollout.n of the trainer "
                                                                    "config).")
    group_size_key: str | None = Field(
        "extra_info.group_size", description="Row key with which a row may override the group size (e.g. "
                                             "validation with val_kwargs.n != rollout.n); None: no override.")
    # -- reward arithmetic (spec section 5): AdapterConfig's, plus DAPO's overlong penalty ------------
    overlong: OverlongSettings = Field(default_factory=OverlongSettings, description="DAPO's soft overlong buffer "
                                                                                     "penalty.")
    mask_failed: bool = Field(
        False, description="Flag rows whose reward could not be obtained (service failures) as masked: the trainer "
                           "can drop them from the loss with grrm_client.adapters.verl.batch.mask_failed_rows.")

    def reward_settings(self) -> RewardSettings:
        """The pure arithmetic's settings."""
        overlong = self.overlong
        return RewardSettings(
            default_reward=self.default_reward,
            score_scale_factor=self.score_scale_factor,
            overlong_enable=overlong.enable,
            max_resp_len=overlong.max_resp_len or 0,
            buffer_len=overlong.buffer_len,
            penalty_factor=overlong.penalty_factor,
        )

    @classmethod
    def from_verl_config(cls, config: Any, **overrides: Any) -> BridgeConfig:
        """Build from the config verl passes to a reward manager (a DictConfig, or a plain dict).

        A :class:`BridgeConfig` is returned as is (with ``overrides`` applied); a mapping that is
        not a trainer config (no ``reward`` section) is read as the bridge's own keys.
        """
        if isinstance(config, BridgeConfig):
            return config.model_copy(update=overrides) if overrides else config
        if not (isinstance(config, Mapping) or hasattr(config, "get")):
            raise TypeError(f"config: expected a mapping or DictConfig, got {type(config).__name__}")
        # Only the nodes read here are resolved: the rest of a trainer config may hold values
        # (interpolations, ???) that cannot be resolved in a reward worker.
        tree = config
        if lookup(tree, "reward") is None:
            return cls.model_validate({**dict(to_plain(config)), **overrides})
        kwargs = dict(to_plain(lookup(tree, "reward.reward_kwargs")) or {})
        kwargs = _translate_dapo_keys(kwargs)
        overlong = dict(kwargs.get("overlong") or {})
        if overlong.get("enable") and overlong.get("max_resp_len") is None:
            response_length = lookup(tree, "actor_rollout_ref.rollout.response_length")
            if response_length is None:
                response_length = lookup(tree, "data.max_response_length")
            if response_length is not None:
                overlong["max_resp_len"] = int(response_length)
        if overlong:
            kwargs["overlong"] = overlong
        if kwargs.get("group_size") is None:
            rollout_n = lookup(tree, "actor_rollout_ref.rollout.n")
            if rollout_n is not None:
                kwargs["group_size"] = int(rollout_n)
        kwargs.update(overrides)
        return cls.model_validate(kwargs)


def validation_group_warning(trainer_config: Any, bridge: BridgeConfig) -> str | None:
    """Why validation rewards would wait and fall back to the default, when they would.

    verl's validation samples ``val_kwargs.n`` rollouts per prompt, and a row does not say whether
    it is a validation row: with another n than the bridge's group size, a validation group never
    completes on the service (its members time out and get the default reward) unless the
    validation data carries its group size (``group_size_key``).
    """
    if not hasattr(trainer_config, "get") or lookup(trainer_config, "reward") is None:
        return None
    validates = lookup(trainer_config, "trainer.val_before_train", True) or (
        (lookup(trainer_config, "trainer.test_freq", -1) or -1) > 0
    )
    val_n = lookup(trainer_config, "actor_rollout_ref.rollout.val_kwargs.n")
    if not validates or val_n is None or bridge.group_size is None or int(val_n) == bridge.group_size:
        return None
    return (
        f"validation samples actor_rollout_ref.rollout.val_kwargs.n={val_n} rollouts per prompt but the bridge "
        f"groups {bridge.group_size}: validation rewards will time out and be the default unless the "
        f"validation data sets {bridge.group_size_key or 'a group size key'} (or val_kwargs.n={bridge.group_size})"
    )


def _translate_dapo_keys(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Accept DAPO's ``overlong_buffer_cfg`` / ``max_resp_len`` next to the bridge's ``overlong``."""
    dapo = kwargs.pop("overlong_buffer_cfg", None)
    max_resp_len = kwargs.pop("max_resp_len", None)
    if dapo is None and max_resp_len is None:
        return kwargs
    overlong = dict(kwargs.get("overlong") or {})
    for key, value in dict(dapo or {}).items():
        if key == "log":
            continue  # DAPO's logging switch: the bridge always reports the penalty
        if key not in _DAPO_OVERLONG_KEYS:
            raise ValueError(f"reward_kwargs.overlong_buffer_cfg.{key}: unknown key")
        overlong.setdefault(_DAPO_OVERLONG_KEYS[key], value)
    if max_resp_len is not None:
        overlong.setdefault("max_resp_len", max_resp_len)
    kwargs["overlong"] = overlong
    return kwargs


def to_plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers (anything else unchanged)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # the trainer side may build the config without omegaconf
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def lookup(tree: Any, dotted: str, default: Any = None) -> Any:
    """``tree["a"]["b"]`` for ``"a.b"``, through mappings and attribute access; ``default`` if absent."""
    node = tree
    for part in dotted.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping) or hasattr(node, "get"):
            try:
                node = node.get(part, None)
            except Exception:  # noqa: BLE001 - a structured config may raise for unknown keys
                return default
        else:
            node = getattr(node, part, None)
    return default if node is None else node
