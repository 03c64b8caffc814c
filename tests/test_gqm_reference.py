"""Differential test: ``parse_group_answer`` against the reference behaviour of spec section 3.

The reference below is written from the text of ``docs/gqm.md`` section 3 ("Reading the
model's answer"), not from ``cluster/gqm.py``: it shares no code with the project and is kept
deliberately plain. A seeded generator writes well-formed GRRM answers for n = 2..26 and
mutates them (character edits and structural damage); on every answer the project must give the
reference's result, except where the spec documents that the project is stricter
(``ranking_score``: a label beyond the n candidates, a repeated letter, a score outside 0..10),
where it must give None.

Where the spec does not settle a question, a ``# spec-ambiguous:`` comment says how it is read.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.gqm import parse_group_answer

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
PROMPT_TYPES = ("ranking_score", "ranking", "score")

# --------------------------------------------------------------------------------------------
# The reference, from the spec text.
# --------------------------------------------------------------------------------------------

# spec-ambiguous: "integer" is not defined further. Read as a written decimal integer: an
# optional sign and ASCII digits, surrounding whitespace ignored ("+5" and "07" count). GRRM's
# own code calls Python's int(), which would also take "1_0" or non-ASCII digits ("٣"); the
# spec does not mention those, and neither this reference nor the project accepts them.
SPEC_INTEGER = re.compile(r"[+-]?[0-9]+")


def spec_last_line(text: str) -> str:
    """"Strip the output. The last line is the text after the last newline (the whole output if
    there is none), stripped.\""""
    text = text.strip()
    newline = text.rfind("\n")
    return text if newline < 0 else text[newline + 1 :].strip()


def spec_integer(text: str) -> int | None:
    text = text.strip()
    return int(text) if SPEC_INTEGER.fullmatch(text) else None


def reference_ranking_score(line: str, n: int) -> list[int] | None:
    """`letter: integer` items, comma separated; invalid when an item has no single `:`, a value
    is not an integer, or a candidate letter is missing. Other labels are not looked at."""
    by_label: dict[str, int] = {}
    for item in line.split(","):
        if item.count(":") != 1:
            return None
        label, value = item.split(":")
        score = spec_integer(value)
        if score is None:
            return None
        # spec-ambiguous: which score a repeated letter keeps. The last one here (GRRM's dict);
        # it never matters below, because the project refuses repeated letters.
        by_label[label.strip()] = score
    if any(letter not in by_label for letter in LETTERS[:n]):
        return None
    return [by_label[letter] for letter in LETTERS[:n]]


def project_stricter_ranking_score(line: str, n: int) -> set[str]:
    """Where the spec says the project refuses a `ranking_score` line the reference reads.

    spec-ambiguous: the spec says "a letter beyond the n candidates"; any label that is not one
    of the n candidates' letters (a later letter, a lower-case letter, a word, an empty label)
    is read as that, since none of them names a candidate.
    """
    reasons: set[str] = set()
    seen: set[str] = set()
    for item in line.split(","):
        label, _, value = item.partition(":")
        label = label.strip()
        if label not in tuple(LETTERS[:n]):
            reasons.add("label beyond the n candidates")
        if label in seen:
            reasons.add("repeated letter")
        seen.add(label)
        score = spec_integer(value)
        if score is not None and not 0 <= score <= 10:
            reasons.add("score outside 0..10")
    return reasons


def reference_ranking(line: str, n: int) -> list[int] | None:
    """Tiers by `>`, members by `=`; valid only with no `<`, exactly n members and each of the
    first n letters appearing exactly once; score = tiers - 1 - tier index (lowest tier 0)."""
    if "<" in line:
        return None
    tiers = [[member.strip() for member in tier.split("=")] for tier in line.split(">")]
    if sum(len(tier) for tier in tiers) != n:
        return None
    if any(line.count(letter) != 1 for letter in LETTERS[:n]):
        return None
    tier_of = {member: index for index, tier in enumerate(tiers) for member in tier}
    # A letter that appears only inside another member ("Cx") has no tier, hence no score.
    if any(letter not in tier_of for letter in LETTERS[:n]):
        return None
    return [len(tiers) - 1 - tier_of[letter] for letter in LETTERS[:n]]


def reference_score(line: str, n: int) -> list[int] | None:
    """`A: 4, B: 9, ...` or `4, 9, ...`: the integer after the last `:` of each item; n items."""
    scores = []
    for item in line.split(","):
        score = spec_integer(item.split(":")[-1])
        if score is None:
            return None
        scores.append(score)
    return scores if len(scores) == n else None


REFERENCE = {"ranking_score": reference_ranking_score, "ranking": reference_ranking, "score": reference_score}


def expected_project_result(text: str, n: int, prompt_type: str) -> tuple[list[int] | None, set[str]]:
    """The reference's scores, or None where the spec says the project is stricter; and why."""
    line = spec_last_line(text)
    scores = REFERENCE[prompt_type](line, n)
    if scores is None or prompt_type != "ranking_score":
        return scores, set()
    reasons = project_stricter_ranking_score(line, n)
    return (None if reasons else scores), reasons


