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
from cluster.engines.transformers import (
    STOP_CHECK_INTERVAL,
    TransformersEngine,
    _FinishTracker,
    _Row,
    _RowSampler,
    attention_backends,
    attention_context,
    xgrammar_available,
)


def sdpa_flags() -> dict[str, bool]:
    """Which SDPA backends torch may use now (process-wide flags, settable on a CPU build too)."""
    import torch

    cuda = torch.backends.cuda
    return {
        "FLASH_ATTENTION": cuda.flash_sdp_enabled(),
        "EFFICIENT_ATTENTION": cuda.mem_efficient_sdp_enabled(),
        "MATH": cuda.math_sdp_enabled(),
        "CUDNN_ATTENTION": cuda.cudnn_sdp_enabled(),
    }


def test_attention_backends_never_pick_cudnn_on_cuda():
    from torch.nn.attention import SDPBackend

    cuda = attention_backends("cuda")
    # cuDNN attention re-plans for every new batch shape (seconds per batch in bf16 with padding).
    assert "CUDNN_ATTENTION" not in cuda
    # Left padding needs a mask: memory-efficient attention takes one; math is the fallback.
    assert {"EFFICIENT_ATTENTION", "MATH"} <= set(cuda)
    assert attention_backends("cpu") == ("FLASH_ATTENTION", "MATH")
    assert attention_backends("mps") == ()
    for name in cuda + attention_backends("cpu"):
        assert isinstance(getattr(SDPBackend, name), SDPBackend)


def test_attention_context_applies_the_choice_and_restores_the_flags():
    before = sdpa_flags()
    for device_type in ("cuda", "cpu"):
        with attention_context(device_type):
            assert {name for name, on in sdpa_flags().items() if on} == set(attention_backends(device_type))
        assert sdpa_flags() == before
    with attention_context("mps"):
        assert sdpa_flags() == before


def _rows(*samplings: SamplingSettings, seeds=None) -> list[_Row]:
    return [_Row("p", sampling, seed, None) for sampling, seed in zip(samplings, seeds or [0] * len(samplings))]


def test_row_sampler_draws_from_each_rows_own_distribution():
    import torch

    logits = torch.tensor([2.0, 1.0, 0.0, float("-inf")])
    n = 4000
    sampled = SamplingSettings(temperature=1.0)
    nucleus = SamplingSettings(temperature=0.5, top_p=0.7)
    rows = _rows(*([sampled] * n + [nucleus] * n + [SamplingSettings()]), seeds=range(2 * n + 1))
    sampler = _RowSampler(rows, torch.device("cpu"))
    scores = sampler(None, logits.repeat(2 * n + 1, 1))
    # Each sampled row is left with one token at 0 and -inf elsewhere; the greedy row is untouched.
    chosen = scores[: 2 * n].argmax(dim=-1)
    assert torch.equal(torch.isfinite(scores[: 2 * n]).sum(dim=-1), torch.ones(2 * n, dtype=torch.long))
    assert torch.equal(scores[-1], logits)
    share = torch.bincount(chosen[:n], minlength=4).double() / n
    assert torch.allclose(share, torch.softmax(logits.double(), dim=0), atol=0.03), share
    # Temperature 0.5: probabilities 0.867, 0.117, 0.016; top-p 0.7 keeps the first token only.
    assert torch.equal(chosen[n:], torch.zeros(n, dtype=torch.long))
    assert share[3] == 0  # a masked (-inf) token is never drawn


def test_row_sampler_is_reproducible_per_row_and_leaves_impossible_rows_alone():
    import torch

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    logits[2] = float("-inf")  # e.g. a grammar that allows nothing

    def draws(rows, scores, steps=8):
        sampler = _RowSampler(rows, torch.device("cpu"))
        return [sampler(None, scores.clone()).argmax(dim=-1).tolist() for _ in range(steps)]

    sampling = SamplingSettings(temperature=1.0)
    together = draws(_rows(sampling, sampling, sampling, seeds=[7, 8, 9]), logits)
    alone = draws(_rows(sampling, seeds=[7]), logits[:1])
    # A seeded row's draws do not depend on its batch-mates.
    assert [step[0] for step in together] == [step[0] for step in alone]
    assert [step[0] for step in together] != [step[1] for step in together]
    impossible = _RowSampler(_rows(sampling, sampling, sampling), torch.device("cpu"))(None, logits.clone())
    assert torch.equal(impossible[2], logits[2])


def _run_tracker(tracker: _FinishTracker, tokens: list[list[int]], before_step=lambda step: None) -> list:
    """Feed ``tokens`` (row by row, one column per step) through the tracker as ``generate`` would."""
    import torch

    ids = torch.zeros((len(tokens), tracker.prompt_width), dtype=torch.long)
    for step in range(1, len(tokens[0]) + 1):
        ids = torch.cat([ids, torch.tensor([[row[step - 1]] for row in tokens])], dim=1)
        before_step(step)
        if bool(tracker(ids, None).all()):
            break
    return tracker.finishes(ids, ids[:, tracker.prompt_width :].tolist())


