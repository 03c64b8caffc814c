"""The SGLang adapter, on a machine without SGLang (it needs CUDA).

The pure conversions are tested directly. The adapter's wiring (what it passes to
``sglang.Engine`` and ``async_generate``, how it maps outputs, start/stop off the event loop, the
health probe and how it tells a dead engine) is tested against a STAND-IN ``sglang`` module
injected into ``sys.modules``. The stand-in is not SGLang and these tests say nothing about
SGLang's behaviour: it has only the calls the adapter makes, with SGLang 0.5.23's signatures and
output shapes, and acts out the behaviours of SGLang that the adapter relies on (each is cited in
``cluster/engines/sglang.py``): a constructor that blocks while the model loads and starts a
scheduler and a detokenizer process that ask to be killed when their parent thread ends
(PR_SET_PDEATHSIG), ``tokenizer_manager.get_internal_state()`` answered between scheduler steps,
and requests that wait forever for a dead scheduler. Real SGLang runs are GPU tests elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

import cluster.engines.sglang as sglang_adapter
from cluster.engines import Engine, EngineConfig, EngineDeadError, EngineError, SamplingSettings, make_engine
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
    "max_running_requests",
    "chunked_prefill_size",
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
        model="double7/Qwen2.5-7B-GRRM",
        tokenizer="/tok",
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.7,
        max_model_len=8192,
        dtype="bfloat16",
        seed=3,
        pipeline_parallel_size=2,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        engine_kwargs={"enable_deterministic_inference": True},
    )
    kwargs = sglang_engine_kwargs(config)
    assert kwargs == {
        "model_path": "double7/Qwen2.5-7B-GRRM",
        "tokenizer_path": "/tok",
        "tp_size": 2,
        "pp_size": 2,
        "dtype": "bfloat16",
        "mem_fraction_static": 0.7,
        "context_length": 8192,
        "random_seed": 3,
        "disable_radix_cache": True,
        "max_running_requests": 64,
        "chunked_prefill_size": 8192,
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


# ----------------------------------------------------------------------------- a STAND-IN for SGLang's API

# A stand-in scheduler or detokenizer process: like SGLang's (kill_itself_when_parent_died) it asks for
# SIGKILL when its parent thread ends, then reports ready, as SGLang's scheduler does through a pipe.
CHILD_CODE = (
    "import ctypes, signal, time\n"
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL)\n"  # 1: PR_SET_PDEATHSIG
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def exited(process: subprocess.Popen) -> bool:
    """Whether a child process has ended, without reaping it (a zombie stays a zombie)."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


class StandInTokenizerManager:
    """STAND-IN for ``engine.tokenizer_manager`` (SGLang's ``TokenizerManager``): ``gracefully_exit``
    and ``async get_internal_state() -> list[dict]``, one dict per data-parallel rank. The scheduler
    answers it between two steps, not after the generations queued; a dead scheduler never does."""

    def __init__(self, engine: StandInEngine):
        self.engine = engine
        self.gracefully_exit = False
        self.hang = False  # the scheduler lives but does not answer (stuck in a step)
        self.probes = 0

    async def get_internal_state(self) -> list[dict]:
        self.probes += 1
        if self.hang or exited(self.engine.processes["scheduler"]):
            await asyncio.Event().wait()
        return [{"last_gen_throughput": 0.0, "memory_usage": {"weight": 14.2, "kvcache": 50.1}}]


