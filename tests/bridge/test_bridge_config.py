"""BridgeConfig from keyword arguments and from the config verl hands a reward manager."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from grrm_client.adapters.verl.config import BridgeConfig, lookup

from .helpers import verl_config


def test_defaults_and_kwargs():
    config = BridgeConfig()
    assert config.transport == "handle" and config.app_name == "grrm" and config.replica_deployment == "GRRMReplica"
    assert config.extractor == "codeblock" and config.index_key is None and config.uid_key == "uid"
    http = BridgeConfig(transport="http", http_url="http://10.0.0.1:8000/grrm", extractor="line", mask_failed=True)
    assert http.transport == "http" and http.mask_failed
    assert [config.retry_policy.delay(a) for a in (1, 2, 3, 4, 5, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"transport": "grpc"}, "transport"),
        ({"extractor": "regex"}, "extractor"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"typo_key": 1}, "typo_key"),
        ({"overlong": {"enable": True, "max_resp_len": 100, "buffer_len": 20}}, r"reward_kwargs\.overlong: .*recipe"),
        ({"backoff_s": 5, "max_backoff_s": 1}, "max_backoff_s"),
    ],
)
def test_bad_values_are_named(kwargs, names):
    with pytest.raises(ValidationError, match=names):
        BridgeConfig(**kwargs)


def test_from_verl_config_reads_reward_kwargs_and_trainer_defaults():
    config = BridgeConfig.from_verl_config(verl_config(n=8, reward_kwargs={"app_name": "grrm2", "extractor": "line"}))
    assert config.app_name == "grrm2" and config.extractor == "line"
    assert config.group_size == 8  # actor_rollout_ref.rollout.n
    # A row's reference and notes sit beside its source in the dataset's extra_info.
    assert (config.ref_text_key, config.ref_lang_key, config.notes_key) == (
        "extra_info.ref_text", "extra_info.ref_lang", "extra_info.notes")


@pytest.mark.parametrize("kwargs", [
    {"overlong": {"enable": True, "buffer_len": 64}},
    {"overlong_buffer_cfg": {"enable": True, "len": 32, "penalty_factor": 0.5, "log": True}, "max_resp_len": 128},
])
def test_the_bridges_own_overlong_penalty_is_refused_naming_the_recipes_part(kwargs):
    """The service's recipe applies DAPO's overlong penalty (its overlong part): a bridge that applied one
    too would penalise every long rollout twice."""
    key = next(iter(kwargs))
    with pytest.raises(ValidationError, match=rf"reward_kwargs\.{key}: the overlong penalty is the service's now.*"
                                              r"recipe\.parts\.overlong"):
        BridgeConfig.from_verl_config(verl_config(n=4, reward_kwargs=kwargs))


def test_a_disabled_dapo_overlong_buffer_penalises_nothing_and_is_accepted():
    config = BridgeConfig.from_verl_config(verl_config(n=4, reward_kwargs={
        "overlong_buffer_cfg": {"enable": False, "len": 32}, "max_resp_len": 128, "group_size": 6}))
    assert config.group_size == 6  # an explicit setting wins over rollout.n
    assert "overlong" not in BridgeConfig.model_fields


def test_from_verl_config_rejects_unknown_keys_and_takes_overrides():
    with pytest.raises(ValidationError, match="extractr"):
        BridgeConfig.from_verl_config(verl_config(n=4, reward_kwargs={"extractr": "line"}))
    config = BridgeConfig.from_verl_config(verl_config(n=4), transport="http")
    assert config.transport == "http" and config.group_size == 4
    # A plain mapping without a `reward` section is the bridge's own keys; a BridgeConfig passes through.
    assert BridgeConfig.from_verl_config({"app_name": "x"}).app_name == "x"
    assert BridgeConfig.from_verl_config(config) is config


def test_lookup():
    tree = {"a": {"b": {"c": 3}}, "x": None}
    assert lookup(tree, "a.b.c") == 3
    assert lookup(tree, "a.b.d") is None and lookup(tree, "x.y", 7) == 7 and lookup(tree, "q") is None


def test_from_verls_own_trainer_config_with_hydra_style_additions():
    """verl 0.9.1's full generated trainer config, plus what `+reward.reward_kwargs.*=` adds."""
    from pathlib import Path

    import verl
    from omegaconf import OmegaConf, open_dict

    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    OmegaConf.set_struct(config, True)
    with open_dict(config):
        config.actor_rollout_ref.rollout.n = 8
        config.reward.reward_manager.source = "importlib"
        config.reward.reward_manager.name = "GRRMRewardManager"
        config.reward.reward_manager.module.path = "pkg://trainer_bridge.reward_manager"
        config.reward.reward_kwargs = {"app_name": "grrm", "extractor": "codeblock", "mask_failed": True,
                                       "notes_key": "extra_info.glossary"}
    bridge = BridgeConfig.from_verl_config(config)
    assert bridge.group_size == 8 and bridge.mask_failed and bridge.notes_key == "extra_info.glossary"
