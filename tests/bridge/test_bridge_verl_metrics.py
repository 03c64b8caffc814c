"""The bridge's counters in verl's step metrics (the real trainers' end-to-end checks are in
tests/verl_trainer/; here: the arithmetic, the legacy trainer's hook on verl's real
``compute_data_metrics``, and the plugin being opt-in and refusing a verl it does not know)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cluster.rewards import RewardSettings, default_outcome
from cluster.protocol.members import ServiceReward
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS, extra_info, row_components
from grrm_client.adapters.verl.metrics import step_metrics
from grrm_client.adapters.verl.verl_metrics import install_step_metrics

from .helpers import codeblock, padded_batch, quality_text, row_fields

SETTINGS = RewardSettings(default_reward=-1.0)
REPO = Path(__file__).resolve().parents[2]


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

    install_step_metrics()  # the opted-in plugin does this when the trainer creates its logger (below)
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


def run_python(code: str, **env: str) -> str:
    """The last line ``code`` prints in a fresh interpreter (this checkout first on its path)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_importing_the_reward_manager_installs_no_hook_and_patches_nothing_in_verl():
    """What verl configs name (pkg://trainer_bridge.reward_manager) registers `grrm` and leaves verl's
    import system and step metrics as they were: the plugin is opt-in."""
    probe = (
        "import sys\n"
        "finders = list(sys.meta_path)\n"
        "from verl.trainer.ppo import metric_utils\n"
        "from verl.utils.tracking import Tracking\n"
        "before = (metric_utils.compute_data_metrics, Tracking.__init__)\n"
        "import trainer_bridge.reward_manager\n"
        "from verl.trainer.ppo import ray_trainer\n"
        "from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER\n"
        "print([sys.meta_path == finders, (metric_utils.compute_data_metrics, Tracking.__init__) == before,\n"
        "       ray_trainer.compute_data_metrics is metric_utils.compute_data_metrics,\n"
        "       'trainer_bridge.verl_plugin' in sys.modules, 'grrm' in REWARD_MANAGER])\n"
    )
    assert run_python(probe, VERL_USE_EXTERNAL_MODULES="") == "[True, True, True, False, True]"


def test_the_opted_in_plugin_wraps_each_trainer_when_it_creates_its_logger():
    """VERL_USE_EXTERNAL_MODULES=trainer_bridge.verl_plugin: `import verl` (in every verl process) installs
    it without an import hook; each trainer module (v1, legacy, and the recipes' separation trainer that
    one_step_off_policy and fully_async_policy train with) has its step metrics wrapped once a trainer
    creates its logger, as each does in its own process before its first step."""
    probe = (
        "import sys\n"
        "finders = list(sys.meta_path)\n"
        "import verl, importlib\n"
        "unhooked = sys.meta_path == finders  # (verl's trainers' own imports may add finders)\n"
        "from grrm_client.adapters.verl.verl_metrics import TRAINER_MODULES\n"
        "def wrapped():\n"
        "    return [getattr(module.PPOTrainer._compute_metrics if name.endswith('v1.trainer_base')\n"
        "                    else module.compute_data_metrics, '_grrm_step_metrics', False)\n"
        "            for name, module in ((name, importlib.import_module(name)) for name in TRAINER_MODULES)]\n"
        "before = wrapped()\n"
        "from verl.utils.tracking import Tracking\n"
        "Tracking(project_name='p', experiment_name='e', default_backend=[])\n"
        "print([unhooked, 'trainer_bridge.verl_plugin' in sys.modules, before, wrapped()])\n"
    )
    assert run_python(probe, VERL_USE_EXTERNAL_MODULES="trainer_bridge.verl_plugin") == (
        "[True, True, [False, False, False], [True, True, True]]")


def test_the_plugin_refuses_a_verl_it_does_not_know(monkeypatch):
    """Opting in on another verl stops that process with an error naming the version found and the
    versions the plugin knows, and wraps nothing."""
    import verl
    from verl.utils.tracking import Tracking

    from grrm_client.adapters.verl.verl_metrics import KNOWN_VERL_VERSIONS

    init = Tracking.__init__
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(RuntimeError, match=r"verl 0\.10\.0 is not a version this plugin knows \(0\.9\.1\)"):
        importlib.import_module("trainer_bridge.verl_plugin")
    assert KNOWN_VERL_VERSIONS == ("0.9.1",) and Tracking.__init__ is init
    assert "trainer_bridge.verl_plugin" not in sys.modules
