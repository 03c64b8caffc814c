"""The node fleet (simulated/node_fleet.py): every state a GPU node can be in that the pre-flight knows of,
built here from stand-ins (nvidia-smi, the GPU build's package metadata, model directories and hub caches,
/dev/shm's size) and judged by the real `grrm check deployments/grrm.yaml`: the verdict per check and a key
phrase of each fix. Most run through the CLI's main() in this process (its environment and import path as
the command's process would have them); a few run as the user runs them, the installed console script in
a process of its own. A replica's start runs the same checks and fails in seconds with the same words, and
the vLLM engine refuses the CPU fallback on such a node."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
import yaml

from cluster.engines.base import EngineError
from cluster.engines.config import EngineConfig
from cluster.engines.gpu_devices import read_gpus
from deployments.config import AppConfig, application_args
from deployments.preflight import PreflightError
from cluster.engines.versions import ENGINE_PACKAGES, GPU_INSTALL_CUDA_MAJOR
from simulated.node_fleet import (CASES, CUDA_BUILD, GRRM_YAML, ROOT, TORCH_CUDA_REQUIRES, build_world, case_environment,
                                  run_case, world_root)
from simulated.nvidia_smi import answer

pytestmark = pytest.mark.filterwarnings("ignore:coroutine .GRRMReplica.__del__. was never awaited")
# As the user runs it (the console script, a process of its own); the read-only caches always are, as root.
AS_THE_USER = {"driver-550", "cpu-build-on-gpu-node"}
CASE = {case.name: case for case in CASES}


@pytest.fixture(scope="module")
def root():
    with world_root() as path:
        yield path


def test_the_fleet_holds_the_states_the_issue_lists():
    assert len(CASES) >= 12
    assert {"driver-535", "driver-550", "driver-570", "h100x8-driver-580", "shared-4-of-8-held", "mig-3g.40gb",
            "cuda-visible-devices-hides-all", "cpu-build-on-gpu-node", "partial-hub-cache", "read-only-cache-online",
            "read-only-cache-offline", "offline-not-cached", "small-shm-tp2"} <= set(CASE)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_grrm_check_judges_each_node_state_right(case, root):
    result = run_case(case, root, in_process=case.name not in AS_THE_USER)
    assert not result.mismatches(), "\n".join(result.mismatches()) + "\n" + result.output
    assert "Traceback" not in result.output


def test_the_stand_in_gpu_build_is_the_images_lock():
    """The stand-in packages are the image's (a lock bump that forgets them fails here), and so is the CUDA
    major a CPU build's driver is judged against."""
    lock = dict(re.findall(r"^([a-z0-9-]+)==(\S+)", (ROOT / "requirements" / "image-service.lock.txt").read_text(), re.M))
    for name, version, _ in CUDA_BUILD:
        assert lock[name.replace("_", "-")] == version, name
    assert int(lock["cuda-toolkit"].split(".")[0]) == GPU_INSTALL_CUDA_MAJOR
    assert lock["vllm"] == ENGINE_PACKAGES["vllm"].tested_version
    assert "cuda-toolkit[" in TORCH_CUDA_REQUIRES[0] and f"=={lock['cuda-toolkit'].removesuffix('.0')};" in TORCH_CUDA_REQUIRES[0]


def test_the_stand_in_answers_as_nvidia_smi_does():
    case = {"driver_version": "580.95.05", "failure": None,
            "gpus": [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                      "memory_used_mib": 5}]}
    assert answer(case, ["--query-gpu=index,memory.used,driver_version", "--format=csv,noheader,nounits"]) == 0
    assert answer(case, ["--query-gpu=clocks.bogus", "--format=csv"]) == 2
    assert answer(case, ["--bogus"]) == 2
    assert answer({**case, "failure": {"exit_code": 9, "message": "NVIDIA-SMI has failed"}}, ["-L"]) == 9


