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
        ({"overlong": {"enable": True}}, "max_resp_len"),
        ({"overlong": {"enable": True, "max_resp_len": 100}}, "buffer_len"),
        ({"overlong": {"enable": True, "max_resp_len": 100, "buffer_len": 200}}, "buffer_len"),
        ({"backoff_s": 5, "max_backoff_s": 1}, "max_backoff_s"),
    ],
)
def test_bad_values_are_named(kwargs, names):
    with pytest.raises(ValidationError, match=names):
        BridgeConfig(**kwargs)


def test_from_verl_config_reads_reward_kwargs_and_trainer_defaults():
    config = BridgeConfig.from_verl_config(
        verl_config(n=8, reward_kwargs={"app_name": "grrm2", "extractor": "line", "overlong": {"enable": True, "buffer_len": 64}})
    )
    assert config.app_name == "grrm2" and config.extractor == "line"
    assert config.group_size == 8  # actor_rollout_ref.rollout.n
    assert config.overlong.enable and config.overlong.max_resp_len == 256  # rollout.response_length
    settings = config.reward_settings()
    assert settings.penalty(256) == pytest.approx(1.0) and settings.penalty(192) == 0.0


def test_from_verl_config_accepts_dapo_overlong_keys():
    config = BridgeConfig.from_verl_config(
        verl_config(
            n=4,
            reward_kwargs={
                "overlong_buffer_cfg": {"enable": True, "len": 32, "penalty_factor": 0.5, "log": True},
                "max_resp_len": 128,
                "group_size": 6,
            },
        )
    )
    assert config.overlong.model_dump() == {"enable": True, "max_resp_len": 128, "buffer_len": 32, "penalty_factor": 0.5}
    assert config.group_size == 6  # an explicit setting wins over rollout.n
    with pytest.raises(ValueError, match="overlong_buffer_cfg.size"):
        BridgeConfig.from_verl_config(verl_config(n=4, reward_kwargs={"overlong_buffer_cfg": {"size": 3}}))


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
        config.reward.reward_kwargs = {"app_name": "grrm", "extractor": "codeblock", "score_scale_factor": 0.1,
                                       "overlong": {"enable": True, "buffer_len": 128}, "mask_failed": True}
    bridge = BridgeConfig.from_verl_config(config)
    assert bridge.group_size == 8 and bridge.score_scale_factor == 0.1 and bridge.mask_failed
    assert bridge.overlong.max_resp_len == config.actor_rollout_ref.rollout.response_length