# --------------------------------------------------------------------------------------------
# The generator: well-formed answers and their mutations. It draws from a random.Random-like
# object, so hypothesis (st.randoms, shrinkable) and a plain seeded Random share it.
# --------------------------------------------------------------------------------------------

# Characters a mutation inserts: the verdict syntax, neighbours of it, and look-alikes.
MUTATION_ALPHABET = "ABCDYZabz:,>=<0123456789+-._ \t\r\n\u00a0\u0663"
ANALYSIS_WORDS = ["Candidate", "A", "is", "better:", "B > A", "score", "7,", "=", "fluent.", "```", "C: 3"]
NOT_INTEGERS = ["7.5", "seven", "", "5 points", "1_0", "\u0663", "- 5", "10/10"]


def _spaced(rng: random.Random, mark: str) -> str:
    return rng.choice([mark, f" {mark} ", f"{mark} ", f" {mark}", f"  {mark}  "])


def _random_scores(rng: random.Random, n: int) -> list[int]:
    spread = rng.choice([1, 2, 3, 11])  # few levels make ties (shared tiers) common
    base = rng.randint(0, 11 - spread)
    return [base + rng.randrange(spread) for _ in range(n)]


def _score_text(rng: random.Random, score: int) -> str:
    return rng.choice([str(score)] * 6 + [f"+{score}", f"0{score}"])


def well_formed_verdict(rng: random.Random, n: int, prompt_type: str) -> str:
    """A verdict as GRRM writes it (random order, spacing and ties), last line last."""
    scores = _random_scores(rng, n)
    levels = sorted(set(scores), reverse=True)
    tiers = []
    for level in levels:
        members = [LETTERS[i] for i in range(n) if scores[i] == level]
        rng.shuffle(members)
        tiers.append(_spaced(rng, "=").join(members))
    ranking = _spaced(rng, ">").join(tiers)
    if prompt_type == "ranking":
        return ranking
    order = list(range(n))
    if prompt_type == "ranking_score":
        rng.shuffle(order)
        items = [f"{LETTERS[i]}{rng.choice([': ', ':', ' : '])}{_score_text(rng, scores[i])}" for i in order]
        line = rng.choice([", ", ",", " , "]).join(items)
        return f"{ranking}\n{line}" if rng.random() < 0.7 else line
    items = [
        rng.choice([f"{LETTERS[i]}: {_score_text(rng, scores[i])}", _score_text(rng, scores[i])]) for i in order
    ]
    return rng.choice([", ", ","]).join(items)


