"""The scripted engine: a deterministic GRRM stand-in for tests and labelled simulations.

These tests check the scripted engine itself (its parsing, quality function, sampling,
latency and failure injection), so that tests of other layers can rely on it.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import types

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cluster import gqm
from cluster.engines import (
    Engine,
    EngineConfig,
    EngineDeadError,
    EngineError,
    EngineUnsupportedError,
    SamplingSettings,
    make_engine,
)
from cluster.engines.base import Tokenizer, apply_chat_template, count_tokens
from simulated.scripted_engine import (
    MALFORMED_LAST_LINE,
    ScriptedEngine,
    ScriptedTokenizer,
    analysis_text,
    apply_stop_and_max_tokens,
    build_answer,
    candidate_quality,
    count_scripted_tokens,
    extract_user_message,
    group_scores,
    parse_prompt,
)

GREEDY = SamplingSettings(temperature=0.0, max_tokens=4096)


# ----------------------------------------------------------------------------- helpers


def make(**scripted) -> ScriptedEngine:
    return ScriptedEngine(EngineConfig(kind="scripted", scripted=scripted))


async def started(**scripted) -> ScriptedEngine:
    engine = make(**scripted)
    await engine.start()
    return engine


def group_prompt(
    candidates, source="Der Hund schläft.", prompt_type="ranking_score", add_example=False, tokenizer=None
) -> str:
    """A GQM group prompt through the scripted chat template, as the scorer would send it."""
    message = gqm.build_group_prompt(source, candidates, "de", "en", prompt_type, add_example)
    return apply_chat_template(tokenizer or ScriptedTokenizer(), message)


def single_prompt(candidate, source="Der Hund schläft.") -> str:
    return apply_chat_template(ScriptedTokenizer(), gqm.build_single_prompt(source, candidate, "de", "en"))


MARKED = ["The dog sleeps. [q=9]", "Dog is sleeping [q=3]", "The dog sleep. [q=6]", "Sleeps the dog [q=0]"]
MARKED_SCORES = [9, 3, 6, 0]


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_chat_template_is_chatml_and_satisfies_protocol():
    tokenizer = ScriptedTokenizer()
    assert isinstance(tokenizer, Tokenizer)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi\nthere"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi\nthere<|im_end|>\n<|im_start|>assistant\n"
    assert apply_chat_template(tokenizer, "hi\nthere") == text
    no_generation = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert no_generation == "<|im_start|>user\nx<|im_end|>\n"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True) == tokenizer.encode(
        no_generation
    )


def test_tokenizer_counts_words_and_punctuation_with_stable_ids():
    tokenizer = ScriptedTokenizer()
    ids = tokenizer.encode("B > A = C\nB: 9, A: 7", add_special_tokens=False)
    # B > A = C B : 9 , A : 7
    assert len(ids) == 12
    assert ids == tokenizer.encode("B > A = C\nB: 9, A: 7")
    assert ids[0] == ids[5]  # the same token text, the same id
    assert all(isinstance(i, int) and 0 <= i < 2**31 for i in ids)
    assert count_tokens(tokenizer, "one two three") == 3 == count_scripted_tokens("one two three")


def test_token_ids_do_not_depend_on_python_hash_seed():
    code = (
        "from simulated.scripted_engine import ScriptedTokenizer, candidate_quality;"
        "print(ScriptedTokenizer().encode('Hallo Welt, wie geht es?'), candidate_quality('src', 'cand'))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


# ----------------------------------------------------------------------------- prompt parsing


@pytest.mark.parametrize("prompt_type", gqm.PROMPT_TYPES)
@pytest.mark.parametrize("add_example", [False, True])
def test_parse_group_prompt_recovers_everything(prompt_type, add_example):
    candidates = ["a", "b\nwith ``` fences ```\n", "```", "Translation B:\n```\nnot a separator"]
    parsed = parse_prompt(group_prompt(candidates, "src\n```\nline", prompt_type, add_example))
    assert parsed.kind == "group"
    assert parsed.prompt_type == prompt_type
    assert parsed.source == "src\n```\nline"
    assert parsed.candidates == tuple(candidates)
    assert (parsed.src_lang, parsed.trg_lang) == ("German", "English")


def test_parse_group_prompt_without_chat_template_and_with_other_templates():
    message = gqm.build_group_prompt("s", ["x", "y"], "de", "en")
    assert parse_prompt(message).candidates == ("x", "y")
    # A non-ChatML template (e.g. Llama-style markers) around the same message.
    wrapped = "<s>[INST] " + message + " [/INST]"
    assert extract_user_message(wrapped) == message
    assert parse_prompt(wrapped).candidates == ("x", "y")
    # ChatML with a system message in front (Qwen's default template adds one).
    qwen = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + apply_chat_template(
        ScriptedTokenizer(), message
    )
    assert parse_prompt(qwen).candidates == ("x", "y")


def test_parse_single_prompt_and_unknown_prompt():
    parsed = parse_prompt(single_prompt("It\n```\nsleeps [q=4]", source="a\n```\nb"))
    assert parsed.kind == "single"
    assert parsed.source == "a\n```\nb"
    assert parsed.candidates == ("It\n```\nsleeps [q=4]",)
    assert parse_prompt(apply_chat_template(ScriptedTokenizer(), "Translate this.")).kind == "unknown"
    assert parse_prompt("").kind == "unknown"


_SEPARATORS = ["\n```\nTranslation ", "\n```\n\nTranslation A:\n```\n"]
texts = st.text(alphabet=st.sampled_from(list("ab `\nTr:AB[]q=0123")), max_size=30)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    source=texts,
    candidates=st.lists(texts, min_size=2, max_size=8),
    prompt_type=st.sampled_from(gqm.PROMPT_TYPES),
)
def test_parse_round_trips_any_group(source, candidates, prompt_type):
    # The one ambiguity of the format: a text that contains a block separator verbatim.
    assume(not any(separator in text for separator in _SEPARATORS for text in [source, *candidates]))
    parsed = parse_prompt(group_prompt(candidates, source, prompt_type))
    assert parsed.kind == "group"
    assert parsed.source == source
    assert parsed.candidates == tuple(candidates)


# ----------------------------------------------------------------------------- quality and answers


def test_quality_uses_marker_else_a_stable_hash_in_range():
    assert candidate_quality("s", "good [q=10] text") == 10
    assert candidate_quality("s", "[q=0]") == 0
    assert candidate_quality("s", "first [q=2] then [q=8]") == 2
    unmarked = [candidate_quality("source", f"candidate {i}") for i in range(200)]
    assert all(0 <= q <= 10 for q in unmarked)
    assert len(set(unmarked)) == 11  # spread over the whole scale
    assert unmarked == [candidate_quality("source", f"candidate {i}") for i in range(200)]
    # [q=11] is not a valid marker: the hash decides.
    assert 0 <= candidate_quality("s", "[q=11]") <= 10


def test_position_bias_favours_early_candidates_and_clips():
    five = ["[q=5]"] * 5
    assert group_scores("s", five, 0) == [5] * 5
    assert group_scores("s", five, 4) == [9, 8, 7, 6, 5]
    assert group_scores("s", ["[q=9]", "[q=9]", "[q=1]"], 3) == [10, 10, 1]  # 9+3 and 9+1.5->2 clip
    assert group_scores("s", ["[q=0]", "[q=0]"], 2.0) == [2, 0]


@pytest.mark.parametrize("prompt_type", ["ranking_score", "score"])
def test_answer_parses_to_exactly_the_marker_scores(prompt_type):
    parsed = parse_prompt(group_prompt(MARKED, prompt_type=prompt_type))
    answer = build_answer(parsed, analysis=analysis_text(12, 0))
    assert gqm.parse_group_answer(answer, len(MARKED), prompt_type) == MARKED_SCORES
    assert answer.startswith(analysis_text(12, 0) + "\n\n")


def test_ranking_answer_orders_like_the_marker_scores():
    parsed = parse_prompt(group_prompt(MARKED + ["tie [q=6]"], prompt_type="ranking"))
    answer = build_answer(parsed, analysis="")
    assert gqm.last_line(answer) == "A > C = E > B > D"
    assert gqm.parse_group_answer(answer, 5, "ranking") == [3, 1, 2, 0, 2]


def test_single_prompt_answer_ends_with_the_integer_score():
    answer = build_answer(parse_prompt(single_prompt("fine [q=7]")), analysis="some words here")
    assert answer == "some words here\n\n7"
    assert gqm.last_line(build_answer(parse_prompt(single_prompt("x [q=7]")), analysis="", malformed=True)) == (
        MALFORMED_LAST_LINE
    )


def test_malformed_answer_keeps_analysis_and_parses_under_no_prompt_type():
    for prompt_type in gqm.PROMPT_TYPES:
        answer = build_answer(
            parse_prompt(group_prompt(MARKED, prompt_type=prompt_type)), analysis="a b c", malformed=True
        )
        assert answer.startswith("a b c\n\n")
        for reader in gqm.PROMPT_TYPES:
            assert gqm.parse_group_answer(answer, len(MARKED), reader) is None


def test_stop_strings_and_max_tokens():
    text = "w1 w2 w3\n\nB > A\nB: 9, A: 3"
    assert apply_stop_and_max_tokens(text, SamplingSettings(max_tokens=100)) == (text, "stop")
    assert apply_stop_and_max_tokens(text, SamplingSettings(max_tokens=2)) == ("w1 w2", "length")
    assert apply_stop_and_max_tokens(text, SamplingSettings(max_tokens=100, stop=("\n\n",))) == ("w1 w2 w3", "stop")
    # The earliest of several stop strings wins.
    assert apply_stop_and_max_tokens(text, SamplingSettings(stop=("B:", "w2"))) == ("w1 ", "stop")
    # A stop string beyond the token budget never gets generated.
    assert apply_stop_and_max_tokens(text, SamplingSettings(max_tokens=3, stop=("B:",))) == ("w1 w2 w3", "length")


# ----------------------------------------------------------------------------- engine basics


async def test_make_engine_builds_a_scripted_engine_satisfying_the_protocol():
    engine = make_engine(EngineConfig(kind="scripted"))
    assert isinstance(engine, ScriptedEngine)
    assert isinstance(engine, Engine)
    assert engine.name == "scripted"


async def test_engine_answers_a_batch_with_the_marker_scores():
    engine = await started(analysis_words=20)
    prompts = [group_prompt(MARKED), group_prompt(list(reversed(MARKED)), prompt_type="score")]
    generations = await engine.generate(prompts, GREEDY)
    assert gqm.parse_group_answer(generations[0].text, 4) == MARKED_SCORES
    assert gqm.parse_group_answer(generations[1].text, 4, "score") == list(reversed(MARKED_SCORES))
    for prompt, generation in zip(prompts, generations):
        assert generation.finish_reason == "stop"
        assert generation.prompt_tokens == count_tokens(engine.tokenizer, prompt)
        assert generation.completion_tokens == count_scripted_tokens(generation.text)
        # The analysis is exactly analysis_words tokens before the verdict.
        analysis = generation.text.split("\n\n")[0]
        assert count_scripted_tokens(analysis) == 20
    assert engine.generations_served == 2
    assert engine.generate_calls == 1
    assert engine.prompts_seen == prompts
    assert engine.batch_sizes == [2]
    assert engine.sampling_seen == [GREEDY]


async def test_unknown_prompts_get_deterministic_text():
    engine = await started()
    prompt = apply_chat_template(engine.tokenizer, "Write a poem.")
    first, second = await engine.generate([prompt, prompt], GREEDY)
    assert first.text == second.text
    assert "only answers GQM" in first.text
    assert first.extra["prompt_kind"] == "unknown"


async def test_empty_batch_returns_nothing():
    engine = await started()
    assert await engine.generate([], GREEDY) == []


async def test_max_tokens_truncates_by_scripted_tokens():
    engine = await started(analysis_words=50)
    (generation,) = await engine.generate([group_prompt(MARKED)], SamplingSettings(max_tokens=10))
    assert generation.finish_reason == "length"
    assert generation.completion_tokens == 10
    assert count_scripted_tokens(generation.text) == 10
    assert gqm.parse_group_answer(generation.text, 4) is None


async def test_stop_string_ends_the_output():
    engine = await started(analysis_words=5)
    (generation,) = await engine.generate([group_prompt(MARKED)], SamplingSettings(stop=("\n\n",)))
    assert generation.finish_reason == "stop"
    assert generation.text.count(" ") == 4 and "\n" not in generation.text


# ----------------------------------------------------------------------------- regex constraint


@pytest.mark.parametrize("prompt_type", gqm.PROMPT_TYPES)
async def test_regex_constraint_gives_the_bare_verdict(prompt_type):
    engine = await started(analysis_words=30)
    regex = gqm.verdict_regex(4, prompt_type)
    (generation,) = await engine.generate(
        [group_prompt(MARKED, prompt_type=prompt_type)], SamplingSettings(regex=regex)
    )
    assert re.fullmatch(regex, generation.text)
    assert generation.text.count("\n") == (1 if prompt_type == "ranking_score" else 0)  # no analysis
    expected = gqm.parse_group_answer(gqm.render_answer(MARKED_SCORES, prompt_type), 4, prompt_type)
    assert gqm.parse_group_answer(generation.text, 4, prompt_type) == expected


@pytest.mark.parametrize("prompt_type", gqm.PROMPT_TYPES)
async def test_regex_in_grrm_order_gives_grrm_verdict(prompt_type):
    engine = await started()
    verdict = gqm.render_answer(MARKED_SCORES, prompt_type)
    (generation,) = await engine.generate(
        [group_prompt(MARKED, prompt_type=prompt_type)], SamplingSettings(regex=re.escape(verdict))
    )
    assert generation.text == verdict


async def test_regex_the_verdict_cannot_match_is_unsupported():
    engine = await started()
    with pytest.raises(EngineUnsupportedError, match="scripted engine can only satisfy"):
        await engine.generate([group_prompt(MARKED)], SamplingSettings(regex=r"[0-9]+"))
    with pytest.raises(EngineUnsupportedError):
        await engine.generate([apply_chat_template(engine.tokenizer, "hi")], SamplingSettings(regex=r".*"))


async def test_regex_on_single_prompt_gives_the_integer():
    engine = await started()
    (generation,) = await engine.generate([single_prompt("ok [q=8]")], SamplingSettings(regex=r"(10|[0-9])"))
    assert generation.text == "8"


async def test_malformed_under_regex_stays_inside_the_regex():
    engine = await started()
    # A ranking line may repeat a letter within the verdict regex: that is what comes out.
    engine.script_failures(["malformed"])
    regex = gqm.verdict_regex(4, "ranking")
    (generation,) = await engine.generate([group_prompt(MARKED, prompt_type="ranking")], SamplingSettings(regex=regex))
    assert re.fullmatch(regex, generation.text)
    assert gqm.parse_group_answer(generation.text, 4, "ranking") is None
    # A regex that admits only parseable verdicts: a constrained decoder cannot be malformed.
    engine.script_failures(["malformed"])
    regex = gqm.verdict_regex(4, "score")
    (generation,) = await engine.generate([group_prompt(MARKED, prompt_type="score")], SamplingSettings(regex=regex))
    assert re.fullmatch(regex, generation.text)
    assert gqm.parse_group_answer(generation.text, 4, "score") == MARKED_SCORES


# ----------------------------------------------------------------------------- failures


async def test_scripted_failures_happen_in_order():
    engine = await started(analysis_words=8)
    engine.script_failures(["malformed", "error", "ok", "hang", "ok"])
    prompt = group_prompt(MARKED)

    (malformed,) = await engine.generate([prompt], GREEDY)
    assert gqm.parse_group_answer(malformed.text, 4) is None
    assert gqm.last_line(malformed.text) == MALFORMED_LAST_LINE
    assert count_scripted_tokens(malformed.text.split("\n\n")[0]) == 8  # the analysis is kept
    assert malformed.extra["injected"] == "malformed"

    with pytest.raises(EngineError, match="injected"):
        await engine.generate([prompt], GREEDY)

    (ok,) = await engine.generate([prompt], GREEDY)
    assert gqm.parse_group_answer(ok.text, 4) == MARKED_SCORES

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.generate([prompt], GREEDY), timeout=0.2)

    (ok,) = await engine.generate([prompt], GREEDY)
    assert gqm.parse_group_answer(ok.text, 4) == MARKED_SCORES
    assert engine.pending_failures == []
    assert engine.failures_injected == {"malformed": 1, "error": 1, "hang": 1}
    assert engine.generations_served == 3
    assert len(engine.prompts_seen) == 5


async def test_failures_within_a_batch_apply_per_prompt_in_prompt_order():
    engine = await started()
    engine.script_failures(["ok", "malformed", "ok"])
    prompts = [group_prompt(MARKED)] * 3
    generations = await engine.generate(prompts, GREEDY)
    assert [gqm.parse_group_answer(g.text, 4) is not None for g in generations] == [True, False, True]


async def test_an_error_fails_the_whole_batch():
    engine = await started(per_prompt_s=0.05)
    engine.script_failures(["ok", "error", "error"])
    with pytest.raises(EngineError, match="injected"):
        await engine.generate([group_prompt(MARKED)] * 3, GREEDY)
    assert engine.generations_served == 0
    assert engine.generate_calls == 0


async def test_a_hanging_member_hangs_the_batch_and_cancelling_cleans_up():
    engine = await started(per_prompt_s=0.01)
    engine.script_failures(["ok", "hang", "ok"])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.generate([group_prompt(MARKED)] * 3, GREEDY), timeout=0.3)
    await asyncio.sleep(0)
    assert engine.generate_calls == 0
    # The engine still serves afterwards.
    assert len(await engine.generate([group_prompt(MARKED)], GREEDY)) == 1


async def test_stop_ends_hung_generations():
    engine = await started()
    engine.script_failures(["hang"])
    task = asyncio.ensure_future(engine.generate([group_prompt(MARKED)], GREEDY))
    await asyncio.sleep(0.05)
    assert not task.done()
    await engine.stop()
    with pytest.raises(EngineError):
        await asyncio.wait_for(task, timeout=1)


async def test_random_failures_follow_the_rates_and_the_seed():
    async def kinds(seed):
        engine = await started(malformed_rate=0.3, error_rate=0.2, seed=seed, analysis_words=0)
        out = []
        for _ in range(300):
            try:
                (generation,) = await engine.generate([group_prompt(MARKED)], GREEDY)
                out.append(generation.extra["injected"])
            except EngineError:
                out.append("error")
        return out

    first, again, other = await kinds(7), await kinds(7), await kinds(8)
    assert first == again
    assert first != other
    assert 0.2 < first.count("malformed") / 300 < 0.4
    assert 0.1 < first.count("error") / 300 < 0.3


async def test_hang_rate_one_always_hangs_and_error_rate_one_always_fails():
    hanging = await started(hang_rate=1.0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(hanging.generate([group_prompt(MARKED)], GREEDY), timeout=0.1)
    failing = await started(error_rate=1.0)
    for _ in range(3):
        with pytest.raises(EngineError):
            await failing.generate([group_prompt(MARKED)], GREEDY)


def test_script_failures_rejects_unknown_kinds():
    engine = make()
    with pytest.raises(ValueError, match="unknown failure kind"):
        engine.script_failures(["crash"])
    with pytest.raises(TypeError):
        engine.script_failures("error")


# ----------------------------------------------------------------------------- health


async def test_health_lifecycle_and_kill():
    engine = make()
    with pytest.raises(EngineError, match="not started"):
        await engine.check_health()
    with pytest.raises(EngineError):
        await engine.generate([group_prompt(MARKED)], GREEDY)
    await engine.start()
    await engine.start()  # idempotent
    await engine.check_health()
    engine.kill()
    with pytest.raises(EngineDeadError, match="dead"):
        await engine.check_health()
    with pytest.raises(EngineDeadError):
        await engine.generate([group_prompt(MARKED)], GREEDY)
    await engine.stop()
    await engine.stop()  # idempotent


async def test_kill_fails_in_flight_generations():
    engine = await started(per_prompt_s=0.2)
    task = asyncio.ensure_future(engine.generate([group_prompt(MARKED)], GREEDY))
    await asyncio.sleep(0.05)
    engine.kill()
    with pytest.raises(EngineDeadError):
        await task


async def test_a_stalled_engine_answers_neither_generations_nor_health_checks_until_stopped():
    engine = await started()
    engine.stall()
    generation = asyncio.ensure_future(engine.generate([group_prompt(MARKED)], GREEDY))
    health = asyncio.ensure_future(engine.check_health())
    await asyncio.sleep(0.1)
    assert not generation.done() and not health.done()
    engine.kill()
    with pytest.raises(EngineDeadError):
        await health
    with pytest.raises(EngineDeadError):
        await generation


async def test_the_slow_probe_knob_delays_only_health_probes_after_its_generations():
    engine = await started(slow_probes_after_generations=1, slow_probes=1, slow_probe_s=30.0)
    await engine.check_health()  # before the first generation: at once
    await engine.generate([group_prompt(MARKED)], GREEDY)  # generations never wait on the knob
    late = asyncio.ensure_future(engine.check_health())
    await asyncio.sleep(0)  # the late probe has started (and sleeps)
    assert engine.slow_probes_served == 1 and not late.done()
    await engine.check_health()  # the next probe is on time again: only slow_probes are late
    await engine.generate([group_prompt(MARKED)], GREEDY)
    assert not late.done()
    late.cancel()


def test_the_slow_probe_knob_needs_a_delay():
    with pytest.raises(ValueError, match="slow_probe_s"):
        EngineConfig(kind="scripted", scripted={"slow_probes_after_generations": 0})


# ----------------------------------------------------------------------------- determinism


async def test_greedy_output_is_identical_across_engines_and_calls():
    prompts = [group_prompt(MARKED), group_prompt(["x", "y", "z"])]
    a, b = await started(analysis_words=15), await started(analysis_words=15, seed=99)
    first = [g.text for g in await a.generate(prompts, GREEDY)]
    assert first == [g.text for g in await a.generate(prompts, GREEDY)]
    assert first == [g.text for g in await b.generate(prompts, GREEDY)]


async def test_sampling_seed_varies_the_analysis_but_not_the_verdict():
    prompt = group_prompt(MARKED)
    engine = await started(analysis_words=15)
    texts = {}
    for seed in range(5):
        (generation,) = await engine.generate([prompt], SamplingSettings(temperature=1.0, seed=seed))
        texts[seed] = generation.text
        assert gqm.parse_group_answer(generation.text, 4) == MARKED_SCORES
    assert len(set(texts.values())) > 1
    (repeat,) = await (await started(analysis_words=15)).generate([prompt], SamplingSettings(temperature=1.0, seed=3))
    assert repeat.text == texts[3]


async def test_unseeded_sampling_is_reproducible_from_the_engine_seed():
    prompt = group_prompt(MARKED)
    sampling = SamplingSettings(temperature=0.7)

    async def run(seed):
        engine = await started(analysis_words=10, seed=seed)
        return [(await engine.generate([prompt], sampling))[0].text for _ in range(3)]

    first = await run(1)
    assert first == await run(1)
    assert len(set(first)) > 1


# ----------------------------------------------------------------------------- latency


def latency_seconds(engine) -> list[float]:
    """The seconds each generation is given in the latency model, recorded as it enters it: the model's
    arithmetic read exactly, not off the clock."""
    seconds, run_for = [], engine._run_for

    async def recorded(delay: float) -> None:
        seconds.append(delay)
        await run_for(delay)

    engine._run_for = recorded
    return seconds


async def test_batch_members_run_concurrently():
    engine = await started(per_prompt_s=0.2)
    seconds, all_in, run_for = [], asyncio.Event(), engine._run_for

    async def held(delay: float) -> None:
        seconds.append(delay)
        if len(seconds) == 8:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 30)  # one after another, the first would wait here alone
        await run_for(delay)

    engine._run_for = held
    await engine.generate([group_prompt(MARKED)] * 8, GREEDY)
    assert seconds == [pytest.approx(0.2)] * 8  # all 8 in their latency at once, one prompt's each


async def test_latency_grows_with_completion_and_prompt_tokens():
    engine = await started(per_token_s=0.005, analysis_words=20)
    seconds = latency_seconds(engine)
    (generation,) = await engine.generate([group_prompt(MARKED)], GREEDY)
    assert generation.completion_tokens > 0 and seconds == [pytest.approx(0.005 * generation.completion_tokens)]

    prefill = await started(prefill_token_s=0.002)
    seconds = latency_seconds(prefill)
    prompt = group_prompt(MARKED)
    await prefill.generate([prompt], GREEDY)
    assert seconds == [pytest.approx(0.002 * count_tokens(prefill.tokenizer, prompt))]


async def test_jitter_stays_within_its_bounds():
    engine = await started(per_prompt_s=0.1, jitter=0.5)
    seconds = latency_seconds(engine)
    for _ in range(4):
        await engine.generate([group_prompt(MARKED)], GREEDY)
    assert len(seconds) == 4 and all(0.05 <= delay <= 0.15 for delay in seconds)
    assert max(seconds) - min(seconds) > 0.005  # it does vary


# ----------------------------------------------------------------------------- bookkeeping, tokenizer files


async def test_prompt_history_is_bounded():
    engine = await started()
    engine.history_limit = 3
    for i in range(5):
        await engine.generate([group_prompt([f"a{i}", "b"])], GREEDY)
    assert engine.prompts_seen == [group_prompt([f"a{i}", "b"]) for i in (2, 3, 4)]
    assert engine.batch_sizes == [1, 1, 1]
    assert engine.generations_served == 5


async def test_a_tokenizer_directory_is_loaded_with_transformers(tmp_path, monkeypatch):
    """Wiring only: a FAKE ``transformers`` module stands in for the real package here."""
    (tmp_path / "tokenizer_config.json").write_text("{}")
    loaded = []

    class FakeAutoTokenizer:
        @staticmethod
        def from_pretrained(path):
            loaded.append(path)
            return ScriptedTokenizer()

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=FakeAutoTokenizer))
    engine = ScriptedEngine(EngineConfig(kind="scripted", model=str(tmp_path)))
    with pytest.raises(EngineError, match="start"):
        engine.tokenizer
    isinstance(engine, Engine)  # the protocol check must not raise before start()
    await engine.start()
    assert loaded == [str(tmp_path)]
    (generation,) = await engine.generate([group_prompt(MARKED)], GREEDY)
    assert gqm.parse_group_answer(generation.text, 4) == MARKED_SCORES


def test_default_engine_needs_no_files():
    engine = ScriptedEngine(EngineConfig(kind="scripted", model="no/such/model"))
    assert isinstance(engine.tokenizer, ScriptedTokenizer)


@pytest.mark.parametrize(("limit", "expected_peak"), [(None, 6), (2, 2), (1, 1)])
async def test_max_concurrent_prompts_bounds_the_latency_model(monkeypatch, limit, expected_peak):
    """With a limit, generations queue for the engine's capacity (a busy GPU), without one they overlap."""
    import simulated.scripted_engine as scripted_module
    from cluster.engines import ScriptedEngineOptions

    running, peak = 0, 0
    real_sleep = asyncio.sleep

    async def counting_sleep(delay):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await real_sleep(0)
        await real_sleep(0)
        running -= 1

    # Only the scripted engine's sleeps: patching asyncio.sleep itself would also count those of
    # other threads' event loops in this process (a Serve handle's router, left by an earlier test).
    monkeypatch.setattr(scripted_module, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": counting_sleep}))
    options = ScriptedEngineOptions(per_prompt_s=1.0, max_concurrent_prompts=limit)
    engine = make_engine(EngineConfig(kind="scripted", scripted=options))
    await engine.start()
    prompt = gqm.build_group_prompt("Hello.", ["Hallo.", "Servus."], "en", "de")
    outputs = await asyncio.gather(*(engine.generate([prompt], SamplingSettings(max_tokens=64)) for _ in range(6)))
    assert len(outputs) == 6 and peak == expected_peak
    await engine.stop()