class StandInEngine:
    """STAND-IN for ``sglang.Engine``: ``Engine(**server_args)`` blocks while "loading" and starts a
    scheduler and a detokenizer process; ``async_generate(prompt=[...], sampling_params=[...])``
    echoes each prompt as one output dict; ``get_all_child_pids()``; ``shutdown()`` kills the
    processes and waits for them. Generations wait while ``queue_open`` is clear, and forever once
    the scheduler is gone (as SGLang's engine requests do)."""

    instances: list[StandInEngine] = []
    build_delay_s = 0.0
    build_error: Exception | None = None
    shutdown_delay_s = 0.0

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.built_on = threading.current_thread()
        self.shut_down_on: threading.Thread | None = None
        self.shutdowns = 0
        StandInEngine.instances.append(self)
        self.processes: dict[str, subprocess.Popen] = {}
        time.sleep(self.build_delay_s)  # loading the model: SGLang's constructor blocks meanwhile
        if self.build_error is not None:
            raise self.build_error
        for name in ("scheduler", "detokenizer"):
            process = subprocess.Popen([sys.executable, "-S", "-c", CHILD_CODE], stdout=subprocess.PIPE)
            self.processes[name] = process
            assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        self.tokenizer_manager = StandInTokenizerManager(self)
        self.calls: list[tuple[object, object]] = []
        self.fail_with: Exception | None = None
        self.crash: tuple[str, bool] | None = None  # (process, reap): it dies under the request
        self.queue_open = asyncio.Event()  # binds to the loop that first waits on it
        self.queue_open.set()

    def get_all_child_pids(self) -> list[int]:
        return [process.pid for process in self.processes.values()]

    def _one(self, prompt, params):
        words = f"echo {prompt}".split()
        limit = params.get("max_new_tokens", 128)
        finish = {"type": "length", "length": limit} if len(words) > limit else {"type": "stop", "matched": 0}
        words = words[:limit]
        return output(" ".join(words), len(prompt.split()), len(words), finish)

    async def async_generate(self, prompt=None, sampling_params=None, **kwargs):
        self.calls.append((prompt, sampling_params))
        if self.fail_with is not None:
            raise self.fail_with
        if self.crash is not None:
            self.kill(*self.crash)
            raise RuntimeError(f"{self.crash[0]} crashed")
        await self.queue_open.wait()
        if exited(self.processes["scheduler"]):
            await asyncio.Event().wait()
        if isinstance(prompt, str):
            return self._one(prompt, sampling_params)
        return [self._one(p, s) for p, s in zip(prompt, sampling_params)]

    def shutdown(self):
        self.shut_down_on = threading.current_thread()
        self.shutdowns += 1
        time.sleep(self.shutdown_delay_s)
        self.kill_all()

    def kill(self, name: str, reap: bool) -> None:
        """The test's doing: one of SGLang's processes dies (reaped, or left a zombie)."""
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        if reap:
            process.wait()
        else:
            while not exited(process):
                time.sleep(0.01)

    def kill_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()


class StandInAutoTokenizer:
    """STAND-IN for ``transformers.AutoTokenizer``: records the path, returns a scripted tokenizer."""

    loaded: list[tuple[str, dict]] = []

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        cls.loaded.append((path, kwargs))
        return ScriptedTokenizer()


@pytest.fixture
def stand_in(monkeypatch):
    """``sglang`` and ``transformers`` replaced by the stand-ins; their processes killed afterwards."""
    monkeypatch.setattr(StandInEngine, "instances", [])
    StandInAutoTokenizer.loaded = []
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=StandInEngine))
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=StandInAutoTokenizer))
    monkeypatch.setattr(sglang_adapter, "LIVENESS_POLL_S", 0.05)
    yield StandInEngine
    for engine in StandInEngine.instances:
        engine.kill_all()


async def started(config: EngineConfig | None = None) -> tuple[SGLangEngine, StandInEngine]:
    engine = SGLangEngine(config or EngineConfig(kind="sglang", model="/m"))
    await engine.start()
    return engine, StandInEngine.instances[-1]


async def count_ticks(until: asyncio.Future, every_s: float = 0.05) -> int:
    """How often this event loop ran a coroutine every ``every_s`` until ``until`` is done."""
    ticks = 0
    while not until.done():
        await asyncio.sleep(every_s)
        ticks += 1
    return ticks


# ----------------------------------------------------------------------------- start and stop


async def test_start_builds_the_engine_and_tokenizer_once(stand_in):
    config = EngineConfig(kind="sglang", model="/models/grrm", tokenizer="/tok", engine_kwargs={"trust_remote_code": True})
    engine, sglang_engine = await started(config)
    await engine.start()
    assert len(stand_in.instances) == 1
    assert sglang_engine.kwargs == sglang_engine_kwargs(config)
    assert StandInAutoTokenizer.loaded == [("/tok", {"trust_remote_code": True})]
    assert isinstance(engine.tokenizer, ScriptedTokenizer)
    assert isinstance(engine, Engine)
    await engine.stop()


