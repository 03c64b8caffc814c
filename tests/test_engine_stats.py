"""An engine's scheduler figures (KV cache use, running and waiting requests, preemptions) reach the replica's
metrics: the recorder vLLM's stat logger writes (``cluster/engines/base.py``), the scripted engine's own
queue, and the export into the replica's gauges and counter (``deployments/metrics.py``). vLLM's real stat
objects feed the recorder in tests/engines/test_vllm_engine.py."""

from __future__ import annotations

import asyncio

from cluster.engines import EngineConfig, SamplingSettings, make_engine
from cluster.engines.base import EngineStats, EngineStatsRecorder, ReportingEngine
from deployments.metrics import ReplicaMetrics, export_engine_stats


def test_the_recorder_keeps_the_latest_report_and_the_preemptions_so_far():
    recorder = EngineStatsRecorder()
    assert recorder.snapshot() is None  # no step yet: no figures, not zeros
    recorder.scheduler(running=4, waiting=2, kv_cache_usage=0.5)
    recorder.preempted(3)
    recorder.scheduler(running=6, waiting=0, kv_cache_usage=0.75)
    recorder.preempted(1)
    assert recorder.snapshot() == EngineStats(running=6, waiting=0, kv_cache_usage=0.75, preemptions=4)


class Recorded:
    """Stands in for one Ray metric: what was set or added."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)

    def inc(self, value: float = 1.0) -> None:
        self.values.append(value)


def recorded_metrics() -> ReplicaMetrics:
    metrics = ReplicaMetrics()
    for name in ("engine_kv_cache_usage", "engine_requests_running", "engine_requests_waiting", "engine_preemptions"):
        setattr(metrics, name, Recorded())
    return metrics


def test_the_export_sets_the_gauges_and_adds_only_new_preemptions():
    metrics = recorded_metrics()
    metrics.record_engine_stats(EngineStats(running=5, waiting=3, kv_cache_usage=0.4, preemptions=2))
    metrics.record_engine_stats(EngineStats(running=7, waiting=0, kv_cache_usage=0.9, preemptions=2))
    metrics.record_engine_stats(EngineStats(running=7, waiting=1, kv_cache_usage=0.95, preemptions=5))
    assert metrics.engine_requests_running.values == [5, 7, 7]
    assert metrics.engine_requests_waiting.values == [3, 0, 1]
    assert metrics.engine_kv_cache_usage.values == [0.4, 0.9, 0.95]
    assert metrics.engine_preemptions.values == [2, 3]  # the counter grows by what is new, never by 0


def test_an_engine_without_a_kv_cache_exports_only_its_queue():
    metrics = recorded_metrics()
    metrics.record_engine_stats(EngineStats(running=1, waiting=2))
    assert metrics.engine_requests_running.values == [1] and metrics.engine_requests_waiting.values == [2]
    assert metrics.engine_kv_cache_usage.values == [] and metrics.engine_preemptions.values == []


def test_a_restarted_count_of_preemptions_is_all_new():
    metrics = recorded_metrics()
    metrics.record_engine_stats(EngineStats(running=0, waiting=0, kv_cache_usage=0.0, preemptions=10))
    metrics.record_engine_stats(EngineStats(running=0, waiting=0, kv_cache_usage=0.0, preemptions=4))
    assert metrics.engine_preemptions.values == [10, 4]


class OneReport:
    """An engine whose figures are there once asked for the second time."""

    def __init__(self) -> None:
        self.asked = 0
        self.reported = asyncio.Event()

    def stats(self) -> EngineStats | None:
        self.asked += 1
        if self.asked == 1:
            return None
        self.reported.set()
        return EngineStats(running=2, waiting=1, kv_cache_usage=0.25, preemptions=0)


async def test_the_export_loop_copies_the_figures_once_there_are_any():
    engine, metrics = OneReport(), recorded_metrics()
    assert isinstance(engine, ReportingEngine)
    loop = asyncio.ensure_future(export_engine_stats(engine, metrics, period_s=0))
    await engine.reported.wait()
    await asyncio.sleep(0)  # the loop copies what it was given
    loop.cancel()
    assert metrics.engine_requests_running.values[:1] == [2] and metrics.engine_kv_cache_usage.values[:1] == [0.25]


async def test_the_scripted_engine_reports_its_own_queue_and_no_kv_cache():
    engine = make_engine(EngineConfig(kind="scripted", scripted={"per_prompt_s": 3600.0, "max_concurrent_prompts": 1}))
    await engine.start()
    assert engine.stats() == EngineStats(running=0, waiting=0)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                                  add_generation_prompt=True)
    calls = [asyncio.ensure_future(engine.generate([prompt], SamplingSettings())) for _ in range(3)]
    for _ in range(1000):  # until the three calls reached the engine: one holds the only slot, two wait for it
        if engine.stats() == EngineStats(running=1, waiting=2):
            break
        await asyncio.sleep(0)
    assert engine.stats() == EngineStats(running=1, waiting=2)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    assert engine.stats() == EngineStats(running=0, waiting=0)
    await engine.stop()
