"""The CPU harness's own logic, in milliseconds: its main_ppo command composes with verl's Hydra
config (both trainers, both reward paths), and its report reads verl's records right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_harness.after_batch import after_batch_overrides
from cpu_harness.loop import TrainingReport, replica_delta
from cpu_harness.trainer import TrainerRun, bridge_overrides, main_ppo_command, read_metrics


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from verl.trainer import main_ppo

    config_dir = Path(main_ppo.__file__).parent / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def run_for(tmp_path: Path, **bridge) -> TrainerRun:
    return TrainerRun(
        policy_dir=tmp_path / "policy",
        train_file=tmp_path / "train.parquet",
        val_file=tmp_path / "val.parquet",
        output_dir=tmp_path / "out",
        ray_address="127.0.0.1:6379",
        bridge=bridge_overrides(**bridge),
    )


@pytest.mark.parametrize("transport", ["handle", "http"])
def test_main_ppo_command_composes_with_verls_config(tmp_path, transport):
    from grrm_client.adapters.verl.config import BridgeConfig

    argv, env = main_ppo_command(run_for(tmp_path, transport=transport, http_url="http://127.0.0.1:1", default_reward=-1.0))
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    config = compose(argv[3:])
    assert config.algorithm.adv_estimator == "grpo" and config.actor_rollout_ref.rollout.n == 4
    assert config.trainer.use_v1 and config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.trainer.rollout_data_dir == str(tmp_path / "out" / "rollouts")
    # The CPU platform, and the opt-in the trainings' grrm/ step metrics need (docs/trainers/verl.md).
    assert env["VERL_USE_EXTERNAL_MODULES"] == "cpu_harness.verl_platform,trainer_bridge.verl_plugin"
    assert env["VERL_PLATFORM"] == "cpu"
    bridge = BridgeConfig.from_verl_config(config)
    assert bridge.transport == transport and bridge.default_reward == -1.0 and bridge.group_size == 4


def test_after_batch_overrides_select_verls_colocated_reward_loop(tmp_path):
    argv, _ = main_ppo_command(run_for(tmp_path))
    config = compose([*argv[3:], "trainer.use_v1=False", *after_batch_overrides(tmp_path / "grrm")])
    assert not config.trainer.use_v1
    assert config.reward.reward_model.enable and not config.reward.reward_model.enable_resource_pool
    assert config.reward.custom_reward_function.path.endswith("cpu_harness/after_batch.py")
    assert config.reward.reward_manager.name == "GRRMRewardManager"


def test_report_reads_verls_records(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps({"step": s, "data": {"grrm/valid": 16.0 + s}}) for s in (1, 2)) + "\n")
    steps = read_metrics(metrics)
    v1_rows = [{"step": 1, "uid": f"u{g}_{s}_0", "score": float(g * 4 + s), "input": "x"} for g in range(2) for s in (3, 0, 2, 1)]
    legacy_rows = [{"step": 2, "input": f"prompt {i % 2}", "score": float(i)} for i in range(4)]
    report = TrainingReport(0, 1.0, steps, v1_rows + legacy_rows, {}, tmp_path / "log")
    assert report.metric(2, "grrm/valid") == 18.0 and report.metric(3, "grrm/valid") is None
    assert report.groups(1) == {"u0": [0.0, 1.0, 2.0, 3.0], "u1": [4.0, 5.0, 6.0, 7.0]}  # in session order
    assert report.groups(2) == {"prompt 0": [0.0, 2.0], "prompt 1": [1.0, 3.0]}


def test_replica_delta_counts_what_a_run_added():
    before = {"a": {"groups_scored": 2, "assembler": {"members_received": 8, "conflicts": 0}}}
    after = {
        "a": {"groups_scored": 5, "assembler": {"members_received": 20, "conflicts": 0}},
        "b": {"groups_scored": 1, "assembler": {"members_received": 4, "conflicts": 0}},  # a new replica
    }
    assert replica_delta(before, after) == {
        "a": {"members_received": 12, "conflicts": 0, "groups_scored_by_engine": 3},
        "b": {"members_received": 4, "conflicts": 0, "groups_scored_by_engine": 1},
    }
