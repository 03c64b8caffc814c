"""The SGLang adapter, on a machine without SGLang.

The pure conversions are tested directly. The adapter's wiring (what it passes to
``sglang.Engine`` and ``async_generate``, how it maps outputs, start/stop/health) is tested
against a FAKE ``sglang`` module injected into ``sys.modules``: it mimics the package's API
shape only and says nothing about SGLang's behaviour. Real SGLang runs are GPU tests elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import types

import pytest

import cluster.engines.sglang as sglang_adapter
from cluster.engines import Engine, EngineConfig, EngineError, SamplingSettings, make_engine
from simulated.scripted_engine import ScriptedTokenizer
from cluster.engines.sglang import (
    SGLangEngine,
    generation_from_sglang_output,
    sglang_engine_kwargs,
    sglang_sampling_params,
)

# Sampling-params keys of sglang.srt.sampling.sampling_params.SamplingParams that the adapter
# may use (verified against SGLang's source; see the module docstring).
SGLANG_SAMPLING_KEYS = {"temperature", "top_p", "max_new_tokens", "stop", "regex", "sampling_seed"}
# ServerArgs fields the adapter may set.
SGLANG_SERVER_ARGS = {
    "model_path",
    "tokenizer_path",
    "tp_size",
    "pp_size",
    "dtype",
    "mem_fraction_static",
    "context_length",
    "random_seed",
    "disable_radix_cache",
}


def output(text="ok", prompt_tokens=5, completion_tokens=2, finish=None, **meta):
    finish = {"type": "stop", "matched": 151645} if finish is None else finish
    return {
        "text": text,
        "meta_info": {
            "id": "abc",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "finish_reason": finish,
            **meta,
        },
    }


# ----------------------------------------------------------------------------- pure conversions


def test_engine_kwargs_from_config():
    kwargs = sglang_engine_kwargs(EngineConfig(kind="sglang", model="/models/grrm"))
    assert kwargs == {
        "model_path": "/models/grrm",
        "tp_size": 1,
        "dtype": "auto",
        "mem_fraction_static": 0.9,
        "random_seed": 0,
        "disable_radix_cache": False,
    }
    config = EngineConfig(
        kind="sglang",
        model="double7/GRRM-Qwen2.5-7B",
        tokenizer="/tok",
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.7,
        max_model_len=8192,
        dtype="bfloat16",
        seed=3,
        pipeline_parallel_size=2,
        engine_kwargs={"enable_deterministic_inference": True},
    )
    kwargs = sglang_engine_kwargs(config)
    assert kwargs == {
        "model_path": "double7/GRRM-Qwen2.5-7B",
        "tokenizer_path": "/tok",
        "tp_size": 2,
        "pp_size": 2,
        "dtype": "bfloat16",
        "mem_fraction_static": 0.7,
        "context_length": 8192,
        "random_seed": 3,
        "disable_radix_cache": True,
        "enable_deterministic_inference": True,
    }
    assert set(kwargs) - {"enable_deterministic_inference"} <= SGLANG_SERVER_ARGS


def test_engine_kwargs_need_a_model():
    with pytest.raises(EngineError, match="model"):
        sglang_engine_kwargs(EngineConfig(kind="sglang"))


def test_sampling_params_minimal_and_full():
    assert sglang_sampling_params(SamplingSettings()) == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 1024}
    params = sglang_sampling_params(
        SamplingSettings(temperature=0.7, top_p=0.9, max_tokens=64, seed=11, stop=("\n\n", "END"), regex="[AB]")
    )
    assert params == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_new_tokens": 64,
        "stop": ["\n\n", "END"],
        "regex": "[AB]",
        "sampling_seed": 11,
    }
    assert set(params) <= SGLANG_SAMPLING_KEYS


def test_output_with_stop_length_and_abort():
    stop = generation_from_sglang_output(output("B > A\nB: 9, A: 3", 120, 14, cached_tokens=100))
    assert (stop.text, stop.prompt_tokens, stop.completion_tokens, stop.finish_reason) == (
        "B > A\nB: 9, A: 3",
        120,
        14,
        "stop",
    )
    assert stop.extra == {"finish_detail": {"type": "stop", "matched": 151645}, "cached_tokens": 100}
    length = generation_from_sglang_output(output(finish={"type": "length", "length": 2}))
    assert length.finish_reason == "length"
    abort = generation_from_sglang_output(
        output("", 9000, 0, finish={"type": "abort", "message": "Input is too long", "status_code": 400})
    )
    assert abort.finish_reason == "abort"
    assert abort.extra["finish_detail"]["message"] == "Input is too long"
    assert generation_from_sglang_output(output(finish="length")).finish_reason == "length"
    unfinished = {"text": "x", "meta_info": {"prompt_tokens": 1, "completion_tokens": 1, "finish_reason": None}}
    assert generation_from_sglang_output(unfinished).finish_reason == "abort"


@pytest.mark.parametrize(
    "bad",
    [
        {"meta_info": {"prompt_tokens": 1, "completion_tokens": 1}},
        {"text": "x"},
        {"text": "x", "meta_info": {"completion_tokens": 1}},
        {"text": None, "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}},
        output(finish={"type": "exploded"}),
        output(finish=42),
    ],
)
def test_malformed_outputs_are_engine_errors(bad):
    with pytest.raises(EngineError, match="SGLang output"):
        generation_from_sglang_output(bad)


def test_importing_the_adapter_imports_neither_sglang_nor_transformers():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        "import sys, cluster.engines.sglang\n"
        "assert 'sglang' not in sys.modules and 'transformers' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


# ----------------------------------------------------------------------------- start without SGLang


async def test_start_without_sglang_is_a_clear_engine_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # makes `import sglang` raise ImportError
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/models/grrm"))
    with pytest.raises(EngineError, match="SGLang is not installed"):
        await engine.start()
    with pytest.raises(EngineError, match="not started"):
        await engine.generate(["x"], SamplingSettings())
    with pytest.raises(EngineError, match="not started"):
        await engine.check_health()
    with pytest.raises(EngineError, match="start"):
        engine.tokenizer
    await engine.stop()  # nothing to stop, no error


def test_make_engine_builds_the_sglang_adapter_without_sglang():
    engine = make_engine(EngineConfig(kind="sglang", model="/models/grrm"))
    assert isinstance(engine, SGLangEngine)
    assert engine.name == "sglang"
    # Before start() the tokenizer is missing; the protocol check must not blow up on it.
    isinstance(engine, Engine)


# ----------------------------------------------------------------------------- wiring, against a FAKE sglang


class FakeSGLangEngine:
    """FAKE of ``sglang.Engine``'s API shape (not its behaviour): echoes prompts back."""

    instances: list[FakeSGLangEngine] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple[object, object]] = []
        self.shutdowns = 0
        self.fail_with: Exception | None = None
        self.abort_all = False
        self.hang = False
        FakeSGLangEngine.instances.append(self)

    def _one(self, prompt, params):
        words = f"echo {prompt}".split()
        limit = params.get("max_new_tokens", 128)
        if self.abort_all:
            finish = {"type": "abort", "message": "scheduler died"}
        elif len(words) > limit:
            finish = {"type": "length", "length": limit}
        else:
            finish = {"type": "stop", "matched": 0}
        words = words[:limit]
        return output(" ".join(words), len(prompt.split()), len(words), finish)

    async def async_generate(self, prompt=None, sampling_params=None, **kwargs):
        self.calls.append((prompt, sampling_params))
        if self.hang:
            await asyncio.Event().wait()
        if self.fail_with is not None:
            raise self.fail_with
        await asyncio.sleep(0)
        if isinstance(prompt, str):
            return self._one(prompt, sampling_params)
        return [self._one(p, s) for p, s in zip(prompt, sampling_params)]

    def shutdown(self):
        self.shutdowns += 1


