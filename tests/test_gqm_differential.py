"""Differential test: ``cluster.gqm``'s prompts against an independent re-implementation of GRRM's
reference prompt builder (``tests/gqm_spec.py``, written from the spec: sections 1, 1b and 2).

A seeded generator writes 12,000 groups (2 to 8 candidates, and one in six up to 26; every prompt
type, with and without the output example; Unicode texts, texts padded with all kinds of
whitespace, empty and whitespace-only references and notes; language codes and full names) and for
each one checks that

- ``build_group_prompt`` gives the reference's bytes, with and without the reference and notes;
- where the reference drops a half reference pair silently, the project refuses it naming the
  field, and gives the reference's bytes when called without the pair;
- where the reference keeps an unknown two-letter ``ref_lang`` as given, the project refuses it
  naming ``ref_lang`` (spec 1b);
- ``build_single_prompt`` with the group's notes gives the reference's SQM bytes;
- ``parse_group_prompt`` / ``parse_single_prompt`` read every prompt back as what built it.

The counts of each kind are asserted (and printed with ``-s``), so the lead can quote them.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from cluster.gqm import (
    GQMInputError,
    GroupPrompt,
    SinglePrompt,
    build_group_prompt,
    build_single_prompt,
    parse_group_prompt,
    parse_single_prompt,
)
from tests.gqm_spec import SPEC_LANGUAGES, spec_group_prompt, spec_language, spec_single_prompt

GROUPS = 12_000
SEED = 56
PROMPT_TYPES = ("ranking_score", "ranking", "score")
NAMES = ["English", "Norwegian Bokmål", "Chinese (Traditional)", "Swiss-German", "हिन्दी", "N'Ko", "Klingon"]
# Whitespace str.strip() removes: ASCII, no-break and ideographic spaces, line and paragraph separators.
PADDING = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\x85", "\u2003"]
# Pieces of texts: words in several scripts, marks and joiners, format-string look-alikes, lone
# backticks, inner newlines, and the words of the prompt itself.
PIECES = [
    "The cat sat on the mat.", "Le chat", "猫坐在垫子上", "고양이", "Кошка", "القطة", "बिल्ली", "ประโยค", "😀🐈‍⬛",
    "e\u0301", "\u200d", "\ufeff", "{}", "{0}", "{source}", "%s", "\\n", "`", "``", "`x`", "Translation A:",
    "A: 9, B: 3", "B > A", "reference", "Notes:", "\n", " ", "\t", "-", ".",
]


def text(rng: random.Random, max_pieces: int = 6) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces)))


def padded(rng: random.Random, body: str) -> str:
    """``body`` with whitespace before and/or after it, half the time."""
    if rng.random() < 0.5:
        return body
    return "".join(rng.choice(PADDING) for _ in range(rng.randint(0, 3))) + body + rng.choice(PADDING)


def blank(rng: random.Random) -> str:
    return "".join(rng.choice(PADDING) for _ in range(rng.randint(0, 3)))


def language(rng: random.Random) -> str:
    return rng.choice(sorted(SPEC_LANGUAGES)) if rng.random() < 0.7 else rng.choice(NAMES)


@dataclass
class Case:
    """One generated group and the kinds it counts as."""

    source: str
    candidates: list[str]
    src_lang: str
    trg_lang: str
    prompt_type: str
    add_example: bool
    ref_text: str | None
    ref_lang: str | None
    notes: str | None
    reference_kind: str  # none, pair, blank, half_text, half_lang, unknown_code


def reference_of(rng: random.Random) -> tuple[str | None, str | None, str]:
    draw = rng.random()
    if draw < 0.30:
        return None, None, "none"
    if draw < 0.75:
        body = text(rng).strip() or "Hello there"
        return padded(rng, body), padded(rng, language(rng)), "pair"
    if draw < 0.82:
        return rng.choice([None, blank(rng)]), rng.choice([None, blank(rng)]), "blank"
    if draw < 0.89:
        return padded(rng, text(rng).strip() or "ref"), rng.choice([None, blank(rng)]), "half_text"
    if draw < 0.96:
        return rng.choice([None, blank(rng)]), padded(rng, language(rng)), "half_lang"
    return "ref", rng.choice(["xx", "EN", "q", "zz"]), "unknown_code"


def notes_of(rng: random.Random) -> str | None:
    draw = rng.random()
    if draw < 0.35:
        return None
    if draw < 0.5:
        return blank(rng)
    return padded(rng, text(rng, 10).strip() or "Keep it formal.")


def generate(seed: int, count: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        size = rng.randint(2, 8) if rng.random() < 5 / 6 else rng.randint(9, 26)
        ref_text, ref_lang, kind = reference_of(rng)
        cases.append(Case(
            source=padded(rng, text(rng)),
            candidates=[padded(rng, text(rng)) for _ in range(size)],
            src_lang=language(rng),
            trg_lang=language(rng),
            prompt_type=rng.choice(PROMPT_TYPES),
            add_example=rng.random() < 0.5,
            ref_text=ref_text,
            ref_lang=ref_lang,
            notes=notes_of(rng),
            reference_kind=kind,
        ))
    return cases


def given(value: str | None) -> str | None:
    return value.strip() if value is not None and value.strip() else None


def check(case: Case, counts: Counter) -> None:
    """Every claim of the module docstring for one generated group; ``counts`` tallies its kinds."""
    args = (case.source, case.candidates, case.src_lang, case.trg_lang, case.prompt_type, case.add_example)
    expected = spec_group_prompt(*args, ref_text=case.ref_text, ref_lang=case.ref_lang, notes=case.notes)
    context = {"ref_text": case.ref_text, "ref_lang": case.ref_lang, "notes": case.notes}
    half = {"half_text": "ref_text", "half_lang": "ref_lang", "unknown_code": "ref_lang"}.get(case.reference_kind)
    if half is not None:
        try:
            build_group_prompt(*args, **context)
        except GQMInputError as refused:
            assert refused.field == half, (case, refused)
        else:
            raise AssertionError(f"{case.reference_kind} not refused: {case}")
        counts["refused " + case.reference_kind] += 1
        # The project's prompt for the row as the reference reads it: no reference block.
        context = {"notes": case.notes} if case.reference_kind != "unknown_code" else context
        if case.reference_kind == "unknown_code":
            counts["unknown_code kept by the reference"] += expected.count(f"\n\n{case.ref_lang} reference:\n") == 1
            return
    prompt = build_group_prompt(*args, **context)
    assert prompt == expected, case
    has_reference = given(case.ref_text) is not None and given(case.ref_lang) is not None
    has_notes = given(case.notes) is not None
    counts["groups"] += 1
    counts["with reference"] += has_reference
    counts["with notes"] += has_notes
    counts["with both"] += has_reference and has_notes
    counts["with neither"] += not has_reference and not has_notes
    counts["blank reference or notes"] += case.reference_kind == "blank" or (case.notes is not None and not has_notes)
    counts["padded reference or notes"] += any(
        value is not None and value.strip() and value != value.strip()
        for value in (case.ref_text, case.ref_lang, case.notes)
    )
    counts[f"size {'2-8' if len(case.candidates) <= 8 else '9-26'}"] += 1
    counts[f"{case.prompt_type}{' +example' if case.add_example else ''}"] += 1
    counts["language names"] += any(len(value) > 2 for value in (case.src_lang, case.trg_lang))

    ref_lang = given(case.ref_lang)
    assert parse_group_prompt(prompt) == GroupPrompt(
        case.source, tuple(case.candidates), spec_language(case.src_lang), spec_language(case.trg_lang),
        case.prompt_type, case.add_example,  # type: ignore[arg-type]
        given(case.ref_text) if has_reference else None,
        spec_language(ref_lang) if has_reference and ref_lang is not None else None,
        given(case.notes),
    )
    counts["group round trips"] += 1

    single = build_single_prompt(case.source, case.candidates[0], case.src_lang, case.trg_lang, notes=case.notes)
    assert single == spec_single_prompt(case.source, case.candidates[0], case.src_lang, case.trg_lang, case.notes)
    assert parse_single_prompt(single) == SinglePrompt(
        case.source, case.candidates[0], spec_language(case.src_lang), spec_language(case.trg_lang), given(case.notes)
    )
    counts["single prompts"] += 1
    counts["single prompts with notes"] += has_notes


def test_prompts_are_byte_identical_to_the_reference_builder_on_12000_groups():
    counts: Counter = Counter()
    for case in generate(SEED, GROUPS):
        check(case, counts)
    print("\ndifferential GQM prompt test:", dict(sorted(counts.items())))
    # Refused rows are compared without their pair (half pairs) or not at all (unknown codes).
    assert counts["groups"] + counts["refused unknown_code"] == GROUPS
    assert counts["groups"] >= 11_000 and counts["group round trips"] == counts["groups"]
    assert counts["with reference"] >= 4_000 and counts["with notes"] >= 5_000 and counts["with both"] >= 2_500
    assert counts["with neither"] >= 2_000
    assert counts["refused half_text"] >= 500 and counts["refused half_lang"] >= 500
    assert counts["refused unknown_code"] >= 200
    assert counts["unknown_code kept by the reference"] == counts["refused unknown_code"]
    assert counts["blank reference or notes"] >= 1_000 and counts["padded reference or notes"] >= 3_000
    assert counts["size 9-26"] >= 1_500 and counts["language names"] >= 3_000
    assert all(counts[f"{kind}{example}"] >= 1_500 for kind in PROMPT_TYPES for example in ("", " +example"))
    assert counts["single prompts"] == counts["groups"] and counts["single prompts with notes"] == counts["with notes"]


def test_the_generator_is_seeded():
    assert generate(SEED, 50) == generate(SEED, 50)
    assert generate(SEED, 50) != generate(SEED + 1, 50)