async def test_the_event_loop_serves_while_sglang_loads(stand_in, monkeypatch):
    monkeypatch.setattr(StandInEngine, "build_delay_s", 1.0)
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    start = asyncio.ensure_future(engine.start())
    ticks = await count_ticks(start)
    await start
    assert ticks >= 10  # about 20 in the second the constructor blocks; none if it blocked the loop
    assert stand_in.instances[0].built_on is not threading.current_thread()
    await engine.stop()


async def test_sglang_processes_live_until_stop_whatever_other_threads_do(stand_in):
    """The processes die with the thread that started them (PR_SET_PDEATHSIG): that thread is the
    engine's own, kept until stop(), not one of the loop's pool, which may end meanwhile."""
    engine, sglang_engine = await started()
    owner = sglang_engine.built_on
    await asyncio.get_running_loop().shutdown_default_executor()  # the pool's threads end
    await asyncio.sleep(0.3)
    assert not any(exited(process) for process in sglang_engine.processes.values())
    await engine.check_health()
    assert owner.is_alive()
    await engine.stop()
    assert sglang_engine.shut_down_on is owner
    owner.join(timeout=5)
    assert not owner.is_alive()


async def test_a_failed_constructor_is_an_engine_error_naming_the_model(stand_in, monkeypatch):
    monkeypatch.setattr(StandInEngine, "build_error", RuntimeError("CUDA out of memory"))
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/models/grrm"))
    with pytest.raises(EngineError, match="'/models/grrm'.*CUDA out of memory") as caught:
        await engine.start()
    assert not isinstance(caught.value, EngineDeadError)
    assert stand_in.instances[0].built_on is not threading.current_thread()
    with pytest.raises(EngineError, match="not started"):
        await engine.check_health()


async def test_a_start_cancelled_while_sglang_loads_shuts_that_engine_down(stand_in, monkeypatch):
    monkeypatch.setattr(StandInEngine, "build_delay_s", 0.5)
    engine = SGLangEngine(EngineConfig(kind="sglang", model="/m"))
    start = asyncio.ensure_future(engine.start())
    await asyncio.sleep(0.1)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    for _ in range(100):
        if stand_in.instances and stand_in.instances[0].shutdowns:
            break
        await asyncio.sleep(0.05)
    assert stand_in.instances[0].shutdowns == 1
    with pytest.raises(EngineError, match="not started"):
        await engine.generate(["x"], SamplingSettings())


async def test_stop_shuts_down_once_off_the_event_loop(stand_in, monkeypatch):
    monkeypatch.setattr(StandInEngine, "shutdown_delay_s", 0.5)  # SGLang's waits for its processes
    engine, sglang_engine = await started()
    stop = asyncio.ensure_future(engine.stop())
    ticks = await count_ticks(stop)
    await stop
    await engine.stop()
    assert ticks >= 5
    assert sglang_engine.shutdowns == 1
    assert sglang_engine.shut_down_on is sglang_engine.built_on
    assert all(exited(process) for process in sglang_engine.processes.values())
    with pytest.raises(EngineError, match="not started"):
        await engine.generate(["x"], SamplingSettings())


# ----------------------------------------------------------------------------- generate


async def test_generate_passes_one_params_dict_per_prompt_and_maps_outputs(stand_in):
    engine, sglang_engine = await started()
    sampling = SamplingSettings(temperature=0.5, max_tokens=3, seed=4, stop=("\n",))
    generations = await engine.generate(["one two", "a b c d e"], sampling)
    (prompts, params), = sglang_engine.calls
    assert prompts == ["one two", "a b c d e"]
    assert params == [sglang_sampling_params(sampling)] * 2
    assert [g.text for g in generations] == ["echo one two", "echo a b"]
    assert [g.finish_reason for g in generations] == ["stop", "length"]
    assert [(g.prompt_tokens, g.completion_tokens) for g in generations] == [(2, 3), (5, 3)]
    assert await engine.generate([], sampling) == []
    await engine.stop()