def test_finish_tracker_ends_each_row_on_its_own_terms():
    def decode(ids):  # token 9 is eos (a special token: decodes to nothing); t -> the t-th letter
        return "".join("" if t == 9 else chr(ord("a") + t) for t in ids)

    aborts = [0]
    rows = _rows(
        SamplingSettings(max_tokens=5),  # eos at step 3
        SamplingSettings(max_tokens=5, ignore_eos=True),  # runs past its eos to its limit
        SamplingSettings(max_tokens=20, stop=("zz", "cde")),  # "cde" completes at step 13
        SamplingSettings(max_tokens=20),  # its caller goes away before step 6
        SamplingSettings(max_tokens=4, stop=("xy",)),  # "xy" completes at step 4: stop beats length
    )
    tracker = _FinishTracker(
        prompt_width=2, limits=[5, 5, 20, 20, 4], eos_ids=frozenset({9}), rows=rows,
        closing=lambda: False, aborts=lambda: aborts[0], decode=decode, device="cpu",
    )
    tokens = [
        [0, 1, 9] + [0] * 17,
        [0, 1, 9] + [0] * 17,
        [0] * 10 + [2, 3, 4] + [0] * 7,
        [1] * 20,
        [0, 0, 23, 24] + [0] * 16,
    ]

    def abort_row_3(step):
        if step == 6:
            rows[3].aborted = True
            aborts[0] += 1

    finishes = _run_tracker(tracker, tokens, abort_row_3)
    assert [(f.reason, f.tokens, f.stop_reason) for f in finishes] == [
        ("stop", 3, 9),
        ("length", 5, None),
        ("stop", 13, "cde"),
        ("abort", 6, None),
        ("stop", 4, "xy"),
    ]
    assert 13 % STOP_CHECK_INTERVAL and 4 % STOP_CHECK_INTERVAL  # hits between periodic checks are exact


def test_finish_tracker_aborts_every_row_when_the_engine_closes():
    closing = [False]
    tracker = _FinishTracker(
        prompt_width=1, limits=[50, 50], eos_ids=frozenset({9}), rows=_rows(SamplingSettings(), SamplingSettings()),
        closing=lambda: closing[0], aborts=lambda: 0, decode=str, device="cpu",
    )
    finishes = _run_tracker(tracker, [[1] * 50, [2] * 50], lambda step: closing.__setitem__(0, step >= 3))
    assert [(f.reason, f.tokens) for f in finishes] == [("abort", 3), ("abort", 3)]


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

    async def test_stop_string_ends_the_row_at_the_exact_token(self, engine, prompts, pick_stop):
        # Stop strings are looked for every few steps only; the count must still be exact: the
        # string is complete after completion_tokens tokens and not one token earlier.
        (free,) = await engine.generate(prompts[1:2], SamplingSettings(max_tokens=40))
        stop = pick_stop(free.text)
        (stopped,) = await engine.generate(prompts[1:2], SamplingSettings(max_tokens=40, stop=(stop,)))
        assert stopped.finish_reason == "stop" and stopped.extra["stop_reason"] == stop
        count = stopped.completion_tokens
        assert count > 1
        (upto,), (before,) = await asyncio.gather(
            engine.generate(prompts[1:2], SamplingSettings(max_tokens=count)),
            engine.generate(prompts[1:2], SamplingSettings(max_tokens=count - 1)),
        )
        assert stop in upto.text and stop not in before.text

    async def test_generate_runs_with_the_chosen_attention_backends(self, engine, prompts):
        seen = []
        hook = engine._model.register_forward_pre_hook(lambda module, args: seen.append(sdpa_flags()))
        try:
            await engine.generate(prompts[:3], SamplingSettings(max_tokens=3))
        finally:
            hook.remove()
        chosen = set(attention_backends(engine._device.type))
        assert seen and all({name for name, on in flags.items() if on} == chosen for flags in seen)
        assert all(sdpa_flags().values())  # restored after the batch

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


@pytest.mark.slow
async def test_ignore_eos_is_per_row(tmp_path_factory: pytest.TempPathFactory):
    from cluster.tiny_model import build_tiny_model

    # A larger end-of-turn embedding: this random model ends its greedy answers within a few tokens.
    model = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-early-eos", seed=0, stop_scale=4.0)
    engine = TransformersEngine(EngineConfig(kind="transformers", model=str(model)))
    await engine.start()
    try:
        prompt = apply_chat_template(engine.tokenizer, "Hello!")
        ending, ignoring = await asyncio.gather(
            engine.generate([prompt], SamplingSettings(max_tokens=24)),
            engine.generate([prompt], SamplingSettings(max_tokens=24, ignore_eos=True)),
        )
        (ending,), (ignoring,) = ending, ignoring
        eos = set(engine._eos_ids)
        assert ending.finish_reason == "stop" and ending.extra["stop_reason"] in eos
        assert ending.completion_tokens < 24
        # Batched with it, the ignore_eos row ran on past the same eos token to its limit.
        assert ignoring.finish_reason == "length" and ignoring.completion_tokens == 24
        assert ignoring.text.startswith(ending.text)
    finally:
        await engine.stop()