def _structural_mutation(rng: random.Random, line: str, n: int, prompt_type: str) -> str:
    # Mostly damage the line's own structure; sometimes the other types' separators.
    item_mark = rng.choice([">", ">", "=", ","] if prompt_type == "ranking" else [",", ",", ",", ">", "="])
    parts = line.split(item_mark)
    kind = rng.randrange(11)
    if kind == 0 and len(parts) > 1:  # drop an item / a member / a tier
        del parts[rng.randrange(len(parts))]
    elif kind == 1:  # repeat one
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(parts))
    elif kind == 2:  # a label beyond the n candidates, or one that names no candidate
        label = rng.choice([LETTERS[n] if n < 26 else "a", "a", "foo", "", "AB", "Translation A"])
        extra = f"{label}: {rng.randint(0, 10)}" if item_mark == "," else label
        parts.insert(rng.randrange(len(parts) + 1), f" {extra}")
    elif kind == 3:  # a score outside 0..10
        return re.sub(r"\d+", lambda _: str(rng.choice([-1, 11, 12, 99, 100])), line, count=1)
    elif kind == 4:  # a value that is not an integer
        return re.sub(r"[+-]?\d+", lambda _: rng.choice(NOT_INTEGERS), line, count=1)
    elif kind == 5:  # `<` somewhere
        position = rng.randint(0, len(line))
        return line[:position] + "<" + line[position:]
    elif kind == 6:  # a lower-case letter
        letters = [i for i, c in enumerate(line) if c.isupper()]
        if letters:
            i = rng.choice(letters)
            return line[:i] + line[i].lower() + line[i + 1 :]
    elif kind == 7:  # one colon more, or one less
        if ":" in line and rng.random() < 0.5:
            i = rng.choice([i for i, c in enumerate(line) if c == ":"])
            return line[:i] + line[i + 1 :]
        return line.replace(":", "::", 1) if ":" in line else line + ":"
    elif kind == 8:  # a stray separator at an end
        return rng.choice([line + rng.choice([",", ">", "=", "."]), rng.choice([",", ">", "="]) + line])
    elif kind == 9:  # one letter replaced by another (often one repeated and one missing)
        letters = [i for i, c in enumerate(line) if c in LETTERS]
        if letters:
            i = rng.choice(letters)
            return line[:i] + rng.choice(LETTERS[: min(26, n + 1)]) + line[i + 1 :]
    else:  # another line after the verdict
        return line + rng.choice(["\nDone.", "\n", "\r\nThat is all.", "\n" + line])
    return item_mark.join(parts)


def _character_mutation(rng: random.Random, line: str) -> str:
    position = rng.randint(0, len(line))
    kind = rng.randrange(3)
    if kind == 0 and line:
        position = min(position, len(line) - 1)
        return line[:position] + line[position + 1 :]
    char = rng.choice(MUTATION_ALPHABET)
    if kind == 1 and line:
        position = min(position, len(line) - 1)
        return line[:position] + char + line[position + 1 :]
    return line[:position] + char + line[position:]


def generate_answer(rng: random.Random) -> tuple[str, int, str]:
    """One answer: ``(text, n, prompt_type)``; about half are mutated."""
    n = rng.choice([2, 3, 4, 8, rng.randint(2, 26), 26])
    prompt_type = rng.choice(PROMPT_TYPES)
    head, newline, line = well_formed_verdict(rng, n, prompt_type).rpartition("\n")
    if rng.random() < 0.5:
        for _ in range(rng.choice([1, 1, 2, 3])):
            if rng.random() < 0.6:
                line = _structural_mutation(rng, line, n, prompt_type)
            else:
                line = _character_mutation(rng, line)
    verdict = head + newline + line
    analysis = " ".join(rng.choice(ANALYSIS_WORDS) for _ in range(rng.randint(0, 8)))
    newline = rng.choice(["\n", "\n\n", "\r\n"])
    text = f"{analysis}{newline}{verdict}" if analysis else verdict
    return rng.choice(["", " ", "\n", "\r\n  "]) + text + rng.choice(["", " ", "\n", "\n\n", "\t\r\n"]), n, prompt_type


# --------------------------------------------------------------------------------------------
# The reference reads the spec's own examples as the spec says.
# --------------------------------------------------------------------------------------------


