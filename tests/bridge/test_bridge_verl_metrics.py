"""The bridge's counters in verl's step metrics (the real trainers' end-to-end checks are in
tests/verl_trainer/; here: the arithmetic, and the legacy trainer's hook on verl's real
``compute_data_metrics``)."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.rewards import RewardSettings, default_outcome, scored_outcome
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, extra_info
from grrm_client.adapters.verl.metrics import step_metrics
from grrm_client.adapters.verl.verl_metrics import install_step_metrics

from .helpers import codeblock, padded_batch, quality_text, row_fields

SETTINGS = RewardSettings(default_reward=-1.0)


def infos() -> list[dict]:
    valid = extra_info(scored_outcome(7, 10, SETTINGS), extracted=True, attempts=1, request_attempts=1, replica="r1")
    retried = extra_info(scored_outcome(3, 10, SETTINGS), extracted=True, attempts=1, request_attempts=3, replica="r1")
    down = extra_info(default_outcome("unavailable", SETTINGS), extracted=True, request_attempts=4)
    invalid = extra_info(default_outcome("invalid_extraction", SETTINGS), extracted=False, request_attempts=1)
    return [valid, retried, down, invalid]


def test_step_metrics_count_rewards_defaults_and_retries():
    metrics = step_metrics([*infos(), None, {"acc": 1.0}])  # rows of other reward managers are ignored
    assert metrics["grrm/rewards"] == 4 and metrics["grrm/valid"] == 2 and metrics["grrm/failed"] == 1
    assert metrics["grrm/default/unavailable"] == 1 and metrics["grrm/default/invalid_extraction"] == 1
    assert metrics["grrm/retried"] == 2 and metrics["grrm/retries"] == 2 + 3
    assert metrics["grrm/valid_rate"] == 0.5
    assert step_metrics([{"acc": 1.0}]) == {}


def test_legacy_trainer_step_metrics_include_the_bridge_counters(tokenizer):
    """verl's legacy trainer computes step metrics with compute_data_metrics(batch) after putting every
    reward_extra_info key into batch.non_tensor_batch; the hook adds the bridge's counters there."""
    from verl.trainer.ppo import ray_trainer

    install_step_metrics()  # the verl plugin does this as verl imports the trainer (see the last test)
    assert getattr(ray_trainer.compute_data_metrics, "_grrm_step_metrics", False)
    assert install_step_metrics() == []  # idempotent

    rows = [row_fields("u", j) for j in range(4)]
    batch = padded_batch(tokenizer, [codeblock(quality_text(0, j, 5)) for j in range(4)], rows)
    size = len(rows)
    batch.batch["token_level_scores"] = batch.batch["response_mask"].float()
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.batch["advantages"] = batch.batch["token_level_scores"]
    batch.batch["returns"] = batch.batch["token_level_scores"]
    plain = ray_trainer.compute_data_metrics.__wrapped__(batch=batch, use_critic=False)
    assert not any(key.startswith("grrm/") for key in plain)
    for key in EXTRA_INFO_KEYS:
        batch.non_tensor_batch[key] = np.array([info[key] for info in infos()], dtype=object)
    metrics = ray_trainer.compute_data_metrics(batch=batch, use_critic=False)
    assert {k: v for k, v in metrics.items() if not k.startswith("grrm/")} == pytest.approx(plain)
    assert metrics["grrm/rewards"] == size and metrics["grrm/valid"] == 2 and metrics["grrm/retries"] == 5


def test_the_verl_plugin_wraps_every_trainer_as_it_is_imported():
    """The package's `verl.plugins` entry point: `import verl` in a fresh process loads it, and each
    trainer module (v1, legacy, and the recipes' separation trainer that fully_async_policy trains
    with in an actor that never loads the reward manager) has its step metrics wrapped on import."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    assert [ep.value for ep in entry_points(group="verl.plugins") if ep.name == "grrm"] == ["grrm_client.adapters.verl.plugin"]
    probe = (
        "import verl, importlib\n"
        "from grrm_client.adapters.verl.verl_metrics import TRAINER_MODULES\n"
        "wrapped = []\n"
        "for name in TRAINER_MODULES:\n"
        "    module = importlib.import_module(name)\n"
        "    target = module.PPOTrainer._compute_metrics if name.endswith('v1.trainer_base') else module.compute_data_metrics\n"
        "    wrapped.append(getattr(target, '_grrm_step_metrics', False))\n"
        "print(wrapped)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[True, True, True]"
