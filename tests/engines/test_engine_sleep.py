"""Engines that sleep (``cluster.engines.base.SleepingEngine``): the scripted engine, vLLM's wrapper.

vLLM's sleep mode needs CUDA, so on the CPU the wrapper's logic (what it asks of ``AsyncLLM``, what it
refuses) is checked against a stand-in of the three ``AsyncLLM`` calls it uses; a GPU runs the real
thing (the last test here, and ``scripts/gpu_smoke.sh``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from cluster.engines import EngineConfig, EngineError, SamplingSettings, SleepingEngine, make_engine
from cluster.engines.base import apply_chat_template
from cluster.engines.config import ScriptedEngineOptions
from cluster.engines.vllm import VLLMEngine, engine_args_kwargs
from simulated.scripted_engine import ScriptedEngine

SAMPLING = SamplingSettings(max_tokens=8)


def scripted(sleep_mode: bool = True, wake_s: float = 0.0) -> ScriptedEngine:
    engine = make_engine(EngineConfig(kind="scripted", sleep_mode=sleep_mode,
                                      scripted=ScriptedEngineOptions(wake_s=wake_s)))
    assert isinstance(engine, ScriptedEngine)
    return engine


@pytest.mark.parametrize("kind", ["transformers", "sglang"])
def test_sleep_mode_is_refused_for_an_engine_that_cannot_sleep(kind):
    with pytest.raises(ValidationError, match=rf"engine\.sleep_mode: the {kind} engine cannot sleep"):
        EngineConfig(kind=kind, model="m", sleep_mode=True)


def test_sleep_mode_goes_through_the_typed_field_not_engine_kwargs():
    with pytest.raises(ValidationError, match=r"engine\.engine_kwargs\.enable_sleep_mode: set replicas\.autoscaling"):
        EngineConfig(kind="vllm", model="m", engine_kwargs={"enable_sleep_mode": True})
    assert engine_args_kwargs(EngineConfig(kind="vllm", model="m", sleep_mode=True))["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in engine_args_kwargs(EngineConfig(kind="vllm", model="m"))


async def test_the_scripted_engine_sleeps_generates_nothing_asleep_and_wakes_after_wake_s():
    engine = scripted(wake_s=0.2)
    await engine.start()
    assert isinstance(engine, SleepingEngine) and not engine.sleeping
    await engine.sleep()
    await engine.sleep()  # idempotent: one sleep counted
    assert engine.sleeping and engine.sleeps == 1
    with pytest.raises(EngineError, match="asleep: wake_up"):
        await engine.generate(["a prompt"], SAMPLING)
    await engine.check_health()  # a sleeping engine is healthy
    waking = asyncio.ensure_future(engine.wake_up())
    await asyncio.sleep(0)
    assert engine.sleeping and engine.wakes == 0  # loading its weights back (wake_s): not awake at once
    await waking
    assert not engine.sleeping and engine.wakes == 1
    [generation] = await engine.generate(["a prompt"], SAMPLING)
    assert generation.completion_tokens > 0
    await engine.wake_up()  # awake already: nothing to wait for
    assert engine.wakes == 1
    await engine.stop()


async def test_a_scripted_engine_built_without_sleep_mode_refuses_to_sleep_as_vllm_does():
    engine = scripted(sleep_mode=False)
    await engine.start()
    with pytest.raises(EngineError, match="engine.sleep_mode is off"):
        await engine.sleep()
    assert not engine.sleeping


class _AsyncLLMStandIn:
    """The three ``AsyncLLM`` calls the wrapper makes for sleep mode (vLLM 0.32's signatures)."""

    errored = False

    def __init__(self, wakes_fully: bool = True):
        self.asleep = False
        self.levels: list[int] = []
        self.wakes_fully = wakes_fully

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.levels.append(level)
        self.asleep = True

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.asleep = not self.wakes_fully
        return self.wakes_fully

    async def is_sleeping(self) -> bool:
        return self.asleep


def vllm_with(stand_in: _AsyncLLMStandIn, sleep_mode: bool = True) -> VLLMEngine:
    engine = VLLMEngine(EngineConfig(kind="vllm", model="m", sleep_mode=sleep_mode))
    engine._engine, engine._started = stand_in, True  # started: what start() leaves behind
    return engine


async def test_the_vllm_engine_sleeps_at_level_1_refuses_to_generate_asleep_and_wakes():
    stand_in = _AsyncLLMStandIn()
    engine = vllm_with(stand_in)
    assert isinstance(engine, SleepingEngine)
    await engine.sleep()
    await engine.sleep()
    assert engine.sleeping and stand_in.levels == [1]  # level 1: weights to CPU memory, KV cache freed
    with pytest.raises(EngineError, match="asleep: wake_up"):
        await engine.generate(["a prompt"], SAMPLING)
    await engine.wake_up()
    assert not engine.sleeping and not stand_in.asleep


async def test_the_vllm_engine_refuses_to_sleep_without_sleep_mode_and_says_when_it_did_not_wake():
    stand_in = _AsyncLLMStandIn()
    with pytest.raises(EngineError, match="engine.sleep_mode is off"):
        await vllm_with(stand_in, sleep_mode=False).sleep()
    assert stand_in.levels == []
    half_awake = vllm_with(_AsyncLLMStandIn(wakes_fully=False))
    await half_awake.sleep()
    with pytest.raises(EngineError, match="still sleeping after wake_up"):
        await half_awake.wake_up()
    assert half_awake.sleeping


def _cuda_and_vllm() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow
@pytest.mark.skipif(not _cuda_and_vllm(), reason="vLLM's sleep mode needs CUDA (the CPU tests above cover the "
                                                 "wrapper's logic; scripts/gpu_smoke.sh runs this on a GPU)")
async def test_a_real_vllm_engine_on_cuda_sleeps_frees_memory_wakes_and_scores_a_group(tiny_model_dir: Path):
    import torch

    from cluster.config import ScoringConfig
    from cluster.protocol.schema import GroupRequest
    from cluster.scorer import GroupScorer

    engine = VLLMEngine(EngineConfig(kind="vllm", model=str(tiny_model_dir), max_model_len=2048, seed=0,
                                     gpu_memory_utilization=0.3, sleep_mode=True,
                                     engine_kwargs={"enforce_eager": True}))
    await engine.start()
    try:
        prompt = apply_chat_template(engine.tokenizer, "Translate into German: the cat sat on the mat.")
        [before] = await engine.generate([prompt], SAMPLING)
        free_awake = torch.cuda.mem_get_info()[0]
        await engine.sleep()
        assert engine.sleeping and await engine._engine.is_sleeping()
        assert torch.cuda.mem_get_info()[0] > free_awake  # the KV cache and weights left the GPU
        await engine.check_health()
        started = time.monotonic()
        await engine.wake_up()
        woke_in = time.monotonic() - started
        [after] = await engine.generate([prompt], SAMPLING)
        assert after.text == before.text, "greedy output changed across sleep (weights not restored)"
        # A GQM group on the woken engine (verdict repair: the tiny model's weights are random).
        scorer = GroupScorer(engine, ScoringConfig(verdict_repair=True, max_answer_tokens=64))
        result = await scorer.score_group(GroupRequest(source="Der Hund schläft.", candidates=[
            "The dog sleeps.", "The dog is sleeping.", "Dog sleep."], src_lang="de", trg_lang="en"))
        assert result.valid and result.scores is not None and len(result.scores) == 3, (result.failure, result.error)
        print(f"vLLM sleep mode level 1: woke in {woke_in:.2f} s; group scored {result.scores}")
    finally:
        await engine.stop()