def test_mig_devices_are_read_as_cuda_sees_them(root):
    """MIG devices named in CUDA_VISIBLE_DEVICES are the devices; unnamed, a MIG-mode GPU stands for its first."""
    world = build_world(CASE["mig-3g.40gb"], root / "mig-read")
    with case_environment(world):
        named = read_gpus(os.environ["CUDA_VISIBLE_DEVICES"])
        unnamed = read_gpus(None)
        by_index = read_gpus("0")
    assert [gpu.mig_profile for gpu in named.gpus] == ["3g.40gb", "3g.40gb"] and named.driver_version == "580.95.05"
    assert named.gpus[0].total_bytes == 40 * 10**9 and named.gpus[0].uuid.startswith("MIG-")
    assert [gpu.uuid for gpu in unnamed.gpus] == [named.gpus[0].uuid] == [gpu.uuid for gpu in by_index.gpus]
    assert "1 in MIG mode with 2 MIG device(s)" in unnamed.note


def grrm_yaml() -> AppConfig:
    return AppConfig.model_validate(application_args(yaml.safe_load(GRRM_YAML.read_text())))


async def test_a_replica_on_a_fleet_node_fails_before_its_engine_with_grrm_checks_words(root):
    from deployments.preflight import check_node, report
    from deployments.replica import GRRMReplica

    config = grrm_yaml()
    world = build_world(CASE["driver-550"], root / "replica-driver-550")
    replica = GRRMReplica.__new__(GRRMReplica)
    with case_environment(world):
        with pytest.raises(PreflightError) as error:
            await replica.__init__(config)
        node_problems = report([finding for finding in check_node(config, http_host="0.0.0.0") if finding.problem])
    assert not hasattr(replica, "engine")  # refused before an engine was made
    message = str(error.value)
    assert "[PROBLEM] driver: NVIDIA driver 550.163.01 (R550)" in message and "R580 or later" in message
    assert node_problems in message  # `grrm check` printed the same lines for this node


def test_the_vllm_engine_refuses_the_cpu_fallback_where_the_driver_lists_gpus_torch_cannot_use(root, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what torch says under a too-old driver
    world = build_world(CASE["driver-550"], root / "engine-driver-550")
    from cluster.engines.vllm import VLLMEngine

    engine = VLLMEngine(EngineConfig(model="double7/Qwen2.5-7B-GRRM"))
    with case_environment(world), pytest.raises(EngineError) as error:
        asyncio.run(engine.start())
    message = str(error.value)
    assert "nvidia-smi lists 8 GPU(s) (NVIDIA H100 80GB HBM3)" in message and "built for CUDA 13" in message
    assert "driver 550.163.01 is older than R580" in message and not engine.started


def test_the_cpu_build_on_a_gpu_node_still_runs_on_the_cpu(root, monkeypatch):
    """The engine's own decision leaves a deliberate CPU build alone (grrm check flags it for GPU replicas)."""
    from cluster.engines.vllm import CPU_ENV_DEFAULTS, apply_cpu_env_defaults

    for name, value in CPU_ENV_DEFAULTS.items():  # undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    world = build_world(CASE["cpu-build-on-gpu-node"], root / "engine-cpu-build")
    with case_environment(world):
        assert apply_cpu_env_defaults() == CPU_ENV_DEFAULTS


def test_the_bench_writes_the_fleet_table(tmp_path, monkeypatch):
    import json

    from bench.node_fleet import main, report_section

    monkeypatch.setenv("GRRM_BENCH_RESULTS", str(tmp_path))
    assert main(["--quick", "--only", "h100x8-driver-580,partial-hub-cache"]) == 0
    rows = json.loads((tmp_path / "node_fleet.json").read_text())
    assert [(row["state"], row["verdict"], row["as_expected"]) for row in rows] == [
        ("h100x8-driver-580", "ok", True), ("partial-hub-cache", "PROBLEM model", True)]
    assert "`HF_HOME=<node>/hf-home hf download double7/Qwen2.5-7B-GRRM`" in rows[1]["fix"]  # the same every run
    section = report_section(rows)
    assert section.startswith("## ") and "| partial-hub-cache | PROBLEM model |" in section
