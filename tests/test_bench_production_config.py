"""bench/production_config.py (the GPU smoke run's grrm.yaml step): grrm.yaml's engine and scoring blocks
with only what a machine lacks swapped, each swap said; and on the CPU the path the lent GPU machine
takes (no vLLM, no checkpoint: the transformers engine on the tiny model, grrm.yaml's bf16 and limits)."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.production_config import GRRM_YAML, TINY_MODEL_ANSWER_TOKENS, demo_groups, machine_config, score
from deployments.config import load_app_config


def test_nothing_is_swapped_where_the_machine_has_everything():
    shipped = load_app_config(GRRM_YAML)
    config, swaps = machine_config(shipped, model_found=True, vllm_importable=True, tiny_model="/m")
    assert swaps == [] and config == shipped


def test_only_what_the_machine_lacks_is_swapped_and_each_swap_is_said():
    shipped = load_app_config(GRRM_YAML)
    config, swaps = machine_config(shipped, model_found=False, vllm_importable=False, tiny_model="/m")
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
    config, swaps = machine_config(shipped, model_found=False, vllm_importable=True, tiny_model="/m")
    assert config.engine.kind == "vllm" and config.engine.max_num_seqs == 256
    assert "engine.kind" not in {swap.field for swap in swaps}


@pytest.mark.slow
def test_the_lent_gpu_machines_path_scores_every_demo_group_on_the_cpu(tmp_path):
    from cluster.tiny_model import build_tiny_model

    shipped = load_app_config(GRRM_YAML)
    model = build_tiny_model(tmp_path / "tiny-long", max_positions=shipped.engine.max_model_len)
    # The stand-in declares grrm.yaml's context, so max_model_len stays grrm.yaml's.
    assert json.loads((model / "config.json").read_text())["max_position_embeddings"] == shipped.engine.max_model_len
    config, _ = machine_config(shipped, model_found=False, vllm_importable=False, tiny_model=str(model))
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"device": "cpu"})})
    row = asyncio.run(score(config, demo_groups(3)))
    assert row["engine"] == "transformers" and row["dtype"] == "bfloat16"
    assert row["groups"] == row["valid"] == 3, row