class FakeAutoTokenizer:
    """FAKE of ``transformers.AutoTokenizer``: records the path, returns a scripted tokenizer."""

    loaded: list[tuple[str, dict]] = []

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        cls.loaded.append((path, kwargs))
        return ScriptedTokenizer()


@pytest.fixture
def fake_sglang(monkeypatch):
    FakeSGLangEngine.instances = []
    FakeAutoTokenizer.loaded = []
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=FakeSGLangEngine))
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=FakeAutoTokenizer))
    return FakeSGLangEngine


async def test_start_builds_the_engine_and_tokenizer_once(fake_sglang):
    config = EngineConfig(kind="sglang", model="/models/grrm", tokenizer="/tok", engine_kwargs={"trust_remote_code": True})
    engine = SGLangEngine(config)
    await engine.start()
    await engine.start()
    assert len(fake_sglang.instances) == 1
    assert fake_sglang.instances[0].kwargs == sglang_engine_kwargs(config)
    assert FakeAutoTokenizer.loaded == [("/tok", {"trust_remote_code": True})]
    assert isinstance(engine.tokenizer, ScriptedTokenizer)
    assert isinstance(engine, Engine)


async def test_generate_passes_one_params_dict_per_prompt_and_maps_outputs(fake_sglang):
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    await engine.start()
    sampling = SamplingSettings(temperature=0.5, max_tokens=3, seed=4, stop=("\n",))
    generations = await engine.generate(["one two", "a b c d e"], sampling)
    (prompts, params), = fake_sglang.instances[0].calls
    assert prompts == ["one two", "a b c d e"]
    assert params == [sglang_sampling_params(sampling)] * 2
    assert [g.text for g in generations] == ["echo one two", "echo a b"]
    assert [g.finish_reason for g in generations] == ["stop", "length"]
    assert [(g.prompt_tokens, g.completion_tokens) for g in generations] == [(2, 3), (5, 3)]
    assert await engine.generate([], sampling) == []


async def test_sglang_failures_become_engine_errors(fake_sglang):
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    await engine.start()
    fake_sglang.instances[0].fail_with = ValueError("bad regex")
    with pytest.raises(EngineError, match="bad regex"):
        await engine.generate(["x"], SamplingSettings(regex="("))


async def test_health_probe(fake_sglang, monkeypatch):
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    await engine.start()
    fake = fake_sglang.instances[0]
    await engine.check_health()
    assert fake.calls[-1][1] == {"max_new_tokens": 1, "temperature": 0.0}
    fake.abort_all = True
    with pytest.raises(EngineError, match="aborted"):
        await engine.check_health()
    fake.abort_all, fake.fail_with = False, RuntimeError("scheduler is dead")
    with pytest.raises(EngineError, match="scheduler is dead"):
        await engine.check_health()
    fake.fail_with, fake.hang = None, True
    monkeypatch.setattr(sglang_adapter, "HEALTH_PROBE_TIMEOUT_S", 0.05)
    with pytest.raises(EngineError, match="health probe failed"):
        await engine.check_health()


async def test_stop_shuts_down_once(fake_sglang):
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    await engine.start()
    await engine.stop()
    await engine.stop()
    assert fake_sglang.instances[0].shutdowns == 1
    with pytest.raises(EngineError, match="not started"):
        await engine.generate(["x"], SamplingSettings())


async def test_engine_constructor_failure_is_an_engine_error(fake_sglang, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=broken))
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    with pytest.raises(EngineError, match="CUDA out of memory"):
        await engine.start()
    with pytest.raises(EngineError, match="not started"):
        await engine.check_health()
