"""vLLM's own engine arguments, built from every shipped config's engine block: a renamed or removed
vLLM argument, or a value vLLM refuses, fails here and not at a user's first start on a GPU.

Each config's ``engine_args_kwargs`` goes through ``AsyncEngineArgs(**kwargs)`` and all of
``create_engine_config`` (model config from the checkpoint's config.json, scheduler, cache, parallel
layout), as ``AsyncLLM.from_engine_args`` runs it, on the CPU build of vLLM (the tested version; the
GPU build is the same Python code above the kernels). Only the model path is swapped: grrm.yaml's
checkpoint cannot be downloaded here, so a directory holding Qwen2.5-7B's config.json (GRRM's base, see
tests/data/README.md) and the tiny model's tokenizer stands in for it. What vLLM does with the GPU
itself (memory profiling, CUDA graphs, NCCL) never runs here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.engines.config import VLLM_ENGINE_DEFAULT_MAX_NUM_SEQS, EngineConfig
from cluster.engines.vllm import engine_args_kwargs
from deployments.config import AppConfig, application_args

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("vllm_engine_config_probe.py")

# runs_last: it starts vLLM's config code in subprocesses (~30 s of CPU), tests/conftest.py.
pytestmark = [pytest.mark.timeout(300), pytest.mark.runs_last]


def shipped_engine(name: str, **overrides) -> EngineConfig:
    args = application_args(yaml.safe_load((ROOT / "deployments" / name).read_text()))
    args["engine"].update(overrides)
    return AppConfig.model_validate(args).engine


@pytest.fixture(scope="module")
def seven_b_checkpoint(tmp_path_factory, tiny_model_dir) -> Path:
    """Qwen2.5-7B's config.json with the tiny model's tokenizer: what vLLM reads before loading weights."""
    directory = tmp_path_factory.mktemp("qwen2.5-7b-shape")
    shutil.copy(ROOT / "tests" / "data" / "qwen2.5-7b-config.json", directory / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def engines(seven_b_checkpoint, tiny_model_dir) -> dict[str, EngineConfig]:
    """Every shipped engine block (k8s/rayservice-grrm.yaml embeds grrm.yaml's, tests/test_k8s.py holds them
    equal), each with a model directory of this machine."""
    return {
        "grrm.yaml": shipped_engine("grrm.yaml", model=str(seven_b_checkpoint)),
        "grrm.yaml, TP 2": shipped_engine("grrm.yaml", model=str(seven_b_checkpoint), tensor_parallel_size=2),
        "local.yaml": shipped_engine("local.yaml", model=str(tiny_model_dir)),
        "unset batch": EngineConfig(kind="vllm", model=str(tiny_model_dir), dtype="float32", max_model_len=4096),
    }


@pytest.fixture(scope="module")
def built(engines, tmp_path_factory) -> dict[str, dict]:
    """What vLLM's create_engine_config made of each engine block (one process of its own for all)."""
    result = tmp_path_factory.mktemp("probe") / "engine-configs.json"
    kwargs = {name: engine_args_kwargs(engine) for name, engine in engines.items()}
    completed = subprocess.run([sys.executable, str(PROBE), str(result)], input=json.dumps(kwargs),
                               capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-3000:]
    return json.loads(result.read_text())


def test_grrm_yaml_builds_vllms_engine_config_with_its_batch_and_context(engines, built):
    engine, vllm = engines["grrm.yaml"], built["grrm.yaml"]
    assert vllm["max_num_seqs"] == engine.max_num_seqs == 256
    assert vllm["max_num_batched_tokens"] == engine.max_num_batched_tokens == 16384
    assert vllm["max_model_len"] == engine.max_model_len == 16384
    assert vllm["dtype"] == "bfloat16" and vllm["enable_prefix_caching"] is True
    assert vllm["scheduler_policy"].endswith("priority")  # scheduling: largest_first
    assert vllm["tensor_parallel_size"] == 1 and vllm["pipeline_parallel_size"] == 1


def test_grrm_yamls_tensor_parallel_variant_builds_an_mp_executor(built):
    vllm = built["grrm.yaml, TP 2"]
    assert vllm["tensor_parallel_size"] == 2 and vllm["distributed_executor_backend"] == "mp"
    assert vllm["max_num_seqs"] == 256


def test_local_yaml_builds_vllms_engine_config(built):
    vllm = built["local.yaml"]
    assert vllm["max_model_len"] == 4096 and vllm["max_num_batched_tokens"] == 8192 and vllm["dtype"] == "float32"


def test_an_unset_batch_gets_the_engine_context_default_the_replica_plans_for(engines, built):
    """Without max_num_seqs, AsyncLLM's engine gets SchedulerConfig.DEFAULT_MAX_NUM_SEQS on a GPU (its larger
    per-GPU defaults are keyed to `LLM` and the API server only): what EngineConfig.batch_slots() assumes."""
    assert built["unset batch"]["default_max_num_seqs"] == VLLM_ENGINE_DEFAULT_MAX_NUM_SEQS
    assert built["unset batch"]["max_num_seqs"] == VLLM_ENGINE_DEFAULT_MAX_NUM_SEQS
    assert engines["unset batch"].batch_slots() == VLLM_ENGINE_DEFAULT_MAX_NUM_SEQS