async def test_a_failed_generation_of_a_live_engine_is_an_engine_error(stand_in):
    engine, sglang_engine = await started()
    sglang_engine.fail_with = ValueError("bad regex")
    with pytest.raises(EngineError, match="bad regex") as caught:
        await engine.generate(["x"], SamplingSettings(regex="("))
    assert not isinstance(caught.value, EngineDeadError)
    await engine.check_health()  # the engine serves on
    await engine.stop()


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
async def test_a_failed_generation_of_a_dead_engine_is_engine_dead(stand_in, reap):
    engine, sglang_engine = await started()
    sglang_engine.crash = ("scheduler", reap)
    with pytest.raises(EngineDeadError, match=r"scheduler or detokenizer\) is gone.*scheduler crashed"):
        await engine.generate(["x"], SamplingSettings())
    sglang_engine.crash = None
    with pytest.raises(EngineDeadError, match="is gone"):  # found before SGLang is asked
        await engine.generate(["x"], SamplingSettings())
    await engine.stop()


async def test_a_generation_waiting_on_a_process_that_dies_is_engine_dead(stand_in):
    engine, sglang_engine = await started()
    sglang_engine.queue_open.clear()
    generation = asyncio.ensure_future(engine.generate(["x"], SamplingSettings()))
    await asyncio.sleep(0.2)
    assert not generation.done()
    sglang_engine.kill("detokenizer", reap=False)
    with pytest.raises(EngineDeadError, match="is gone"):
        await asyncio.wait_for(generation, 2.0)
    await engine.stop()


# ----------------------------------------------------------------------------- health probe


async def test_the_health_probe_is_answered_while_generations_are_queued(stand_in):
    engine, sglang_engine = await started()
    sglang_engine.queue_open.clear()
    generations = [asyncio.ensure_future(engine.generate([f"p{i}"], SamplingSettings())) for i in range(8)]
    await asyncio.sleep(0.1)
    await asyncio.wait_for(engine.check_health(), 1.0)
    assert sglang_engine.tokenizer_manager.probes == 1
    assert len(sglang_engine.calls) == 8  # the probe generated nothing
    assert not any(generation.done() for generation in generations)
    sglang_engine.queue_open.set()
    assert [g[0].text for g in await asyncio.gather(*generations)] == [f"echo p{i}" for i in range(8)]
    await engine.stop()


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
@pytest.mark.parametrize("process", ["scheduler", "detokenizer"])
async def test_the_health_probe_finds_a_dead_process(stand_in, process, reap):
    engine, sglang_engine = await started()
    sglang_engine.kill(process, reap=reap)
    with pytest.raises(EngineDeadError, match=f"process {sglang_engine.processes[process].pid} "):
        await asyncio.wait_for(engine.check_health(), 2.0)
    await engine.stop()


async def test_the_health_probe_finds_a_process_that_dies_while_it_waits(stand_in, monkeypatch):
    engine, sglang_engine = await started()
    sglang_engine.tokenizer_manager.hang = True
    probe = asyncio.ensure_future(engine.check_health())
    await asyncio.sleep(0.2)
    sglang_engine.kill("scheduler", reap=True)
    with pytest.raises(EngineDeadError, match="is gone"):
        await asyncio.wait_for(probe, 2.0)
    await engine.stop()


async def test_a_scheduler_that_does_not_answer_is_engine_dead(stand_in, monkeypatch):
    monkeypatch.setattr(sglang_adapter, "HEALTH_PROBE_TIMEOUT_S", 0.2)
    engine, sglang_engine = await started()
    sglang_engine.tokenizer_manager.hang = True
    with pytest.raises(EngineDeadError, match="did not answer a health probe"):
        await engine.check_health()
    await engine.stop()


async def test_an_exiting_tokenizer_manager_is_engine_dead(stand_in):
    engine, sglang_engine = await started()
    sglang_engine.tokenizer_manager.gracefully_exit = True
    with pytest.raises(EngineDeadError, match="gracefully_exit"):
        await engine.check_health()
    with pytest.raises(EngineDeadError, match="gracefully_exit"):
        await engine.generate(["x"], SamplingSettings())
    await engine.stop()