def test_reference_reads_the_spec_examples():
    assert reference_ranking_score("B: 9, A: 7, D: 7, C: 2", 4) == [7, 9, 2, 7]
    assert reference_ranking("B > A = D > C", 4) == [1, 2, 0, 1]
    assert reference_ranking("C > A = B", 3) == [0, 0, 1]  # the spec's "C: 1, A: 0, B: 0"
    assert reference_score("A: 4, B: 9, C: 7, D: 9", 4) == [4, 9, 7, 9]
    assert reference_score("4, 9, 7, 9", 4) == [4, 9, 7, 9]
    assert spec_last_line("x\n\n  B > A  \n\n") == "B > A"
    # The reference reads what the project refuses by design; the spec lists why.
    assert reference_ranking_score("A: 5, B: 3, D: 2", 2) == [5, 3]
    assert reference_ranking_score("A: 5, B: 3, A: 7", 2) == [7, 3]
    assert reference_ranking_score("A: 11, B: 3", 2) == [11, 3]
    assert project_stricter_ranking_score("A: 11, B: 3, A: 7, D: 2", 2) == {
        "label beyond the n candidates",
        "repeated letter",
        "score outside 0..10",
    }


# --------------------------------------------------------------------------------------------
# Differential: the project against the reference.
# --------------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None, derandomize=True)
@given(rng=st.randoms(use_true_random=False))
def test_parse_agrees_with_the_reference_on_generated_answers(rng):
    text, n, prompt_type = generate_answer(rng)
    expected, _ = expected_project_result(text, n, prompt_type)
    assert parse_group_answer(text, n, prompt_type) == expected


def test_bulk_differential_covers_every_outcome():
    """10,000 seeded answers: every one agrees, and the generator reaches every outcome class.

    The class counts make sure the differential is not vacuous (all valid, or all invalid).
    """
    rng = random.Random(14)
    outcomes: Counter[tuple[str, str]] = Counter()
    for _ in range(10_000):
        text, n, prompt_type = generate_answer(rng)
        expected, reasons = expected_project_result(text, n, prompt_type)
        parsed = parse_group_answer(text, n, prompt_type)
        assert parsed == expected, (text, n, prompt_type, reasons)
        if reasons:
            outcomes.update((prompt_type, f"stricter: {reason}") for reason in reasons)
        else:
            outcomes[(prompt_type, "valid" if parsed is not None else "invalid in both")] += 1
    for prompt_type in PROMPT_TYPES:
        assert outcomes[(prompt_type, "valid")] >= 500, outcomes
        assert outcomes[(prompt_type, "invalid in both")] >= 300, outcomes
    for reason in ("label beyond the n candidates", "repeated letter", "score outside 0..10"):
        assert outcomes[("ranking_score", f"stricter: {reason}")] >= 20, outcomes


# --------------------------------------------------------------------------------------------
# A regression once: the lowest tier scores 0, the best tier (number of tiers) - 1.
# --------------------------------------------------------------------------------------------


def test_ranking_examples_from_the_spec_and_the_reference():
    assert parse_group_answer("C > A = B", 3, "ranking") == [0, 0, 1]
    assert parse_group_answer("C > A > B", 3, "ranking") == [1, 0, 2]
    assert parse_group_answer("A = B = C", 3, "ranking") == [0, 0, 0]  # one tier: the lowest


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rng=st.randoms(use_true_random=False), n=st.integers(min_value=2, max_value=26))
def test_lowest_tier_scores_zero_and_best_tier_scores_tiers_minus_one(rng, n):
    line = well_formed_verdict(rng, n, "ranking")
    tiers = [[member.strip() for member in tier.split("=")] for tier in line.split(">")]
    scores = parse_group_answer(line, n, "ranking")
    assert scores is not None
    for member in tiers[-1]:
        assert scores[LETTERS.index(member)] == 0
    for member in tiers[0]:
        assert scores[LETTERS.index(member)] == len(tiers) - 1
    assert sorted(set(scores)) == list(range(len(tiers)))  # every tier in between, one step apart
