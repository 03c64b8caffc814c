"""The verl command for a GPU cluster in docs/trainers/verl.md composes with verl 0.9.1's own Hydra
config, and the bridge reads from it what that page says (the CPU harness runs the same reward
overrides for real)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "trainers" / "verl.md"


def documented_overrides() -> list[str]:
    """The Hydra overrides of the page's ``python -m verl.trainer.main_ppo`` block."""
    text = PAGE.read_text()
    block = re.search(r"```bash\n(python -m verl\.trainer\.main_ppo.*?)\n```", text, re.S)
    assert block, "docs/trainers/verl.md has no main_ppo command block"
    command = " ".join(line for line in block.group(1).splitlines() if not line.lstrip().startswith("#"))
    words = shlex.split(command.replace("\\\n", " ").replace("\\", " "))
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    return [word.replace("$DATA", "/data").replace("$POLICY", "/models/policy") for word in words[3:]]


def test_documented_command_composes_and_configures_the_bridge():
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    from grrm_client.adapters.verl.config import BridgeConfig, validation_group_warning

    overrides = documented_overrides()
    config_dir = Path(main_ppo.__file__).parent / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.reward.reward_manager.source == "importlib"
    assert config.reward.reward_manager.module.path == "pkg://trainer_bridge.reward_manager"
    # The step metrics' opt-in reaches the trainer's actor through the job's runtime_env (verl's ray.init).
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == "trainer_bridge.verl_plugin"
    bridge = BridgeConfig.from_verl_config(config)
    assert bridge.transport == "handle" and bridge.app_name == "grrm" and bridge.extractor == "codeblock"
    assert bridge.group_size == config.actor_rollout_ref.rollout.n == 8
    assert bridge.index_key is None  # the position comes from what the trainer provides
    # The reward, DAPO's overlong penalty included, is the service's recipe: the command sets none of it.
    assert not {"overlong", "overlong_buffer_cfg", "score_scale_factor"} & set(config.reward.reward_kwargs)
    assert validation_group_warning(config, bridge) is None  # val_kwargs.n = rollout.n
    config.actor_rollout_ref.rollout.val_kwargs.n = 1
    assert "val_kwargs.n=1" in validation_group_warning(config, bridge)
