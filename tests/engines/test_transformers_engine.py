"""The Hugging Face engine on the tiny random model: real generation, no mocks."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import pytest_asyncio

from cluster import gqm
from cluster.engines import (
    Engine,
    EngineConfig,
    EngineError,
    EngineUnsupportedError,
    SamplingSettings,
    apply_chat_template,
    count_tokens,
    make_engine,
)
from cluster.engines.transformers import TransformersEngine, xgrammar_available


def test_engine_kwargs_split_batch_size_from_model_kwargs():
    engine = TransformersEngine(EngineConfig(kind="transformers", model="m", engine_kwargs={"max_batch_size": 4}))
    assert engine.max_batch_size == 4 and engine._model_kwargs == {}
    with pytest.raises(ValueError, match="max_batch_size"):
        TransformersEngine(EngineConfig(kind="transformers", model="m", engine_kwargs={"max_batch_size": 0}))


async def test_not_started_engine_refuses_work():
    engine = TransformersEngine(EngineConfig(kind="transformers", model="m"))
    with pytest.raises(EngineError):
        engine.tokenizer
    with pytest.raises(EngineError):
        await engine.check_health()
    with pytest.raises(EngineError):
        await engine.generate(["x"], SamplingSettings())
    await engine.stop()  # stopping a never-started engine is a no-op


async def test_a_missing_model_fails_start_with_an_engine_error(tmp_path: Path):
    engine = TransformersEngine(EngineConfig(kind="transformers", model=str(tmp_path / "no-such-model")))
    with pytest.raises(EngineError, match="no-such-model"):
        await engine.start()
    with pytest.raises(EngineError):
        await engine.check_health()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_model_dir: Path):
    engine = make_engine(
        EngineConfig(kind="transformers", model=str(tiny_model_dir), engine_kwargs={"max_batch_size": 8})
    )
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture(scope="module")
def prompts(engine, user_messages) -> list[str]:
    return [apply_chat_template(engine.tokenizer, message) for message in user_messages]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
class TestTransformersEngine:
    async def test_satisfies_the_protocol_and_is_healthy(self, engine):
        assert isinstance(engine, TransformersEngine) and isinstance(engine, Engine)
        await engine.start()  # idempotent
        await engine.check_health()

    async def test_batch_returns_one_generation_per_prompt_in_order(self, engine, prompts):
        sampling = SamplingSettings(max_tokens=12)
        batch = await engine.generate(prompts, sampling)
        assert len(batch) == len(prompts)
        for prompt, generation in zip(prompts, batch):
            assert generation.prompt_tokens == count_tokens(engine.tokenizer, prompt)
            # Each member equals the prompt generated alone: the batch kept its order.
            (alone,) = await engine.generate([prompt], sampling)
            assert generation == alone
        assert len({g.text for g in batch}) > 1  # the prompts really produced different outputs

    async def test_max_tokens_ends_with_length(self, engine, prompts):
        for max_tokens in (1, 7):
            (generation,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=max_tokens))
            assert generation.finish_reason == "length"
            assert generation.completion_tokens == max_tokens
            assert generation.text

    async def test_greedy_is_deterministic(self, engine, prompts):
        sampling = SamplingSettings(temperature=0.0, max_tokens=16)
        first = await engine.generate(prompts[:2], sampling)
        second = await engine.generate(prompts[:2], sampling)
        assert first == second

    async def test_seeded_sampling_is_reproducible_and_the_seed_matters(self, engine, prompts):
        def settings(seed):
            return SamplingSettings(temperature=1.0, top_p=0.95, max_tokens=16, seed=seed)

        first = await engine.generate(prompts[:2], settings(1234))
        second = await engine.generate(prompts[:2], settings(1234))
        other = await engine.generate(prompts[:2], settings(4321))
        greedy = await engine.generate(prompts[:2], SamplingSettings(max_tokens=16))
        assert [g.text for g in first] == [g.text for g in second]
        assert [g.text for g in first] != [g.text for g in other]
        assert [g.text for g in first] != [g.text for g in greedy]

    async def test_unseeded_sampling_varies(self, engine, prompts):
        sampling = SamplingSettings(temperature=1.0, max_tokens=16)
        texts = {(await engine.generate(prompts[:1], sampling))[0].text for _ in range(3)}
        assert len(texts) > 1

    async def test_regex_constraint_is_fully_matched(self, engine, prompts):
        pattern = gqm.verdict_regex(3)
        for sampling in (
            SamplingSettings(max_tokens=64, regex=pattern),
            SamplingSettings(temperature=1.0, max_tokens=64, seed=7, regex=pattern),
        ):
            batch = await engine.generate(prompts[:3], sampling)
            for generation in batch:
                assert re.fullmatch(pattern, generation.text), generation.text
                # The grammar allows only eos once complete: a natural stop, eos counted.
                assert generation.finish_reason == "stop"
                assert generation.completion_tokens >= len(engine.tokenizer.encode(generation.text)) + 1

    async def test_regex_cut_short_by_max_tokens_is_a_prefix(self, engine, prompts):
        pattern = gqm.verdict_regex(4)
        (generation,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=3, regex=pattern))
        assert generation.finish_reason == "length" and generation.completion_tokens == 3
        assert re.fullmatch(pattern, generation.text) is None
        assert re.match(r"[A-D]( |$)", generation.text)

    async def test_bad_regex_is_an_engine_error(self, engine, prompts):
        with pytest.raises(EngineError, match="regex"):
            await engine.generate(prompts[:1], SamplingSettings(max_tokens=4, regex="(unclosed"))
        await engine.check_health()

    async def test_regex_without_xgrammar_is_unsupported(self, engine, prompts, monkeypatch):
        import cluster.engines.transformers as module

        monkeypatch.setattr(module, "xgrammar_available", lambda: False)
        with pytest.raises(EngineUnsupportedError, match="regex"):
            await engine.generate(prompts[:1], SamplingSettings(regex="A"))
        assert xgrammar_available()

    async def test_stop_string_truncates_the_text(self, engine, prompts, pick_stop):
        (free,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=24))
        assert free.finish_reason == "length"
        stop = pick_stop(free.text)
        cut = free.text.index(stop)
        (stopped,) = await engine.generate(prompts[:1], SamplingSettings(max_tokens=24, stop=("no such stop", stop)))
        assert stopped.finish_reason == "stop"
        assert stopped.text == free.text[:cut]
        assert stopped.extra["stop_reason"] == stop
        assert stopped.completion_tokens < free.completion_tokens

    async def test_concurrent_calls_are_batched_and_answered_correctly(self, engine, prompts, monkeypatch):
        greedy = SamplingSettings(max_tokens=10)
        seeded = SamplingSettings(temperature=1.0, max_tokens=6, seed=99)
        alone = [(await engine.generate([p], greedy))[0] for p in prompts]
        alone_seeded = (await engine.generate(prompts[:1], seeded))[0]

        batch_sizes = []
        generate_batch = engine._generate_batch

        def counting(batch):
            batch_sizes.append(len(batch))
            return generate_batch(batch)

        monkeypatch.setattr(engine, "_generate_batch", counting)
        calls = [engine.generate([p], greedy) for p in prompts] + [engine.generate(prompts[:1], seeded)]
        together = await asyncio.gather(*calls)
        # All concurrent calls, with different settings, went through one generate.
        assert batch_sizes == [len(prompts) + 1]
        assert [batch[0] for batch in together[:-1]] == alone
        assert together[-1][0].text == alone_seeded.text
        assert together[-1][0].completion_tokens == 6

    async def test_cancelling_a_call_leaves_the_engine_serving(self, engine, prompts):
        # Run to the end, these rows would take ~30 s here.
        task = asyncio.create_task(engine.generate(prompts, SamplingSettings(max_tokens=8000)))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = asyncio.get_running_loop().time()
        (generation,) = await asyncio.wait_for(engine.generate(prompts[:1], SamplingSettings(max_tokens=2)), 30)
        assert generation.completion_tokens == 2
        # The cancelled rows were aborted mid-generate, not run to the end.
        assert asyncio.get_running_loop().time() - started < 8
        await engine.check_health()

    async def test_batches_are_capped_at_max_batch_size(self, engine, prompts, monkeypatch):
        batch_sizes = []
        generate_batch = engine._generate_batch

        def counting(batch):
            batch_sizes.append(len(batch))
            return generate_batch(batch)

        monkeypatch.setattr(engine, "_generate_batch", counting)
        many = (prompts * 4)[:19]
        results = await engine.generate(many, SamplingSettings(max_tokens=3))
        assert len(results) == 19 and batch_sizes == [8, 8, 3]
        assert [g.prompt_tokens for g in results] == [count_tokens(engine.tokenizer, p) for p in many]

    async def test_empty_inputs(self, engine):
        assert await engine.generate([], SamplingSettings()) == []
        with pytest.raises(EngineError, match="empty"):
            await engine.generate([""], SamplingSettings(max_tokens=2))


@pytest.mark.slow
async def test_stop_fails_waiting_calls_and_frees_the_model(tiny_model_dir: Path):
    engine = TransformersEngine(EngineConfig(kind="transformers", model=str(tiny_model_dir), max_model_len=64))
    await engine.start()
    prompt = apply_chat_template(engine.tokenizer, "Hello")
    # max_model_len caps the completion: prompt + completion never exceed it.
    (capped,) = await engine.generate([prompt], SamplingSettings(max_tokens=500))
    assert capped.finish_reason == "length"
    assert capped.prompt_tokens + capped.completion_tokens == 64
    with pytest.raises(EngineError, match="context"):
        await engine.generate([prompt * 20], SamplingSettings(max_tokens=4))

    running = asyncio.create_task(engine.generate([prompt] * 3, SamplingSettings(max_tokens=50)))
    await asyncio.sleep(0.05)
    await engine.stop()
    outcome = (await asyncio.gather(running, return_exceptions=True))[0]
    # Either it finished before stop, was aborted mid-way, or never started.
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, EngineError)
    else:
        assert all(g.finish_reason in {"abort", "length"} for g in outcome)
    assert engine._model is None
    with pytest.raises(EngineError):
        await engine.check_health()
    await engine.stop()  # idempotent
