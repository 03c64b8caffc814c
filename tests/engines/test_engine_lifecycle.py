"""The engine lifecycle written once (cluster/engines/lifecycle.py), on a tiny engine of our own:
no model, no torch, fast."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.engines import Engine, EngineConfig, EngineError
from cluster.engines.base import TokenizerNotReadyError
from cluster.engines.lifecycle import EngineBase
from simulated.scripted_engine import ScriptedTokenizer


class CountingEngine(EngineBase):
    """Counts its loads and releases; a load takes a moment, so that starts can overlap."""

    name = "counting"

    def __init__(self, config: EngineConfig, fail_starts: int = 0):
        super().__init__(config)
        self.starts = 0
        self.stops = 0
        self.fail_starts = fail_starts  # this many loads fail first

    async def _start(self) -> None:
        await asyncio.sleep(0.02)
        if self.fail_starts:
            self.fail_starts -= 1
            raise EngineError("could not load")
        self.starts += 1
        self._tokenizer = ScriptedTokenizer()

    async def _stop(self) -> None:
        await asyncio.sleep(0.02)
        self.stops += 1
        self._tokenizer = None

    async def generate(self, prompts, sampling, priority=0):
        self._require_started()
        return []

    async def check_health(self) -> None:
        self._require_started()


class ModelFreeEngine(CountingEngine):
    requires_model = False


def counting(model: str = "m", **kwargs) -> CountingEngine:
    return CountingEngine(EngineConfig(kind="transformers", model=model), **kwargs)


async def test_concurrent_starts_load_once_and_stops_release_once():
    engine = counting()
    await asyncio.gather(*(engine.start() for _ in range(5)))
    assert engine.started and engine.starts == 1
    await engine.check_health()
    await asyncio.gather(*(engine.stop() for _ in range(3)))
    await engine.stop()
    assert not engine.started and engine.stops == 1


async def test_a_stop_waits_for_a_start_under_way_and_a_start_after_stop_loads_again():
    engine = counting()
    start = asyncio.ensure_future(engine.start())
    await asyncio.sleep(0)
    await engine.stop()  # serialised behind the start: it then releases what that start loaded
    assert start.done() and (engine.starts, engine.stops) == (1, 1) and not engine.started
    await engine.start()
    assert engine.started and engine.starts == 2
    await engine.stop()


async def test_stop_before_start_does_nothing():
    engine = counting()
    await engine.stop()
    assert engine.stops == 0 and not engine.started


async def test_a_failed_start_leaves_the_engine_not_started_and_a_later_start_tries_again():
    engine = counting(fail_starts=1)
    with pytest.raises(EngineError, match="could not load"):
        await engine.start()
    assert not engine.started
    await engine.stop()
    assert engine.stops == 0  # a failed start releases its own: stop has nothing to do
    await engine.start()
    assert engine.started and engine.starts == 1


async def test_a_cancelled_start_leaves_the_engine_not_started():
    engine = counting()
    start = asyncio.ensure_future(engine.start())
    await asyncio.sleep(0.005)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert not engine.started
    await engine.start()  # the lock was released
    assert engine.started


async def test_the_model_check_names_config_model_and_loads_nothing():
    engine = counting(model="")
    with pytest.raises(EngineError, match=r"config\.model"):
        await engine.start()
    assert engine.starts == 0 and not engine.started
    free = ModelFreeEngine(EngineConfig(kind="scripted"))
    await free.start()
    assert free.started


async def test_a_not_started_engine_refuses_work_naming_itself():
    engine = counting()
    with pytest.raises(EngineError, match="the counting engine is not started.*call start"):
        await engine.check_health()
    await engine.start()
    await engine.stop()
    with pytest.raises(EngineError, match="not started"):
        await engine.generate(["x"], None)


async def test_the_tokenizer_before_start_is_an_engine_error_and_an_attribute_error():
    engine = counting()
    with pytest.raises(TokenizerNotReadyError, match=r"call start\(\) first") as caught:
        engine.tokenizer
    assert isinstance(caught.value, EngineError) and isinstance(caught.value, AttributeError)
    assert not hasattr(engine, "tokenizer")
    assert not isinstance(engine, Engine)  # the protocol check probes with hasattr: no error
    await engine.start()
    assert isinstance(engine.tokenizer, ScriptedTokenizer) and isinstance(engine, Engine)
    await engine.stop()


def test_the_base_needs_both_hooks():
    class Half(EngineBase):
        name = "half"

        async def _start(self) -> None:
            pass

    with pytest.raises(TypeError, match="_stop"):
        Half(EngineConfig(kind="scripted"))


def test_the_lifecycle_module_imports_no_engine_package():
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, cluster.engines.lifecycle\n"
        "heavy = [m for m in ('torch', 'vllm', 'sglang', 'ray', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
