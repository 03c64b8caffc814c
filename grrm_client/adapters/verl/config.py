"""The bridge's typed configuration: how to reach the reward cluster and how to turn scores into rewards.

Built once, either from plain keyword arguments (``BridgeConfig(transport="http", ...)``) or
from the config verl hands a reward manager (:meth:`BridgeConfig.from_verl_config`). verl
0.9.1 builds managers as ``cls(config=<the whole trainer config>, tokenizer=..., ...)``; the
bridge reads its settings from ``reward.reward_kwargs`` (the section verl's own DAPO manager
reads), so a launch command adds them with Hydra's ``+`` prefix::

    +reward.reward_kwargs.app_name=grrm +reward.reward_kwargs.extractor=codeblock

Missing values come from the trainer config: the group size from ``actor_rollout_ref.rollout.n``.
The reward is the service's recipe's (``docs/recipes.md``), DAPO's overlong penalty included (its
``overlong`` part, read from each rollout's response length): the bridge's own overlong settings
(``reward_kwargs.overlong``, DAPO's ``overlong_buffer_cfg`` and ``max_resp_len``) are refused when
they would penalise, naming the key and the recipe's part, so that no rollout is penalised twice.
A wrong key or value is an error naming it, at start, not a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, model_validator

from grrm_client.adapters.config import AdapterConfig
from grrm_client.demand import DemandSettings

# The bridge's overlong settings before the recipe, and DAPO's: the service's recipe.parts.overlong now.
_OVERLONG_KEYS = ("overlong", "overlong_buffer_cfg", "max_resp_len")
_OVERLONG_MOVED = ("the overlong penalty is the service's now: set it in the tenant's recipe (recipe.parts.overlong: "
                   "max_response_tokens, buffer_tokens, penalty; docs/recipes.md) and remove this key; the bridge "
                   "sends every rollout's response length")


def _refuse_overlong(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the old overlong keys; a ValueError naming the key of an enabled buffer. A
    disabled one, and DAPO's ``max_resp_len`` on its own, are dropped: they penalise nothing."""
    kwargs = dict(kwargs)
    for key in _OVERLONG_KEYS:
        value = kwargs.pop(key, None)
        enabled = bool(value.get("enable")) if isinstance(value, Mapping) else bool(value)
        if enabled and key != "max_resp_len":
            raise ValueError(f"reward_kwargs.{key}: {_OVERLONG_MOVED}")
    return kwargs


def _verl_row_key(name: str) -> Any:
    """AdapterConfig's row key ``name`` where verl keeps a row's own fields: under ``extra_info``."""
    adapter = AdapterConfig.model_fields[name]
    return Field(f"extra_info.{adapter.default}", description=f"{adapter.description} In verl: a non_tensor_batch "
                                                               "key, then dict keys separated by dots.")


class BridgeConfig(AdapterConfig, DemandSettings):
    """Everything the trainer side needs: an :class:`AdapterConfig` (how to reach the cluster and retry,
    how to read a rollout, the reward arithmetic) with verl's row keys as defaults, plus what only
    verl has: its reward-loop workers, the group id and size in its rows. The keys are flat, as verl
    passes them."""

    model_config = ConfigDict(extra="forbid")
    ids_unique_across_runs: ClassVar[bool] = True  # verl's uid: a uuid per prompt

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
    source_key: str = _verl_row_key("source_key")
    src_lang_key: str = _verl_row_key("src_lang_key")
    trg_lang_key: str = _verl_row_key("trg_lang_key")
    ref_text_key: str = _verl_row_key("ref_text_key")
    ref_lang_key: str = _verl_row_key("ref_lang_key")
    notes_key: str = _verl_row_key("notes_key")
    uid_key: str = Field("uid", description="Row key of the GRPO group id (verl puts a uuid per prompt in "
                                            "non_tensor_batch['uid']).")
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
    mask_failed: bool = Field(
        False, description="Flag rows whose reward could not be obtained (service failures) as masked: the trainer "
                           "can drop them from the loss with grrm_client.adapters.verl.batch.mask_failed_rows.")

    @model_validator(mode="before")
    @classmethod
    def _no_overlong(cls, values: Any) -> Any:
        return _refuse_overlong(values) if isinstance(values, Mapping) else values

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
