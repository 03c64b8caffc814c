"""Independent tests of ``cluster.gqm`` against the wire-format spec ``docs/gqm.md``.

Every expected prompt, task sentence, example sentence and language name below is typed from
the spec (its Python-literal templates and its tables), never copied from ``cluster/gqm.py``,
and the property tests compare against a reference built here by plain string concatenation.

Where the spec does not settle a question, the test carries a ``# spec-ambiguous:`` comment
and asserts the project's choice (the literal reading, or the reference implementation's
behaviour where the two differ, as said at the test).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.gqm import (
    GQMInputError,
    GroupPrompt,
    SinglePrompt,
    build_group_prompt,
    build_single_prompt,
    embedded_prompt,
    extract_translation,
    mean_ranking_accuracy,
    parse_group_answer,
    parse_group_prompt,
    parse_prompt,
    parse_single_prompt,
    ranking_accuracy,
    render_answer,
    verdict_regex,
)
from tests.gqm_spec import SPEC_LANGUAGES, spec_group_prompt, spec_single_prompt

FAST = settings(max_examples=200, deadline=None)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
PROMPT_TYPES = ["ranking_score", "ranking", "score"]
EXTRACTORS = ["codeblock", "line", "oneline", "none"]

# The spec's tables and its prompts by plain concatenation (sections 1, 1b, 2): tests/gqm_spec.py.
# Language slots there take codes or names; the tests below pass names where they pass names.
reference_group_prompt = spec_group_prompt
reference_single_prompt = spec_single_prompt


def dense_tier_scores(scores):
    """Spec 3 `ranking`: score = (number of tiers) - 1 - (tier index); tiers = distinct values, best first."""
    tiers = sorted(set(scores), reverse=True)
    return [len(tiers) - 1 - tiers.index(s) for s in scores]


# --------------------------------------------------------------------------------------------
# Golden, byte-exact prompts (hand-written from the spec).
# --------------------------------------------------------------------------------------------

G_SOURCE = "The cat sat on the mat."
G_CANDIDATES = ["Le chat était assis sur le tapis.", "Le chat s'est assis sur le tapis.", "Chat tapis."]

GOLDEN_GROUP = {
    ("ranking_score", False): (
        "Given a source text in English and multiple translation candidates in French. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, rank and score the candidates with integer scores on a scale from 0 to 10.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "The cat sat on the mat.\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "Le chat était assis sur le tapis.\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "Le chat s'est assis sur le tapis.\n"
        "```\n"
        "Translation C:\n"
        "```\n"
        "Chat tapis.\n"
        "```\n"
    ),
    ("ranking_score", True): (
        "Given a source text in English and multiple translation candidates in French. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, rank and score the candidates with integer scores on a scale from 0 to 10. "
        "At the end section, first output the rankings in descending order, for example: `B > A = D > C`. "
        "Then, on the last line, output the scores, for example: `B: 9, A: 7, D: 7, C: 2`.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "The cat sat on the mat.\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "Le chat était assis sur le tapis.\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "Le chat s'est assis sur le tapis.\n"
        "```\n"
        "Translation C:\n"
        "```\n"
        "Chat tapis.\n"
        "```\n"
    ),
    ("ranking", False): (
        "Given a source text in English and multiple translation candidates in French. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, rank the candidates in order of quality from best to worst.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "The cat sat on the mat.\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "Le chat était assis sur le tapis.\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "Le chat s'est assis sur le tapis.\n"
        "```\n"
        "Translation C:\n"
        "```\n"
        "Chat tapis.\n"
        "```\n"
    ),
    ("ranking", True): (
        "Given a source text in English and multiple translation candidates in French. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, rank the candidates in order of quality from best to worst. "
        "Output the rankings in descending order on the last line, for example: `B > A = D > C`.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "The cat sat on the mat.\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "Le chat était assis sur le tapis.\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "Le chat s'est assis sur le tapis.\n"
        "```\n"
        "Translation C:\n"
        "```\n"
        "Chat tapis.\n"
        "```\n"
    ),
    ("score", False): (
        "Given a source text in English and multiple translation candidates in French. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, score the candidates with integer scores on a scale from 0 to 10.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "The cat sat on the mat.\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "Le chat était assis sur le tapis.\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "Le chat s'est assis sur le tapis.\n"
        "```\n"
        "Translation C:\n"
        "```\n"
        "Chat tapis.\n"
        "```\n"
    ),
    ("score", True): (
        "Given a source text in English and multiple translation candidates in French. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, score the candidates with integer scores on a scale from 0 to 10. "
        "Output the scores on the last line, for example: `A: 4, B: 9, C: 7, D: 9`.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "The cat sat on the mat.\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "Le chat était assis sur le tapis.\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "Le chat s'est assis sur le tapis.\n"
        "```\n"
        "Translation C:\n"
        "```\n"
        "Chat tapis.\n"
        "```\n"
    ),
}


@pytest.mark.parametrize("prompt_type, add_example", list(GOLDEN_GROUP))
def test_group_prompt_golden(prompt_type, add_example):
    prompt = build_group_prompt(G_SOURCE, G_CANDIDATES, "en", "fr", prompt_type, add_example)
    assert prompt == GOLDEN_GROUP[(prompt_type, add_example)]


def test_group_prompt_golden_defaults_are_ranking_score_without_example():
    assert build_group_prompt(G_SOURCE, G_CANDIDATES, "en", "fr") == GOLDEN_GROUP[("ranking_score", False)]


def test_group_prompt_golden_two_candidates_multiline_and_braces():
    # Multi-line source, braces that a naive str.format would choke on, names passed through.
    prompt = build_group_prompt("line 1\nline {0} {}", ["{x}", ""], "Klingon", "zh", "ranking")
    assert prompt == (
        "Given a source text in Klingon and multiple translation candidates in Chinese. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
        "Finally, rank the candidates in order of quality from best to worst.\n"
        "\n"
        "Source text:\n"
        "```\n"
        "line 1\n"
        "line {0} {}\n"
        "```\n"
        "\n"
        "Translation A:\n"
        "```\n"
        "{x}\n"
        "```\n"
        "Translation B:\n"
        "```\n"
        "\n"
        "```\n"
    )


def test_group_prompt_26_candidates_labels_a_to_z():
    candidates = [f"cand {i}" for i in range(26)]
    prompt = build_group_prompt("src", candidates, "de", "en")
    tail = "".join(f"Translation {LETTERS[i]}:\n```\ncand {i}\n```\n" for i in range(26))
    assert prompt.endswith("Source text:\n```\nsrc\n```\n\n" + tail)
    assert "Translation Z:\n```\ncand 25\n```\n" in prompt


def test_single_prompt_golden():
    prompt = build_single_prompt("Hello world.", "Hallo Welt.", "en", "de")
    assert prompt == (
        "Given a source text in English and a translation text in German. "
        "Perform a step by step analysis of translation quality and assign a score on a scale from 0 to 10.\n"
        "Source text:\n"
        "```\n"
        "Hello world.\n"
        "```\n"
        "\n"
        "Translation text:\n"
        "```\n"
        "Hallo Welt.\n"
        "```\n"
    )


def test_single_prompt_golden_names_and_braces():
    prompt = build_single_prompt("{}", "{0}\n`x`", "Esperanto", "uk")
    assert prompt == (
        "Given a source text in Esperanto and a translation text in Ukrainian. "
        "Perform a step by step analysis of translation quality and assign a score on a scale from 0 to 10.\n"
        "Source text:\n```\n{}\n```\n\nTranslation text:\n```\n{0}\n`x`\n```\n"
    )


# --------------------------------------------------------------------------------------------
# A reference translation and notes (spec sections 1b and 2), golden prompts typed from the spec.
# --------------------------------------------------------------------------------------------

# The spec's worked example: source 你好, candidates Hello and Hi, zh -> en, ranking_score,
# reference "Hello there" in en, no notes.
WORKED_EXAMPLE = (
    "Given a source text in Chinese and multiple translation candidates in English. Perform a step by step "
    "analysis and comparison of the translation quality for the candidates. Finally, rank and score the "
    "candidates with integer scores on a scale from 0 to 10.\n\nSource text:\n```\n你好\n```\n\n"
    "Translation A:\n```\nHello\n```\nTranslation B:\n```\nHi\n```\n\n\nYou may refer to the following "
    "reference, if helpful, when evaluating the translations.\n\nEnglish reference:\n```\nHello there\n```\n"
)
GROUP_NOTES_BLOCK = (
    "\n\nYou may refer to the following notes, if helpful, when evaluating the translations.\n\n"
    "Notes:\n```\nKeep it short.\n```\n"
)


def test_group_prompt_with_a_reference_is_the_spec_worked_example():
    prompt = build_group_prompt("你好", ["Hello", "Hi"], "zh", "en", ref_text="Hello there", ref_lang="en")
    assert prompt == WORKED_EXAMPLE


def test_group_prompt_reference_then_notes_both_stripped():
    prompt = build_group_prompt(
        "你好", ["Hello", "Hi"], "zh", "en", ref_text="\n Hello there \t", ref_lang=" en ", notes="  Keep it short.\n"
    )
    assert prompt == WORKED_EXAMPLE + GROUP_NOTES_BLOCK
    # Notes alone follow the last candidate block directly.
    notes_only = build_group_prompt("你好", ["Hello", "Hi"], "zh", "en", notes="Keep it short.")
    assert notes_only == WORKED_EXAMPLE.split("\n\nYou may refer")[0] + GROUP_NOTES_BLOCK


def test_reference_language_maps_codes_and_passes_names():
    by_code = build_group_prompt("s", ["a", "b"], "en", "de", ref_text="r", ref_lang="zh")
    assert "\n\nChinese reference:\n```\nr\n```\n" in by_code
    by_name = build_group_prompt("s", ["a", "b"], "en", "de", ref_text="r", ref_lang="Klingon")
    assert by_name.endswith("\n\nKlingon reference:\n```\nr\n```\n")


@pytest.mark.parametrize("context", [
    {},
    {"ref_text": None, "ref_lang": None, "notes": None},
    {"ref_text": "", "ref_lang": ""},
    {"ref_text": " \n\t", "ref_lang": "  "},
    {"notes": ""},
    {"notes": " \r\n\u3000"},
    {"ref_text": "\u00a0", "ref_lang": "", "notes": "\n"},
])
def test_missing_or_blank_reference_and_notes_leave_the_prompt_as_section_1(context):
    for prompt_type, add_example in GOLDEN_GROUP:
        prompt = build_group_prompt(G_SOURCE, G_CANDIDATES, "en", "fr", prompt_type, add_example, **context)
        assert prompt == GOLDEN_GROUP[(prompt_type, add_example)]


@pytest.mark.parametrize("context, field, value_text", [
    ({"ref_text": "Hello"}, "ref_text", "given without ref_lang"),
    ({"ref_text": "Hello", "ref_lang": " "}, "ref_text", "given without ref_lang"),
    ({"ref_lang": "en"}, "ref_lang", "given without ref_text"),
    ({"ref_lang": "en", "ref_text": "\n"}, "ref_lang", "given without ref_text"),
    ({"ref_text": "Hello", "ref_lang": "xx"}, "ref_lang", "unknown language code"),
    ({"ref_text": "Hello", "ref_lang": "EN"}, "ref_lang", "unknown language code"),
    ({"ref_text": "Hello", "ref_lang": " q "}, "ref_lang", "unknown language code"),
    ({"ref_text": 3, "ref_lang": "en"}, "ref_text", "must be a string"),
    ({"ref_text": "Hello", "ref_lang": ["en"]}, "ref_lang", "must be a string"),
    ({"notes": b"bytes"}, "notes", "must be a string"),
])
def test_bad_reference_or_notes_is_an_input_error_naming_the_field(context, field, value_text):
    message = assert_input_error(lambda: build_group_prompt("s", ["a", "b"], "en", "de", **context), field, value_text)
    assert message.startswith(field + ":")


def test_single_prompt_with_notes_uses_the_singular_translation():
    prompt = build_single_prompt("Hallo", "Hello", "de", "en", notes="\tUse British spelling. ")
    assert prompt == (
        "Given a source text in German and a translation text in English. "
        "Perform a step by step analysis of translation quality and assign a score on a scale from 0 to 10.\n"
        "Source text:\n```\nHallo\n```\n\nTranslation text:\n```\nHello\n```\n"
        "\n\nYou may refer to the following notes, if helpful, when evaluating the translation.\n\n"
        "Notes:\n```\nUse British spelling.\n```\n"
    )
    without = build_single_prompt("Hallo", "Hello", "de", "en")
    assert build_single_prompt("Hallo", "Hello", "de", "en", notes=" ") == without
    assert_input_error(lambda: build_single_prompt("s", "c", "de", "en", notes=1), "notes", "must be a string")


def test_prompts_with_a_reference_and_notes_read_back():
    assert parse_group_prompt(WORKED_EXAMPLE) == GroupPrompt(
        "你好", ("Hello", "Hi"), "Chinese", "English", "ranking_score", False, "Hello there", "English", None
    )
    both = parse_prompt(WORKED_EXAMPLE + GROUP_NOTES_BLOCK)
    assert (both.ref_text, both.ref_lang, both.notes) == ("Hello there", "English", "Keep it short.")
    assert build_group_prompt(**vars(both)) == WORKED_EXAMPLE + GROUP_NOTES_BLOCK
    notes_only = parse_group_prompt(build_group_prompt("s", ["a", "b"], "en", "de", "score", True, notes="n"))
    assert (notes_only.ref_text, notes_only.ref_lang, notes_only.notes) == (None, None, "n")
    assert notes_only.candidates == ("a", "b")
    single = parse_prompt(build_single_prompt("s", "c\n```\nd", "de", "en", notes=" n\n```\nm "))
    assert single == SinglePrompt("s", "c\n```\nd", "German", "English", "n\n```\nm")
    assert parse_single_prompt(build_single_prompt("s", "c", "de", "en")).notes is None


def test_a_reference_or_notes_may_hold_candidate_headings_and_fences():
    ref_text = "x\n```\nTranslation C:\n```\ny"
    notes = "Notes:\n```\nTranslation A:\n```\n"
    prompt = build_group_prompt("s", ["a", "b"], "en", "de", ref_text=ref_text, ref_lang="de", notes=notes)
    read = parse_group_prompt(prompt)
    assert read.candidates == ("a", "b") and read.ref_text == ref_text and read.notes == notes.strip()


NOT_CONTEXT_PROMPTS = [
    # Text after the last candidate that is no context block.
    WORKED_EXAMPLE.split("\n\nYou may refer")[0] + "\n\nSee also: the reference.\n",
    # A reference block cut short, one without a language heading, one with an empty text.
    WORKED_EXAMPLE[:-1],
    WORKED_EXAMPLE.replace("English reference:", "English:"),
    WORKED_EXAMPLE.replace("Hello there", ""),
    # A notes block with padded notes, one with none, one cut short.
    WORKED_EXAMPLE + GROUP_NOTES_BLOCK.replace("Keep it short.", " Keep it short."),
    WORKED_EXAMPLE + GROUP_NOTES_BLOCK.replace("Keep it short.\n", ""),
    WORKED_EXAMPLE + GROUP_NOTES_BLOCK[:-2],
]


@pytest.mark.parametrize("text", NOT_CONTEXT_PROMPTS)
def test_a_group_prompt_with_a_broken_context_block_is_no_prompt(text):
    assert "not a GQM group prompt" in assert_input_error(lambda: parse_group_prompt(text), "prompt", "Given")


# --------------------------------------------------------------------------------------------
# Language codes.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, name", sorted(SPEC_LANGUAGES.items()))
def test_language_codes_map_to_names(code, name):
    group = build_group_prompt("s", ["a", "b"], code, code)
    assert group.startswith(f"Given a source text in {name} and multiple translation candidates in {name}. ")
    single = build_single_prompt("s", "a", code, code)
    assert single.startswith(f"Given a source text in {name} and a translation text in {name}. ")


def test_language_code_table_has_exactly_17_codes():
    assert len(SPEC_LANGUAGES) == 17


@pytest.mark.parametrize("name", ["English", "Swahili", "eng", "Simplified Chinese", "Tiếng Việt"])
def test_language_names_longer_than_two_letters_pass_through(name):
    assert build_group_prompt("s", ["a", "b"], name, "en").startswith(f"Given a source text in {name} and ")
    assert build_group_prompt("s", ["a", "b"], "en", name).startswith(
        f"Given a source text in English and multiple translation candidates in {name}. "
    )
    assert build_single_prompt("s", "a", "en", name).startswith(
        f"Given a source text in English and a translation text in {name}. "
    )


@pytest.mark.parametrize("field", ["src_lang", "trg_lang"])
@pytest.mark.parametrize("code", ["xx", "qq", "sw"])
def test_unknown_two_letter_code_is_input_error(field, code):
    kwargs = {"src_lang": "en", "trg_lang": "de", field: code}
    with pytest.raises(GQMInputError) as info:
        build_group_prompt("s", ["a", "b"], kwargs["src_lang"], kwargs["trg_lang"])
    assert field in str(info.value) and code in str(info.value)
    with pytest.raises(GQMInputError) as info:
        build_single_prompt("s", "a", kwargs["src_lang"], kwargs["trg_lang"])
    assert field in str(info.value) and code in str(info.value)


def test_unknown_code_is_not_a_key_error():
    with pytest.raises(ValueError) as info:
        build_group_prompt("s", ["a", "b"], "zz", "en")
    assert not isinstance(info.value, KeyError)


# spec-ambiguous: case sensitivity. The table lists lower-case codes only; read literally,
# "EN" is a two-letter value that is not in the table, hence an unknown code (input error).
@pytest.mark.parametrize("code", ["EN", "De", "zH"])
def test_language_codes_are_case_sensitive(code):
    with pytest.raises(GQMInputError) as info:
        build_group_prompt("s", ["a", "b"], code, "en")
    assert "src_lang" in str(info.value) and code in str(info.value)


# spec-ambiguous: values shorter than two letters ("" or "e") are neither a two-letter code
# nor "longer than two letters"; the only reading that fits "it is already a name" is that
# they are not names, so they are input errors. A two-character name such as "中文" is, read
# literally, a two-letter value, hence an unknown code.
@pytest.mark.parametrize("code", ["", "e", "中文"])
def test_short_language_values_are_input_errors(code):
    with pytest.raises(GQMInputError) as info:
        build_group_prompt("s", ["a", "b"], "en", code)
    assert "trg_lang" in str(info.value)


# --------------------------------------------------------------------------------------------
# Property tests on prompts.
# --------------------------------------------------------------------------------------------

SPECIAL_TEXTS = ["", "{}", "{0}", "{source}", "}{", "```", "```python\nx\n```", "\n", "\r\n", " ", "%s", "\\n"]
no_surrogates = st.characters(blacklist_categories=("Cs",))
texts = st.one_of(
    st.text(no_surrogates, max_size=40),
    st.sampled_from(SPECIAL_TEXTS),
    st.lists(st.one_of(st.text(no_surrogates, max_size=8), st.sampled_from(SPECIAL_TEXTS)), max_size=5).map(
        "".join
    ),
)
lang_values = st.one_of(
    st.sampled_from(sorted(SPEC_LANGUAGES)),
    st.text(no_surrogates, min_size=3, max_size=15),
)


def lang_name(value):
    return SPEC_LANGUAGES[value] if len(value) == 2 else value


@FAST
@given(
    source=texts,
    candidates=st.lists(texts, min_size=2, max_size=26),
    src=lang_values,
    trg=lang_values,
    prompt_type=st.sampled_from(PROMPT_TYPES),
    add_example=st.booleans(),
)
def test_group_prompt_matches_reference_concatenation(source, candidates, src, trg, prompt_type, add_example):
    prompt = build_group_prompt(source, candidates, src, trg, prompt_type, add_example)
    expected = reference_group_prompt(source, candidates, lang_name(src), lang_name(trg), prompt_type, add_example)
    assert prompt == expected
    # Structure: the fixed head, the source block, then one block per candidate, nothing after.
    head = (
        f"Given a source text in {lang_name(src)} and multiple translation candidates in {lang_name(trg)}. "
        "Perform a step by step analysis and comparison of the translation quality for the candidates. "
    )
    assert prompt.startswith(head)
    assert prompt.endswith(candidates[-1] + "\n```\n")
    assert not prompt.endswith("\n```\n\n")
    position = len(head)
    for index, candidate in enumerate(candidates):
        block = f"Translation {LETTERS[index]}:\n```\n{candidate}\n```\n"
        found = prompt.find(block, position)
        assert found >= position
        position = found + len(block)
    assert position == len(prompt)


@FAST
@given(source=texts, candidate=texts, src=lang_values, trg=lang_values)
def test_single_prompt_matches_reference_concatenation(source, candidate, src, trg):
    prompt = build_single_prompt(source, candidate, src, trg)
    assert prompt == reference_single_prompt(source, candidate, lang_name(src), lang_name(trg))
    assert prompt.endswith("Translation text:\n```\n" + candidate + "\n```\n")


# Reading prompts back (the inverse of the builders, for scripted engines). Texts may hold
# anything but a closing fence line followed by a heading line: the one place the format cannot
# tell a text from its own structure, as the builders paste texts as given.
STRUCTURE_TEXTS = ["Translation A:", "Translation B:\n```\n", "Translation text:", "Source text:\n```\n", "\n```\n"]
prompt_texts = st.one_of(
    texts,
    st.lists(st.one_of(texts, st.sampled_from(STRUCTURE_TEXTS)), max_size=5).map("".join),
).filter(lambda text: "\n```\nTranslation " not in text and "\n```\n\nTranslation " not in text)
# A language name may not hold the words that follow it in the prompt.
prompt_lang_values = lang_values.filter(lambda name: " and " not in name and ". Perform" not in name)


# A reference (text, language) and notes, or none: a blank text reads back as no block.
references = st.one_of(st.none(), st.tuples(
    prompt_texts.filter(str.strip),
    prompt_lang_values.map(str.strip).filter(lambda value: len(value) > 2 or value in SPEC_LANGUAGES),
))
notes_values = st.one_of(st.none(), texts)


def stripped_or_none(text):
    return None if text is None or not text.strip() else text.strip()


@FAST
@given(
    source=prompt_texts,
    candidates=st.lists(prompt_texts, min_size=2, max_size=26),
    src=prompt_lang_values,
    trg=prompt_lang_values,
    prompt_type=st.sampled_from(PROMPT_TYPES),
    add_example=st.booleans(),
    reference=references,
    notes=notes_values,
)
def test_group_prompt_reads_back_as_what_built_it(
    source, candidates, src, trg, prompt_type, add_example, reference, notes
):
    ref_text, ref_lang = reference or (None, None)
    prompt = build_group_prompt(
        source, candidates, src, trg, prompt_type, add_example, ref_text=ref_text, ref_lang=ref_lang, notes=notes
    )
    expected = GroupPrompt(
        source, tuple(candidates), lang_name(src), lang_name(trg), prompt_type, add_example,
        stripped_or_none(ref_text), None if ref_lang is None else lang_name(ref_lang), stripped_or_none(notes),
    )
    assert parse_group_prompt(prompt) == expected
    assert parse_prompt(prompt) == expected
    assert embedded_prompt("<s>[INST] " + prompt + " [/INST]") == prompt


@FAST
@given(source=prompt_texts, candidate=texts, src=prompt_lang_values, trg=prompt_lang_values, notes=notes_values)
def test_single_prompt_reads_back_as_what_built_it(source, candidate, src, trg, notes):
    prompt = build_single_prompt(source, candidate, src, trg, notes=notes)
    expected = SinglePrompt(source, candidate, lang_name(src), lang_name(trg), stripped_or_none(notes))
    assert parse_single_prompt(prompt) == expected
    assert parse_prompt(prompt) == expected


def test_prompt_read_back_rebuilds_the_same_bytes():
    group = parse_group_prompt(GOLDEN_GROUP[("score", True)])
    assert group.prompt_type == "score" and group.add_example
    assert build_group_prompt(**vars(group)) == GOLDEN_GROUP[("score", True)]
    assert group.candidates == tuple(G_CANDIDATES)


NOT_PROMPTS = [
    "",
    "Translate this.",
    "Given a source text in English",
    # A group prompt with a task sentence the spec does not have.
    reference_group_prompt("s", ["a", "b"], "English", "French", "ranking", False).replace("best to worst", "worst"),
    # One candidate only.
    reference_group_prompt("s", ["a", "b"], "English", "French", "score", False).split("Translation B:")[0],
    # Cut short: no closing fence.
    reference_group_prompt("s", ["a", "b"], "English", "French", "score", False)[:-5],
    reference_single_prompt("s", "a", "English", "French")[:-1],
]


@pytest.mark.parametrize("text", NOT_PROMPTS)
def test_reading_back_a_text_that_is_no_prompt_is_an_input_error(text):
    message = assert_input_error(lambda: parse_prompt(text), "prompt", repr(text)[:20])
    assert "not a GQM group prompt" in message and "not an SQM single prompt" in message


def test_reading_back_names_the_prompt_kind_it_wanted():
    single = reference_single_prompt("s", "a", "English", "French")
    assert "not a GQM group prompt" in assert_input_error(lambda: parse_group_prompt(single), "prompt", "Given")
    group = reference_group_prompt("s", ["a", "b"], "English", "French", "score", False)
    assert "not an SQM single prompt" in assert_input_error(lambda: parse_single_prompt(group), "prompt", "Given")
    assert_input_error(lambda: parse_prompt(None), "prompt", "None")
    assert embedded_prompt("no prompt here\n```\n") is None


def test_group_prompt_accepts_tuple_of_candidates():
    assert build_group_prompt(G_SOURCE, tuple(G_CANDIDATES), "en", "fr") == GOLDEN_GROUP[("ranking_score", False)]


# --------------------------------------------------------------------------------------------
# Reading answers: round trips and properties.
# --------------------------------------------------------------------------------------------

score_lists = st.integers(min_value=2, max_value=26).flatmap(
    lambda n: st.lists(st.integers(min_value=0, max_value=10), min_size=n, max_size=n)
)


@FAST
@given(scores=score_lists, prompt_type=st.sampled_from(["ranking_score", "score"]))
def test_parse_render_round_trip(scores, prompt_type):
    answer = render_answer(scores, prompt_type)
    assert parse_group_answer(answer, len(scores), prompt_type) == scores


@FAST
@given(scores=score_lists)
def test_parse_render_ranking_gives_dense_tier_scores(scores):
    answer = render_answer(scores, "ranking")
    assert parse_group_answer(answer, len(scores), "ranking") == dense_tier_scores(scores)


def test_dense_tier_scores_example_from_spec():
    # "B > A = D > C": three tiers, B best (2), C lowest (0).
    assert parse_group_answer("B > A = D > C", 4, "ranking") == [1, 2, 0, 1]
    assert dense_tier_scores([7, 9, 1, 7]) == [1, 2, 0, 1]
    # The spec's own example: "C > A = B" is C: 1, A: 0, B: 0.
    assert parse_group_answer("C > A = B", 3, "ranking") == [0, 0, 1]


analysis_texts = st.text(no_surrogates, max_size=200)


@FAST
@given(scores=score_lists, prompt_type=st.sampled_from(PROMPT_TYPES), analysis=analysis_texts)
def test_analysis_before_the_verdict_does_not_matter(scores, prompt_type, analysis):
    verdict = render_answer(scores, prompt_type)
    expected = dense_tier_scores(scores) if prompt_type == "ranking" else scores
    assert parse_group_answer(analysis + "\n" + verdict, len(scores), prompt_type) == expected
    assert parse_group_answer(render_answer(scores, prompt_type, analysis), len(scores), prompt_type) == expected


@FAST
@given(data=st.data(), scores=score_lists, analysis=analysis_texts)
def test_ranking_score_letters_in_any_order(data, scores, analysis):
    n = len(scores)
    order = data.draw(st.permutations(range(n)))
    line = ", ".join(f"{LETTERS[i]}: {scores[i]}" for i in order)
    assert parse_group_answer(analysis + "\n" + line, n, "ranking_score") == scores
    assert parse_group_answer(line, n, "ranking_score") == scores


@FAST
@given(data=st.data(), scores=score_lists)
def test_ranking_any_member_order_within_and_across_tiers(data, scores):
    n = len(scores)
    tiers = sorted(set(scores), reverse=True)
    parts = []
    for value in tiers:
        members = [LETTERS[i] for i in range(n) if scores[i] == value]
        members = data.draw(st.permutations(members))
        sep = data.draw(st.sampled_from(["=", " = ", "= ", " ="]))
        parts.append(sep.join(members))
    line = data.draw(st.sampled_from([">", " > ", "  >  "])).join(parts)
    assert parse_group_answer(line, n, "ranking") == dense_tier_scores(scores)


@FAST
@given(scores=score_lists, prompt_type=st.sampled_from(PROMPT_TYPES))
def test_verdict_regex_fullmatches_render_answer(scores, prompt_type):
    pattern = verdict_regex(len(scores), prompt_type)
    if prompt_type == "ranking_score":
        # The regex (a project helper, not in the spec) asks for the score line in candidate
        # order, while render_answer writes it best first like GRRM; the ranking line and the
        # candidate-order score line that render_answer produces must match it.
        verdict = render_answer(scores, "ranking") + "\n" + render_answer(scores, "score")
        assert re.fullmatch(pattern, verdict)
        assert parse_group_answer(verdict, len(scores), prompt_type) == scores
    else:
        assert re.fullmatch(pattern, render_answer(scores, prompt_type))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(min_value=2, max_value=26), prompt_type=st.sampled_from(PROMPT_TYPES))
def test_verdict_regex_admits_only_parseable_or_letter_misordered_lines(data, n, prompt_type):
    verdict = data.draw(st.from_regex(verdict_regex(n, prompt_type), fullmatch=True))
    last = verdict.strip().rsplit("\n", 1)[-1]
    letters = re.findall(r"[A-Z]", last)
    parsed = parse_group_answer(verdict, n, prompt_type)
    if prompt_type == "score" or sorted(letters) == list(LETTERS[:n]):
        assert parsed is not None
        assert len(parsed) == n


@pytest.mark.parametrize(
    "n, prompt_type, line",
    [
        (3, "score", "A: 11, B: 2, C: 3"),
        (3, "score", "A: 1, B: 2"),
        (3, "score", "A: 1, B: 2, D: 3"),
        (3, "ranking", "A > B > D"),
        (3, "ranking", "A > B < C"),
        (3, "ranking_score", "A > B > C\nA: 1, B: 2, C: -1"),
        (2, "ranking_score", "A: 1, B: 2"),  # ranking line missing
    ],
)
def test_verdict_regex_rejects_bad_verdicts(n, prompt_type, line):
    assert re.fullmatch(verdict_regex(n, prompt_type), line) is None


# --------------------------------------------------------------------------------------------
# Reading answers: tables of valid and malformed answers (n = 3 unless stated).
# --------------------------------------------------------------------------------------------

MALFORMED = {
    "ranking_score": [
        "A: 5, B: 3",  # missing letter
        "B: 3, C: 2",  # missing A
        "A: 5, B: 3, C: 2, D: 1",  # letter beyond n
        "A: 5, B: 3, D: 2",  # letter beyond n instead of C
        "A: 5, A: 3, C: 2",  # repeated letter (and B missing)
        "A: 5, B: 3, C: 2, A: 5",  # repeated letter, all present
        "A: 11, B: 3, C: 2",  # above 10
        "A: 5, B: -1, C: 2",  # below 0
        "A: 100, B: 3, C: 2",
        "A: 7.5, B: 3, C: 2",  # not an integer
        "A: seven, B: 3, C: 2",
        "A: 5 points, B: 3, C: 2",
        "A: , B: 3, C: 2",  # empty value
        "A: 5, B: 3, C: 2.",  # trailing period
        "A 5, B: 3, C: 2",  # item without colon
        "A:: 5, B: 3, C: 2",  # double colon
        "A: 5: 5, B: 3, C: 2",  # two colons
        "A: 5, B: 3, C: 2,",  # trailing comma
        ", A: 5, B: 3, C: 2",  # leading comma
        "A: 5,, B: 3, C: 2",  # empty item
        "A: 5; B: 3; C: 2",  # wrong separator
        "a: 5, b: 3, c: 2",  # lower-case letters are not candidate letters
        "Translation A: 5, Translation B: 3, Translation C: 2",
        "AB: 5, B: 3, C: 2",
        "",  # empty text
        "   ",  # whitespace only
        " \n\t\r\n ",
        "A: 5, B: 3, C: 2\nB > A > C",  # last line is the ranking
        "A: 5, B: 3, C: 2\nThat is my verdict.",
        "analysis\rA: 5, B: 3, C: 2",  # a lone \r is not a line break: the last line is all of it
        "A > B > C",  # ranking only
        "5, 3, 2",  # bare integers are a `score` thing
        "A: 5 B: 3 C: 2",
    ],
    "ranking": [
        "A < B < C",  # contains <
        "A > B < C",
        "C < B < A",
        "A > B",  # missing member
        "A = B",
        "A > B > C > D",  # extra member
        "A > B > D",  # wrong member
        "A > A > B",  # repeated member, C missing
        "A > B = B > C",  # repeated member, count 4
        "A > B > C > A",
        "A > B >",  # empty member
        "A > B > C >",  # trailing empty tier
        "> A > B > C",
        "A >> B > C",
        "A > B = > C",
        "A, B, C",
        "A > B > c",
        "a > b > c",
        "A > B > C.",
        "1 > 2 > 3",
        "ABC",
        "A B C",
        "",
        "   ",
        "A > B > C\nA: 1, B: 2, C: 3",  # last line is the score line
        "A > B > C\nDone.",
    ],
    "score": [
        "A: 4, B: 9",  # wrong count
        "A: 4, B: 9, C: 7, D: 9",
        "4, 9",
        "4, 9, 7, 1",
        "A: 4.5, B: 9, C: 7",  # not an integer
        "A: four, B: 9, C: 7",
        "A: 4, B: 9, C: 7.",
        "A: 4, B: 9, C:",  # empty value after the last colon
        "A: 4, B: 9, C: 7,",  # trailing comma
        "A: 4,, B: 9, C: 7",
        "4 9 7",
        "4; 9; 7",
        "A: 4 B: 9 C: 7",
        "",
        "   ",
        "A > B > C",
        "A: 4, B: 9, C: 7\nThat's all.",
    ],
}


@pytest.mark.parametrize(
    "prompt_type, text",
    [(prompt_type, text) for prompt_type, cases in MALFORMED.items() for text in cases],
)
def test_malformed_answers_return_none(prompt_type, text):
    assert parse_group_answer(text, 3, prompt_type) is None
    assert parse_group_answer("Some analysis first.\n\n" + text, 3, prompt_type) is None


VALID = [
    # ranking_score
    ("ranking_score", 3, "A: 5, B: 3, C: 2", [5, 3, 2]),
    ("ranking_score", 3, "B: 3, C: 2, A: 5", [5, 3, 2]),  # letters in any order
    ("ranking_score", 3, "C: 2, A: 5, B: 3", [5, 3, 2]),
    ("ranking_score", 3, "A:5,B:3,C:2", [5, 3, 2]),
    ("ranking_score", 3, "  A :  5 ,B:3 , C: 2  ", [5, 3, 2]),
    ("ranking_score", 3, "\n\n  A: 5, B: 3, C: 2  \n\n", [5, 3, 2]),  # surrounding whitespace
    ("ranking_score", 3, "Analysis.\r\n\r\nA > B > C\r\nA: 5, B: 3, C: 2\r\n", [5, 3, 2]),  # CRLF
    ("ranking_score", 3, "A = B > C\nA: 7, B: 7, C: 2", [7, 7, 2]),
    ("ranking_score", 3, "Analysis.\nA: 7, B: 7, C: 2", [7, 7, 2]),  # no ranking line
    ("ranking_score", 3, "C > A > B\nA: 5, B: 3, C: 2", [5, 3, 2]),  # ranking line is only informative
    ("ranking_score", 3, "A: 0, B: 10, C: 0", [0, 10, 0]),  # bounds are inclusive
    ("ranking_score", 2, "B > A\nB: 9, A: 7", [7, 9]),
    ("ranking_score", 4, "B > A = D > C\nB: 9, A: 7, D: 7, C: 2", [7, 9, 2, 7]),  # the spec's example
    ("ranking_score", 3, "A: 5\tB: 3\nA: 5, B: 3, C: 2", [5, 3, 2]),
    # ranking
    ("ranking", 3, "A > B > C", [2, 1, 0]),
    ("ranking", 3, "C > B > A", [0, 1, 2]),
    ("ranking", 3, "A>B>C", [2, 1, 0]),
    ("ranking", 3, "B > A = C", [0, 1, 0]),
    ("ranking", 3, "A = B > C", [1, 1, 0]),
    ("ranking", 3, "C = A = B", [0, 0, 0]),  # one tier: everyone is the lowest tier
    ("ranking", 3, "  \n B > C = A \r\n", [0, 1, 0]),
    ("ranking", 3, "I compared them.\r\nB > A > C\r\n", [1, 2, 0]),
    ("ranking", 3, "C > A = B", [0, 0, 1]),  # the spec's example
    ("ranking", 3, "C > A > B", [1, 0, 2]),  # tiers counted from the lowest
    ("ranking", 4, "B > A = D > C", [1, 2, 0, 1]),
    ("ranking", 2, "B > A", [0, 1]),
    # score
    ("score", 3, "A: 4, B: 9, C: 7", [4, 9, 7]),
    ("score", 3, "4, 9, 7", [4, 9, 7]),  # bare integers
    ("score", 3, "4,9,7", [4, 9, 7]),
    ("score", 3, "  4 ,  9 , 7  ", [4, 9, 7]),
    ("score", 3, "A: 4, 9, C: 7", [4, 9, 7]),  # mixed
    ("score", 3, "A: 4: 5, B: 9, C: 7", [5, 9, 7]),  # integer after the LAST colon
    ("score", 3, "Candidate A: 4, B: 9, C: 7", [4, 9, 7]),
    ("score", 3, "Scores:\r\nA: 4, B: 9, C: 7\r\n", [4, 9, 7]),
    ("score", 3, "\n  A: 0, B: 10, C: 7\n", [0, 10, 7]),
    ("score", 4, "A: 4, B: 9, C: 7, D: 9", [4, 9, 7, 9]),  # the spec's example
]


@pytest.mark.parametrize("prompt_type, n, text, expected", VALID)
def test_valid_answers(prompt_type, n, text, expected):
    assert parse_group_answer(text, n, prompt_type) == expected


def test_parse_default_prompt_type_is_ranking_score():
    assert parse_group_answer("B: 3, A: 5", 2) == [5, 3]
    assert parse_group_answer("B > A", 2) is None


@pytest.mark.parametrize("n", [2, 3, 8, 25, 26])
def test_ranking_score_requires_exactly_the_first_n_letters(n):
    full = ", ".join(f"{LETTERS[i]}: {i % 11}" for i in range(n))
    assert parse_group_answer(full, n, "ranking_score") == [i % 11 for i in range(n)]
    missing_last = ", ".join(f"{LETTERS[i]}: 1" for i in range(n - 1))
    assert parse_group_answer(missing_last, n, "ranking_score") is None
    if n < 26:
        extra = full + f", {LETTERS[n]}: 1"
        assert parse_group_answer(extra, n, "ranking_score") is None


# spec-ambiguous: the spec lists the 0..10 check only for `ranking_score` ("The project is
# stricter than the reference in two places ..." is said under `ranking_score`); for `score`
# it only requires integers and the count n. Literal reading: out-of-range integers are kept.
@pytest.mark.parametrize(
    "text, expected",
    [("A: 11, B: -1, C: 7", [11, -1, 7]), ("100, 0, 3", [100, 0, 3])],
)
def test_score_type_does_not_enforce_0_to_10(text, expected):
    assert parse_group_answer(text, 3, "score") == expected


# spec-ambiguous: for `score` the spec says "the integer after the last `:` of each item is its
# score; the count must be n" and says nothing about the letters. Literal reading: the letters
# are not checked and the scores are taken in the order of the items.
@pytest.mark.parametrize(
    "text, expected",
    [("B: 4, A: 9, C: 7", [4, 9, 7]), ("X: 1, Y: 2, Z: 3", [1, 2, 3]), ("A: 1, A: 2, A: 3", [1, 2, 3])],
)
def test_score_type_ignores_letters_and_keeps_item_order(text, expected):
    assert parse_group_answer(text, 3, "score") == expected


# spec-ambiguous: "a value is not an integer". Literal reading: a signed decimal numeral such
# as "+5" or a zero-padded "07" denotes an integer (as Python's int() reads it), so it is valid.
@pytest.mark.parametrize(
    "prompt_type, text, expected",
    [
        ("ranking_score", "A: +5, B: 07, C: 2", [5, 7, 2]),
        ("score", "+5, 07, 2", [5, 7, 2]),
    ],
)
def test_signed_and_zero_padded_integers(prompt_type, text, expected):
    assert parse_group_answer(text, 3, prompt_type) == expected


# --------------------------------------------------------------------------------------------
# Extracting a policy's translation (spec section 4).
# --------------------------------------------------------------------------------------------

EXTRACT_CASES = [
    # codeblock
    ("codeblock", "Let me think.\n```\nHallo Welt\n```", "Hallo Welt"),
    ("codeblock", "<think>hmm</think>\n\n```\n  Hallo Welt  \n```\n\n  ", "Hallo Welt"),
    ("codeblock", "  \n```\nHallo\nWelt\n```  \n", "Hallo\nWelt"),
    ("codeblock", "```Hallo```", "Hallo"),
    ("codeblock", "Thinking...\n```german\nHallo Welt\n```", "german\nHallo Welt"),  # tag kept
    ("codeblock", "```text\nBonjour\n```", "text\nBonjour"),
    ("codeblock", "```\n{0} {}\n```", "{0} {}"),
    ("codeblock", "```\nA\n```\n```\nB\n```", None),  # four fences
    ("codeblock", "Use ``` like this.\n```\nHallo\n```", None),  # three fences
    ("codeblock", "```\nHallo\n```\nThat is my translation.", None),  # does not end with a fence
    ("codeblock", "```\nHallo", None),  # one fence
    ("codeblock", "Hallo Welt", None),  # no fence
    ("codeblock", "```\n\n   \n```", None),  # empty between the fences
    ("codeblock", "``````", None),
    ("codeblock", "", None),
    ("codeblock", "   \n  ", None),
    # line
    ("line", "Thinking.\nHallo Welt", "Hallo Welt"),
    ("line", "Thinking.\n\nHallo Welt\n\n\n", "Hallo Welt"),
    ("line", "Hallo Welt", "Hallo Welt"),
    ("line", "```\nHallo\n```", "```"),
    ("line", "", None),
    ("line", "\n\n", None),
    # oneline
    ("oneline", "Hallo Welt", "Hallo Welt"),
    ("oneline", "Hallo {0} ```", "Hallo {0} ```"),
    ("oneline", "Hallo\nWelt", None),
    ("oneline", "Thinking.\n\nHallo Welt", None),
    # none
    ("none", "  Hallo\nWelt \n", "Hallo\nWelt"),
    ("none", "Hallo", "Hallo"),
    ("none", "\t```\nx\n```\n", "```\nx\n```"),
]


@pytest.mark.parametrize("extractor, response, expected", EXTRACT_CASES)
def test_extract_translation(extractor, response, expected):
    assert extract_translation(response, extractor) == expected


def test_extract_translation_default_is_codeblock():
    assert extract_translation("x\n```\nHallo\n```") == "Hallo"
    assert extract_translation("Hallo") is None


# The spec says `none` is "the stripped response", with no failure case (only `codeblock` says
# "Empty means invalid"); the reference also returns "" here.
@pytest.mark.parametrize("response", ["", "   ", "\n\t\n"])
def test_extract_none_of_blank_response_is_empty_string(response):
    assert extract_translation(response, "none") == ""


# spec-ambiguous: `oneline` is "the whole response if it has no newline, else invalid". The
# project follows the reference: strip first (a trailing newline is not a second line), and an
# empty result is invalid.
@pytest.mark.parametrize(
    "response, expected",
    [("Hallo Welt\n", "Hallo Welt"), ("\nHallo Welt", "Hallo Welt"), ("  Hallo Welt  ", "Hallo Welt"), ("", None),
     ("Hallo\nWelt", None)],
)
def test_extract_oneline_strips_first_like_the_reference(response, expected):
    assert extract_translation(response, "oneline") == expected


# spec-ambiguous: `line` is "the last non-empty line". The project follows the reference: the
# line is stripped and whitespace-only lines count as empty.
@pytest.mark.parametrize(
    "response, expected",
    [("Thinking.\n  Hallo Welt  ", "Hallo Welt"), ("Thinking.\nHallo Welt\n   \n", "Hallo Welt"), ("  \n \n", None)],
)
def test_extract_line_strips_like_the_reference(response, expected):
    assert extract_translation(response, "line") == expected


@FAST
@given(text=st.text(no_surrogates, max_size=60).filter(lambda t: "```" not in t and t.strip()))
def test_codeblock_extracts_stripped_inner_text(text):
    expected = text.strip()
    response = "Some reasoning.\n```\n" + text + "\n```\n"
    assert extract_translation(response, "codeblock") == expected
    assert extract_translation(response + "trailing words", "codeblock") is None
    assert extract_translation("```\n" + response, "codeblock") is None


@FAST
@given(text=st.text(no_surrogates, max_size=80))
def test_none_extractor_is_the_stripped_response(text):
    assert extract_translation(text, "none") == text.strip()


@FAST
@given(lines=st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12), max_size=6))
def test_line_extractor_last_non_blank_line_stripped(lines):
    response = "\n".join(lines)
    non_blank = [line.strip() for line in lines if line.strip()]
    assert extract_translation(response, "line") == (non_blank[-1] if non_blank else None)


@pytest.mark.parametrize("extractor", ["xml", "", "CODEBLOCK", "lines", None])
def test_unknown_extractor_is_input_error(extractor):
    with pytest.raises(GQMInputError) as info:
        extract_translation("```\nx\n```", extractor)
    assert "extractor" in str(info.value) and repr(extractor) in str(info.value)


@pytest.mark.parametrize("extractor", EXTRACTORS)
@pytest.mark.parametrize("response", [None, 5, b"```\nx\n```", ["x"]])
def test_non_string_response_is_input_error(extractor, response):
    with pytest.raises(GQMInputError) as info:
        extract_translation(response, extractor)
    assert "response" in str(info.value) and repr(response) in str(info.value)


# --------------------------------------------------------------------------------------------
# Ranking accuracy (spec section 6).
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, predicted, expected",
    [
        ([3, 2, 1], [3, 2, 1], 1.0),  # perfect
        ([3, 2, 1], [10, 5, 0], 1.0),  # only the order matters
        ([3, 2, 1], [1, 2, 3], 0.0),  # reversed
        ([3, 2, 1], None, 0.0),  # unparsed answer
        ([5, 5], [5, 5], 1.0),  # tie predicted as a tie
        ([5, 5], [7, 7], 1.0),
        ([5, 5], [6, 5], 0.0),  # order predicted where the reference has a tie
        ([6, 5], [5, 5], 0.0),  # tie predicted where the reference has an order
        ([6, 5], [5, 6], 0.0),
        # (0,1) r>, p= wrong; (0,2) ok; (0,3) ok; (1,2) r=, p> wrong; (1,3) ok; (2,3) ok -> 4/6
        ([9, 7, 7, 2], [8, 8, 6, 1], 4 / 6),
        # (0,1) r<, p< ok; (0,2) r>, p< wrong; (1,2) r>, p> ok -> 2/3
        ([1, 5, 0], [2, 3, 2.5], 2 / 3),
        ([0.5, 0.25], [1, 0], 1.0),
    ],
)
def test_ranking_accuracy(reference, predicted, expected):
    assert ranking_accuracy(reference, predicted) == pytest.approx(expected)


@FAST
@given(
    data=st.data(),
    reference=st.lists(st.integers(min_value=0, max_value=10), min_size=2, max_size=10),
)
def test_ranking_accuracy_properties(data, reference):
    n = len(reference)
    predicted = data.draw(st.lists(st.integers(min_value=0, max_value=10), min_size=n, max_size=n))
    assert ranking_accuracy(reference, reference) == 1.0
    assert ranking_accuracy(reference, None) == 0.0
    accuracy = ranking_accuracy(reference, predicted)
    assert 0.0 <= accuracy <= 1.0
    assert accuracy == pytest.approx(ranking_accuracy(predicted, reference))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]

    def sign(x):
        return (x > 0) - (x < 0)

    correct = sum(sign(reference[i] - reference[j]) == sign(predicted[i] - predicted[j]) for i, j in pairs)
    assert accuracy == pytest.approx(correct / len(pairs))
    if len(set(reference)) == n:
        assert ranking_accuracy(reference, [-x for x in reference]) == 0.0


def test_mean_ranking_accuracy_is_mean_over_groups():
    groups = [([3, 2, 1], [3, 2, 1]), ([3, 2, 1], None), ([9, 7, 7, 2], [8, 8, 6, 1])]
    assert mean_ranking_accuracy(groups) == pytest.approx((1.0 + 0.0 + 4 / 6) / 3)


# --------------------------------------------------------------------------------------------
# Input errors: a ValueError subclass whose message names the field and the value.
# --------------------------------------------------------------------------------------------


def test_gqm_input_error_is_a_value_error():
    assert issubclass(GQMInputError, ValueError)


def assert_input_error(call, field, value_text):
    with pytest.raises(GQMInputError) as info:
        call()
    message = str(info.value)
    assert field in message, message
    assert value_text in message, message
    return message


@pytest.mark.parametrize("count", [0, 1, 27, 40])
def test_group_size_out_of_range(count):
    candidates = [f"c{i}" for i in range(count)]
    assert_input_error(lambda: build_group_prompt("s", candidates, "en", "de"), "candidates", str(count))


@pytest.mark.parametrize("source", [None, 5, b"bytes", ["s"]])
def test_group_non_string_source(source):
    assert_input_error(lambda: build_group_prompt(source, ["a", "b"], "en", "de"), "source", repr(source))


@pytest.mark.parametrize("bad", [None, 7, b"b", ["b"]])
def test_group_non_string_candidate(bad):
    assert_input_error(lambda: build_group_prompt("s", ["a", bad, "c"], "en", "de"), "candidates", repr(bad))


@pytest.mark.parametrize("candidates", ["ab", None, 3])
def test_group_candidates_not_a_list(candidates):
    with pytest.raises(GQMInputError) as info:
        build_group_prompt("s", candidates, "en", "de")
    assert "candidates" in str(info.value)


@pytest.mark.parametrize("field", ["src_lang", "trg_lang"])
@pytest.mark.parametrize("value", [None, 12, b"en"])
def test_non_string_language(field, value):
    langs = {"src_lang": "en", "trg_lang": "de", field: value}
    assert_input_error(
        lambda: build_group_prompt("s", ["a", "b"], langs["src_lang"], langs["trg_lang"]), field, repr(value)
    )
    assert_input_error(lambda: build_single_prompt("s", "a", langs["src_lang"], langs["trg_lang"]), field, repr(value))


@pytest.mark.parametrize("prompt_type", ["rank", "RANKING", "", "ranking-score", None])
def test_unknown_prompt_type(prompt_type):
    value = repr(prompt_type)
    assert_input_error(lambda: build_group_prompt("s", ["a", "b"], "en", "de", prompt_type), "prompt_type", value)
    assert_input_error(lambda: parse_group_answer("A: 1, B: 2", 2, prompt_type), "prompt_type", value)
    assert_input_error(lambda: render_answer([1, 2], prompt_type), "prompt_type", value)
    assert_input_error(lambda: verdict_regex(2, prompt_type), "prompt_type", value)


@pytest.mark.parametrize("field, args", [("source", (None, "a")), ("candidate", ("s", 3)), ("candidate", ("s", b"a"))])
def test_single_non_string(field, args):
    bad = args[0] if field == "source" else args[1]
    assert_input_error(lambda: build_single_prompt(args[0], args[1], "en", "de"), field, repr(bad))


@pytest.mark.parametrize("text", [None, 5, b"A: 1, B: 2"])
def test_parse_non_string_text(text):
    assert_input_error(lambda: parse_group_answer(text, 2), "text", repr(text))


@pytest.mark.parametrize("n", [0, 1, 27, -3])
@pytest.mark.parametrize("prompt_type", PROMPT_TYPES)
def test_parse_bad_group_size(n, prompt_type):
    assert_input_error(lambda: parse_group_answer("A: 1, B: 2", n, prompt_type), "n", str(n))
    assert_input_error(lambda: verdict_regex(n, prompt_type), "n", str(n))


@pytest.mark.parametrize("count", [1, 27])
def test_render_answer_bad_group_size(count):
    with pytest.raises(GQMInputError):
        render_answer([1] * count, "ranking_score")
