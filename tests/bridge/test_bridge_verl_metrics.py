"""The bridge's counters in verl's step metrics (the real trainers' end-to-end checks are in
tests/verl_trainer/; here: the arithmetic, and the legacy trainer's hook on verl's real
``compute_data_metrics``)."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.rewards import RewardSettings, default_outcome
from cluster.protocol.members import ServiceReward
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, extra_info, row_components
from grrm_client.adapters.verl.metrics import step_metrics
from grrm_client.adapters.verl.verl_metrics import install_step_metrics

from .helpers import codeblock, padded_batch, quality_text, row_fields

SETTINGS = RewardSettings(default_reward=-1.0)


def scored(score: int, **parts: float) -> ServiceReward:
    """A member's answer as the service's recipe composed it (reward = the parts' weighted sum)."""
    return ServiceReward(reward=sum(parts.values()), valid=True, raw_score=score, components=parts)


def infos() -> list[dict]:
    valid = extra_info(scored(7, grrm=0.07, overlong=0.0), extracted=True, attempts=1, request_attempts=1,
                       replica="r1")
    retried = extra_info(scored(3, grrm=0.03, overlong=-0.02), extracted=True, attempts=1, request_attempts=3,
                         replica="r1")
    down = extra_info(default_outcome("unavailable", SETTINGS), extracted=True, request_attempts=4)  # no answer
    invalid = extra_info(ServiceReward(reward=-1.04, valid=False, failure="invalid_extraction",
                                       components={"format": -1.0}), extracted=False, request_attempts=1)
    return [valid, retried, down, invalid]


def test_each_rows_recipe_parts_travel_as_text_and_the_step_logs_each_parts_mean():
    rows = infos()
    assert all(isinstance(info["components"], str) for info in rows)  # verl averages every non-text value
    assert [row_components(info) for info in rows] == [{"grrm": 0.07, "overlong": 0.0},
                                                       {"grrm": 0.03, "overlong": -0.02}, {}, {"format": -1.0}]
    metrics = step_metrics(rows)
    # Over the step's 4 rollouts, a rollout whose answer lacks the part counting 0.
    assert {name: value for name, value in metrics.items() if name.startswith("grrm/component/")} == pytest.approx({
        "grrm/component/grrm/mean": 0.025, "grrm/component/overlong/mean": -0.005,
        "grrm/component/format/mean": -0.25})


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
    assert metrics["grrm/component/grrm/mean"] == pytest.approx(0.025)


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
