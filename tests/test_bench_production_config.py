"""bench/production_config.py (the GPU smoke run's grrm.yaml step): grrm.yaml's engine and scoring blocks
with only what a machine lacks swapped, each swap said; and on the CPU the path the lent GPU machine
takes (no vLLM, no checkpoint: the transformers engine on the tiny model, grrm.yaml's bf16 and limits). A run
with a swap never counts as a run of the production config: its own exit status (3) and a line naming the swaps."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.production_config import (
    GRRM_YAML,
    NOT_RUN,
    SWAPPED_EXIT,
    TINY_MODEL_ANSWER_TOKENS,
    Swap,
    demo_groups,
    machine_config,
    score,
    verdict,
)
from deployments.config import load_app_config


def test_nothing_is_swapped_where_the_machine_has_everything():
    shipped = load_app_config(GRRM_YAML)
    config, swaps = machine_config(shipped, model_found=True, vllm_importable=True, cuda_device=True, tiny_model="/m")
    assert swaps == [] and config == shipped


def test_only_what_the_machine_lacks_is_swapped_and_each_swap_is_said():
    shipped = load_app_config(GRRM_YAML)
    config, swaps = machine_config(shipped, model_found=False, vllm_importable=False, cuda_device=True,
                                   tiny_model="/m")
    assert {swap.field for swap in swaps} == {
        "engine.model", "engine.kind", "engine.scheduling", "engine.engine_kwargs", "engine.max_num_seqs",
        "engine.max_num_batched_tokens", "scoring.max_answer_tokens", "scoring.verdict_repair", "scoring.retries"}
    assert config.engine.kind == "transformers" and config.engine.model == "/m"
    assert config.engine.engine_kwargs == {"max_batch_size": shipped.engine.max_num_seqs}
    # The rest is grrm.yaml's.
    for field in ("dtype", "max_model_len", "enable_prefix_caching", "gpu_memory_utilization", "tensor_parallel_size"):
        assert getattr(config.engine, field) == getattr(shipped.engine, field), field
    for field in ("prompt_type", "max_prompt_tokens", "temperature", "retry_temperature", "max_group_size"):
        assert getattr(config.scoring, field) == getattr(shipped.scoring, field), field
    assert config.scoring.max_answer_tokens == TINY_MODEL_ANSWER_TOKENS and config.scoring.verdict_repair
    # vLLM present, the checkpoint missing: the engine block stays vLLM's.
    config, swaps = machine_config(shipped, model_found=False, vllm_importable=True, cuda_device=True,
                                   tiny_model="/m")
    assert config.engine.kind == "vllm" and config.engine.max_num_seqs == 256
    assert "engine.kind" not in {swap.field for swap in swaps}


def test_a_machine_without_a_cuda_device_is_a_swap_too():
    # vLLM's CPU build and the checkpoint present (this machine with the 7B downloaded): still not production.
    shipped = load_app_config(GRRM_YAML)
    config, swaps = machine_config(shipped, model_found=True, vllm_importable=True, cuda_device=False,
                                   tiny_model="/m")
    assert [(swap.field, swap.shipped, swap.here) for swap in swaps] == [("replicas.gpus_per_rank", 1.0, 0.0)]
    assert config.replicas.gpus_per_rank == 0 and config.engine == shipped.engine


ROW = {"groups": 4, "valid": 4, "failures": []}


def test_only_the_shipped_config_with_every_group_valid_is_a_pass():
    assert verdict(ROW, []) == (0, "[production-config] production config ran as shipped: 4 of 4 groups valid")


def test_a_swapped_run_is_not_a_run_of_the_production_config_and_says_what_was_swapped():
    swaps = [Swap("engine.model", "double7/Qwen2.5-7B-GRRM", "/m", "missing"),
             Swap("engine.kind", "vllm", "transformers", "no vLLM")]
    status, line = verdict(ROW, swaps)
    assert status == SWAPPED_EXIT != 0
    assert f"{NOT_RUN} engine.model, engine.kind" in line


def test_a_group_without_a_verdict_fails_swapped_or_not():
    row = {"groups": 4, "valid": 3, "failures": ["parse_failed"]}
    for swaps in ([], [Swap("engine.kind", "vllm", "transformers", "no vLLM")]):
        status, line = verdict(row, swaps)
        assert status == 1 and "FAILED: 1 of 4 groups got no verdict (parse_failed)" in line


@pytest.mark.slow
def test_the_lent_gpu_machines_path_scores_every_demo_group_on_the_cpu(tmp_path):
    from cluster.tiny_model import build_tiny_model

    shipped = load_app_config(GRRM_YAML)
    model = build_tiny_model(tmp_path / "tiny-long", max_positions=shipped.engine.max_model_len)
    # The stand-in declares grrm.yaml's context, so max_model_len stays grrm.yaml's.
    assert json.loads((model / "config.json").read_text())["max_position_embeddings"] == shipped.engine.max_model_len
    config, swaps = machine_config(shipped, model_found=False, vllm_importable=False, cuda_device=False,
                                   tiny_model=str(model))
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"device": "cpu"})})
    row = asyncio.run(score(config, demo_groups(3)))
    assert row["engine"] == "transformers" and row["dtype"] == "bfloat16"
    assert row["groups"] == row["valid"] == 3, row
    assert verdict(row, swaps)[0] == SWAPPED_EXIT  # every group scored, yet not the production config
