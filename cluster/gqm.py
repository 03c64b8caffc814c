"""The GQM wire format: what a GRRM reward model reads and writes.

This module implements ``docs/gqm.md`` byte for byte. It is pure Python (no I/O, no
Ray, no torch) so every other layer can rely on it and tests run in milliseconds.

Public functions: :func:`build_group_prompt`, :func:`build_single_prompt` and their inverses
:func:`parse_group_prompt`, :func:`parse_single_prompt`, :func:`parse_prompt` (for scripted
engines that read prompts back), :func:`parse_group_answer`, :func:`extract_translation`, :func:`ranking_accuracy`, plus the
helpers :func:`render_answer` (an answer in GRRM's format, for scripted engines and tests),
:func:`verdict_regex` (a constraint that only admits parseable verdict lines) and
:func:`language_name`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EXTRACTORS",
    "GQMInputError",
    "GroupPrompt",
    "LANGUAGE_NAMES",
    "MAX_CANDIDATES",
    "MIN_CANDIDATES",
    "PROMPT_TYPES",
    "PromptType",
    "SinglePrompt",
    "build_group_prompt",
    "build_single_prompt",
    "candidate_letter",
    "embedded_prompt",
    "extract_translation",
    "language_name",
    "last_line",
    "mean_ranking_accuracy",
    "parse_group_answer",
    "parse_group_prompt",
    "parse_prompt",
    "parse_single_prompt",
    "ranking_accuracy",
    "render_answer",
    "verdict_regex",
]

PromptType = Literal["ranking_score", "ranking", "score"]
Extractor = Literal["codeblock", "line", "oneline", "none"]
# The extractor where none is chosen: the adapters' and the OpenRLHF route's default.
DEFAULT_EXTRACTOR: Extractor = "codeblock"

MIN_CANDIDATES = 2
MAX_CANDIDATES = 26  # one capital letter per candidate
LETTERS = string.ascii_uppercase

LANGUAGE_NAMES: dict[str, str] = {
    "en": "English",
    "zh": "Chinese",
    "de": "German",
    "ru": "Russian",
    "ko": "Korean",
    "ja": "Japanese",
    "fr": "French",
    "es": "Spanish",
    "pt": "Portuguese",
    "it": "Italian",
    "nl": "Dutch",
    "th": "Thai",
    "ro": "Romanian",
    "ar": "Arabic",
    "el": "Greek",
    "vi": "Vietnamese",
    "uk": "Ukrainian",
}

_GROUP_TEMPLATE = (
    "Given a source text in {} and multiple translation candidates in {}. Perform a step by step "
    "analysis and comparison of the translation quality for the candidates. {}\n\n"
    "Source text:\n```\n{}\n```\n\n{}{}"
)
_CANDIDATE_BLOCK = "Translation {}:\n```\n{}\n```\n"
_SINGLE_TEMPLATE = (
    "Given a source text in {} and a translation text in {}. Perform a step by step analysis of "
    "translation quality and assign a score on a scale from 0 to 10.\n"
    "Source text:\n```\n{}\n```\n\nTranslation text:\n```\n{}\n```\n"
)
# The sixth slot of the group template (spec section 1b): the reference block, then the notes
# block, each empty when not given. The single prompt takes a notes block too (singular wording).
_REFERENCE_BLOCK = (
    "\n\nYou may refer to the following reference, if helpful, when evaluating the translations.\n\n"
    "{} reference:\n```\n{}\n```\n"
)
_GROUP_NOTES_BLOCK = (
    "\n\nYou may refer to the following notes, if helpful, when evaluating the translations.\n\n"
    "Notes:\n```\n{}\n```\n"
)
_SINGLE_NOTES_BLOCK = (
    "\n\nYou may refer to the following notes, if helpful, when evaluating the translation.\n\n"
    "Notes:\n```\n{}\n```\n"
)

_TASKS: dict[str, str] = {
    "ranking_score": "Finally, rank and score the candidates with integer scores on a scale from 0 to 10.",
    "ranking": "Finally, rank the candidates in order of quality from best to worst.",
    "score": "Finally, score the candidates with integer scores on a scale from 0 to 10.",
}
_EXAMPLES: dict[str, str] = {
    "ranking_score": (
        "At the end section, first output the rankings in descending order, for example: "
        "`B > A = D > C`. Then, on the last line, output the scores, for example: "
        "`B: 9, A: 7, D: 7, C: 2`."
    ),
    "ranking": "Output the rankings in descending order on the last line, for example: `B > A = D > C`.",
    "score": "Output the scores on the last line, for example: `A: 4, B: 9, C: 7, D: 9`.",
}
PROMPT_TYPES: tuple[str, ...] = tuple(_TASKS)

# The fixed text around each template's variable parts, for reading a prompt back apart.
_GROUP_PIECES = _GROUP_TEMPLATE.split("{}")  # around: languages, task, source, candidate blocks, context blocks
_CANDIDATE_PIECES = _CANDIDATE_BLOCK.split("{}")  # around: letter, candidate
_SINGLE_PIECES = _SINGLE_TEMPLATE.split("{}")  # around: source language, target language, source, candidate
_REFERENCE_PIECES = _REFERENCE_BLOCK.split("{}")  # around: the reference's language, the reference
_GROUP_NOTES_OPENING = _GROUP_NOTES_BLOCK.split("{}")[0]
_SINGLE_NOTES_OPENING = _SINGLE_NOTES_BLOCK.split("{}")[0]


@dataclass(frozen=True)
class GroupPrompt:
    """What a GQM group prompt says: the arguments of :func:`build_group_prompt` that built it.

    Languages are the names the prompt shows (a code given to the builder reads back as its name).
    """

    source: str
    candidates: tuple[str, ...]
    src_lang: str
    trg_lang: str
    prompt_type: PromptType
    add_example: bool
    # The reference block's text and language name, and the notes (spec section 1b), stripped as
    # the prompt holds them; None when the prompt has no such block.
    ref_text: str | None = None
    ref_lang: str | None = None
    notes: str | None = None


@dataclass(frozen=True)
class SinglePrompt:
    """What an SQM single prompt says: the arguments of :func:`build_single_prompt` that built it."""

    source: str
    candidate: str
    src_lang: str
    trg_lang: str
    notes: str | None = None  # stripped; None without a notes block


EXTRACTORS: tuple[str, ...] = ("codeblock", "line", "oneline", "none")

SCORE_MIN, SCORE_MAX = 0, 10
_INTEGER = re.compile(r"[+-]?[0-9]+")


class GQMInputError(ValueError):
    """Bad input to the GQM protocol. The message names the field and the offending value."""

    def __init__(self, field: str, value: object, problem: str):
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}: {problem} (got {_preview(value)})")


def _preview(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _require_str(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise GQMInputError(field, value, f"must be a string, not {type(value).__name__}")
    return value


def _require_prompt_type(prompt_type: object) -> str:
    if prompt_type not in _TASKS:
        raise GQMInputError("prompt_type", prompt_type, f"must be one of {', '.join(PROMPT_TYPES)}")
    return prompt_type  # type: ignore[return-value]


def _require_group_size(field: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise GQMInputError(field, n, "must be an integer")
    if not MIN_CANDIDATES <= n <= MAX_CANDIDATES:
        raise GQMInputError(
            field, n, f"a group needs {MIN_CANDIDATES} to {MAX_CANDIDATES} candidates (letters A-Z)"
        )
    return n


def language_name(code_or_name: object, field: str = "language") -> str:
    """Map a two-letter code to the language name the prompt uses; longer values are names already."""
    value = _require_str(field, code_or_name)
    if len(value) > 2:
        return value
    try:
        return LANGUAGE_NAMES[value]
    except KeyError:
        raise GQMInputError(
            field, value, f"unknown language code; known codes: {', '.join(LANGUAGE_NAMES)}, or a full language name"
        ) from None


def candidate_letter(index: int) -> str:
    """The label of candidate ``index`` (0-based): A, B, C, ..."""
    return LETTERS[index]


def build_group_prompt(
    source: str,
    candidates: Sequence[str],
    src_lang: str,
    trg_lang: str,
    prompt_type: PromptType = "ranking_score",
    add_example: bool = False,
    *,
    ref_text: str | None = None,
    ref_lang: str | None = None,
    notes: str | None = None,
) -> str:
    """Build the GQM prompt for one group: the source and every candidate, labelled A, B, C, ...

    ``ref_text`` in ``ref_lang`` (a code or a name) and ``notes``, where given and non-empty
    after ``strip()``, follow the candidates as the spec's reference and notes blocks, stripped
    (section 1b); without them the prompt is section 1's. A half reference pair (one of the two
    empty or missing) is a :class:`GQMInputError` naming the half that was given: GRRM's
    reference code drops such a pair silently, the project refuses it as its schema does.

    Texts are pasted between the code fences as given, byte for byte as the spec (and GRRM's
    reference) does: a text holding a fence or a special token could forge the prompt's
    structure. Untrusted texts go through :mod:`cluster.prompt_guard` first (the scorer does so).
    """
    _require_str("source", source)
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise GQMInputError("candidates", candidates, "must be a list of strings")
    if not MIN_CANDIDATES <= len(candidates) <= MAX_CANDIDATES:
        raise GQMInputError(
            "candidates",
            f"{len(candidates)} candidates",
            f"a group needs {MIN_CANDIDATES} to {MAX_CANDIDATES} candidates (letters A-Z)",
        )
    for index, candidate in enumerate(candidates):
        _require_str(f"candidates[{index}]", candidate)
    src_name = language_name(src_lang, "src_lang")
    trg_name = language_name(trg_lang, "trg_lang")
    task = _task_text(_require_prompt_type(prompt_type), add_example)
    blocks = "".join(_CANDIDATE_BLOCK.format(candidate_letter(i), c) for i, c in enumerate(candidates))
    context = _reference_block(ref_text, ref_lang) + _notes_block(notes, _GROUP_NOTES_BLOCK)
    return _GROUP_TEMPLATE.format(src_name, trg_name, task, source, blocks, context)


def _given(field: str, value: object) -> str | None:
    """``value`` stripped, or None when it is missing or blank (the spec's "not given")."""
    if value is None:
        return None
    return _require_str(field, value).strip() or None


def _reference_block(ref_text: object, ref_lang: object) -> str:
    text, lang = _given("ref_text", ref_text), _given("ref_lang", ref_lang)
    if lang is not None and text is None:
        raise GQMInputError("ref_lang", ref_lang, "given without ref_text (give both, or neither)")
    if text is not None and lang is None:
        raise GQMInputError("ref_text", ref_text, "given without ref_lang (give both, or neither)")
    if text is None:
        return ""
    return _REFERENCE_BLOCK.format(language_name(lang, "ref_lang"), text)


def _notes_block(notes: object, block: str) -> str:
    text = _given("notes", notes)
    return "" if text is None else block.format(text)


def _task_text(prompt_type: str, add_example: bool) -> str:
    return _TASKS[prompt_type] + " " + _EXAMPLES[prompt_type] if add_example else _TASKS[prompt_type]


def build_single_prompt(
    source: str, candidate: str, src_lang: str, trg_lang: str, *, notes: str | None = None
) -> str:
    """Build the single-candidate (SQM) prompt, the baseline GQM is compared against.

    ``notes``, where given and non-empty after ``strip()``, follow as the spec's notes block,
    stripped (section 2). Texts are pasted as given, as in :func:`build_group_prompt` (see
    :mod:`cluster.prompt_guard`).
    """
    _require_str("source", source)
    _require_str("candidate", candidate)
    prompt = _SINGLE_TEMPLATE.format(
        language_name(src_lang, "src_lang"), language_name(trg_lang, "trg_lang"), source, candidate
    )
    return prompt + _notes_block(notes, _SINGLE_NOTES_BLOCK)


def _not_a_prompt(prompt: str, kind: str, problem: str) -> GQMInputError:
    return GQMInputError("prompt", prompt, f"not {kind}: {problem}")


def _cut(prompt: str, text: str, separator: str, kind: str, what: str) -> tuple[str, str]:
    """``text`` before and after the first ``separator``, which must be there."""
    before, found, after = text.partition(separator)
    if not found:
        raise _not_a_prompt(prompt, kind, f"{what} ({separator!r}) not found")
    return before, after


def _candidate_head(index: int) -> str:
    return _CANDIDATE_PIECES[0] + candidate_letter(index) + _CANDIDATE_PIECES[1]


def _read_task(prompt: str, task: str) -> tuple[PromptType, bool]:
    for prompt_type in _TASKS:
        for add_example in (False, True):
            if task == _task_text(prompt_type, add_example):
                return prompt_type, add_example  # type: ignore[return-value]
    raise _not_a_prompt(prompt, "a GQM group prompt", f"unknown task sentence {_preview(task)}")


def _context_start(text: str, after_fence: Sequence[str]) -> int:
    """Where the context blocks (reference, notes) start in ``text``, the prompt's candidate
    part: right after the first closing fence that one of ``after_fence`` follows; the length
    of ``text`` when there is none."""
    fence = _CANDIDATE_PIECES[2]
    found = [text.find(fence + opening) for opening in after_fence]
    return min((index + len(fence) for index in found if index >= 0), default=len(text))


def _block_text(prompt: str, text: str, kind: str, what: str) -> str:
    """The text of a context block (its closing fence cut off): stripped and non-empty, as the
    builders write it."""
    fence = _CANDIDATE_PIECES[2]
    if not text.endswith(fence):
        raise _not_a_prompt(prompt, kind, f"the {what} block does not end with the closing fence {fence!r}")
    inner = text[: len(text) - len(fence)]
    if not inner or inner != inner.strip():
        raise _not_a_prompt(prompt, kind, f"the {what} block's text is empty or not stripped")
    return inner


def _read_notes(prompt: str, tail: str, opening: str, kind: str) -> str | None:
    """The notes of a prompt's last block (``tail``: empty, or a notes block that starts with ``opening``)."""
    if not tail:
        return None
    if not tail.startswith(opening):
        raise _not_a_prompt(prompt, kind, f"unexpected text after the last block: {_preview(tail)}")
    return _block_text(prompt, tail[len(opening) :], kind, "notes")


def _read_group_context(prompt: str, context: str, kind: str) -> tuple[str | None, str | None, str | None]:
    """``(ref_text, ref_lang, notes)`` of a group prompt's context blocks (section 1b)."""
    reference_opening, language_end, _ = _REFERENCE_PIECES
    if not context.startswith(reference_opening):
        return None, None, _read_notes(prompt, context, _GROUP_NOTES_OPENING, kind)
    ref_lang, rest = _cut(prompt, context[len(reference_opening) :], language_end, kind, "the reference heading")
    # The reference ends at the first closing fence the notes block follows, else at the end.
    notes_at = _context_start(rest, [_GROUP_NOTES_OPENING])
    ref_text = _block_text(prompt, rest[:notes_at], kind, "reference")
    return ref_text, ref_lang, _read_notes(prompt, rest[notes_at:], _GROUP_NOTES_OPENING, kind)


def parse_group_prompt(prompt: str) -> GroupPrompt:
    """Read a prompt of :func:`build_group_prompt` back into the arguments that built it.

    Texts may hold anything (newlines, fences, any Unicode) except what the format cannot tell
    apart from its own structure: a closing fence line followed by a ``Translation X:`` heading
    line, or by the opening of the reference or notes block (the builder pastes texts as given).
    Where a text holds one, the first such place is taken as the boundary. The reference and
    notes read back stripped, as the prompt holds them, and the reference's language as its name.
    Raises :class:`GQMInputError` for a text that is not a group prompt.
    """
    _require_str("prompt", prompt)
    head, langs, task_intro, source_intro, source_end, _, _ = _GROUP_PIECES
    kind = "a GQM group prompt"
    if not prompt.startswith(head):
        raise _not_a_prompt(prompt, kind, f"it does not start with {_preview(head)}")
    src_lang, rest = _cut(prompt, prompt[len(head) :], langs, kind, "the text after the source language")
    trg_lang, rest = _cut(prompt, rest, task_intro, kind, "the text after the target language")
    task, rest = _cut(prompt, rest, source_intro, kind, "the source heading")
    prompt_type, add_example = _read_task(prompt, task)
    source, rest = _cut(prompt, rest, source_end + _candidate_head(0), kind, "the end of the source and candidate A")
    context_at = _context_start(rest, [_REFERENCE_PIECES[0], _GROUP_NOTES_OPENING])
    ref_text, ref_lang, notes = _read_group_context(prompt, rest[context_at:], kind)
    rest = rest[:context_at]
    candidate_end = _CANDIDATE_PIECES[2]
    if not rest.endswith(candidate_end):
        raise _not_a_prompt(prompt, kind, f"it does not end with the closing fence {candidate_end!r}")
    rest = rest[: len(rest) - len(candidate_end)]
    candidates: list[str] = []
    # A candidate ends only where the heading of the *next* letter follows its closing fence.
    for index in range(1, MAX_CANDIDATES):
        candidate, found, after = rest.partition(candidate_end + _candidate_head(index))
        if not found:
            break
        candidates.append(candidate)
        rest = after
    candidates.append(rest)
    if len(candidates) < MIN_CANDIDATES:
        raise _not_a_prompt(prompt, kind, f"it has {len(candidates)} candidate, a group needs {MIN_CANDIDATES}")
    return GroupPrompt(
        source, tuple(candidates), src_lang, trg_lang, prompt_type, add_example, ref_text, ref_lang, notes
    )


def parse_single_prompt(prompt: str) -> SinglePrompt:
    """Read a prompt of :func:`build_single_prompt` back into the arguments that built it.

    The source may not hold the format's own ``Translation text:`` block opening, nor the
    candidate a closing fence line followed by the notes block's opening (see
    :func:`parse_group_prompt`); the notes may hold anything. Raises :class:`GQMInputError` for
    a text that is not a single prompt.
    """
    _require_str("prompt", prompt)
    head, langs, intro, middle, end = _SINGLE_PIECES
    kind = "an SQM single prompt"
    if not prompt.startswith(head):
        raise _not_a_prompt(prompt, kind, f"it does not start with {_preview(head)}")
    src_lang, rest = _cut(prompt, prompt[len(head) :], langs, kind, "the text after the source language")
    trg_lang, rest = _cut(prompt, rest, intro, kind, "the text after the target language")
    source, rest = _cut(prompt, rest, middle, kind, "the translation heading")
    notes_at = _context_start(rest, [_SINGLE_NOTES_OPENING])
    notes = _read_notes(prompt, rest[notes_at:], _SINGLE_NOTES_OPENING, kind)
    rest = rest[:notes_at]
    if not rest.endswith(end):
        raise _not_a_prompt(prompt, kind, f"it does not end with the closing fence {end!r}")
    return SinglePrompt(source, rest[: len(rest) - len(end)], src_lang, trg_lang, notes)


def parse_prompt(prompt: str) -> GroupPrompt | SinglePrompt:
    """Read a GQM group prompt or an SQM single prompt back (:func:`parse_group_prompt`,
    :func:`parse_single_prompt`); :class:`GQMInputError` when it is neither."""
    try:
        return parse_group_prompt(prompt)
    except GQMInputError as not_group:
        try:
            return parse_single_prompt(prompt)
        except GQMInputError as not_single:
            raise GQMInputError("prompt", prompt, f"{not_group.problem}; {not_single.problem}") from None


def embedded_prompt(text: str) -> str | None:
    """The GQM or SQM prompt inside ``text`` (wrapped in a chat template, say): from the first
    prompt opening to the last closing fence; ``None`` when there is none."""
    _require_str("text", text)
    start = text.find(_GROUP_PIECES[0])  # the single prompt opens with the same words
    end_fence = _CANDIDATE_PIECES[2]
    end = text.rfind(end_fence)
    if start < 0 or end < start:
        return None
    return text[start : end + len(end_fence)]


def last_line(text: str) -> str:
    """The spec's last line: strip, take what follows the last newline, strip again."""
    return text.strip().rsplit("\n", 1)[-1].strip()


def _parse_int(text: str) -> int | None:
    text = text.strip()
    return int(text) if _INTEGER.fullmatch(text) else None


def _parse_ranking_score(line: str, n: int) -> list[int] | None:
    scores: dict[int, int] = {}
    for item in line.split(","):
        if item.count(":") != 1:
            return None
        letter, value = (part.strip() for part in item.split(":"))
        score = _parse_int(value)
        if score is None or not SCORE_MIN <= score <= SCORE_MAX:
            return None
        index = LETTERS.find(letter) if len(letter) == 1 else -1
        if not 0 <= index < n or index in scores:
            return None
        scores[index] = score
    if len(scores) != n:
        return None
    return [scores[i] for i in range(n)]


def _parse_ranking(line: str, n: int) -> list[int] | None:
    if "<" in line:
        return None
    tiers = [[member.strip() for member in tier.split("=")] for tier in line.split(">")]
    members = [member for tier in tiers for member in tier]
    expected = set(LETTERS[:n])
    if len(members) != n or set(members) != expected:
        return None
    scores = [0] * n
    for tier_index, tier in enumerate(tiers):
        for member in tier:
            # Counted from the lowest tier, which scores 0 (GRRM's `_ranking_to_scores`).
            scores[LETTERS.index(member)] = len(tiers) - 1 - tier_index
    return scores


def _parse_score(line: str, n: int) -> list[int] | None:
    scores: list[int] = []
    for item in line.split(","):
        score = _parse_int(item.rsplit(":", 1)[-1])
        if score is None:
            return None
        scores.append(score)
    return scores if len(scores) == n else None


_PARSERS = {"ranking_score": _parse_ranking_score, "ranking": _parse_ranking, "score": _parse_score}


def parse_group_answer(text: str, n: int, prompt_type: PromptType = "ranking_score") -> list[int] | None:
    """Read a GRRM answer for a group of ``n`` candidates; ``None`` when it does not parse.

    Scores come back in candidate order (A, B, C, ...). For ``ranking`` the score of a candidate
    is (number of tiers) - 1 - (its tier index): the lowest tier scores 0 and the best tier
    (number of tiers) - 1, as GRRM's reference does (``C > A = B`` gives A: 0, B: 0, C: 1).
    """
    _require_str("text", text)
    _require_group_size("n", n)
    parser = _PARSERS[_require_prompt_type(prompt_type)]
    return parser(last_line(text), n)


def render_answer(
    scores: Sequence[int],
    prompt_type: PromptType = "ranking_score",
    analysis: str = "",
) -> str:
    """An answer in GRRM's own format for the given scores (best first, ties as ``=``).

    ``ranking_score``: the ranking line, then the score line; ``ranking``: the ranking line;
    ``score``: the score line in candidate order. Used by the scripted engine and round-trip tests.
    """
    n = _require_group_size("scores", len(scores))
    _require_prompt_type(prompt_type)
    order = sorted(range(n), key=lambda i: -scores[i])  # stable: ties keep candidate order
    tiers: list[list[int]] = []
    for index in order:
        if tiers and scores[tiers[-1][0]] == scores[index]:
            tiers[-1].append(index)
        else:
            tiers.append([index])
    ranking = " > ".join(" = ".join(LETTERS[i] for i in tier) for tier in tiers)
    ranked_scores = ", ".join(f"{LETTERS[i]}: {scores[i]}" for i in order)
    in_order_scores = ", ".join(f"{LETTERS[i]}: {scores[i]}" for i in range(n))
    body = {
        "ranking_score": f"{ranking}\n{ranked_scores}",
        "ranking": ranking,
        "score": in_order_scores,
    }[prompt_type]
    return f"{analysis}\n\n{body}" if analysis else body


def verdict_regex(n: int, prompt_type: PromptType = "ranking_score") -> str:
    """A regular expression for the verdict lines of an ``n``-candidate answer.

    Used to constrain generation (verdict repair). Score lines list the candidates in order
    (``A: 7, B: 9, ...``), so every string the pattern admits parses for ``ranking_score`` and
    ``score``; a ``ranking`` line can still repeat a letter (a permutation is not regular in
    reasonable size), so callers parse the result anyway. Repetitions are bounded so even a
    model that never emits a stop token terminates.
    """
    n = _require_group_size("n", n)
    _require_prompt_type(prompt_type)
    letter = f"[A-{LETTERS[n - 1]}]"
    score = "(10|[0-9])"
    ranking = f"{letter}( (>|=) {letter}){{{n - 1}}}"
    scores = ", ".join(f"{LETTERS[i]}: {score}" for i in range(n))
    return {
        "ranking_score": f"{ranking}\n{scores}",
        "ranking": ranking,
        "score": scores,
    }[prompt_type]


def extract_translation(response: str, extractor: Extractor = DEFAULT_EXTRACTOR) -> str | None:
    """Extract a policy rollout's translation (spec section 4); ``None`` marks the rollout invalid."""
    _require_str("response", response)
    if extractor not in EXTRACTORS:
        raise GQMInputError("extractor", extractor, f"must be one of {', '.join(EXTRACTORS)}")
    stripped = response.strip()
    if extractor == "codeblock":
        if stripped.count("```") != 2 or not stripped.endswith("```"):
            return None
        translation = stripped.split("```")[1].strip()
    elif extractor == "line":
        lines = [line.strip() for line in stripped.split("\n") if line.strip()]
        translation = lines[-1] if lines else ""
    elif extractor == "oneline":
        if "\n" in stripped:
            return None
        translation = stripped
    else:
        return stripped  # `none`: the stripped response, even when empty (spec section 4)
    return translation or None


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def ranking_accuracy(reference_scores: Sequence[float], predicted_scores: Sequence[float] | None) -> float:
    """Share of candidate pairs whose order (ties included) the prediction gets right.

    An unparsed answer (``None``) scores 0 for its group.
    """
    if isinstance(reference_scores, (str, bytes)) or not isinstance(reference_scores, Sequence):
        raise GQMInputError("reference_scores", reference_scores, "must be a list of numbers")
    if len(reference_scores) < MIN_CANDIDATES:
        raise GQMInputError("reference_scores", reference_scores, "needs at least 2 scores to form a pair")
    if predicted_scores is None:
        return 0.0
    if isinstance(predicted_scores, (str, bytes)) or not isinstance(predicted_scores, Sequence):
        raise GQMInputError("predicted_scores", predicted_scores, "must be a list of numbers or None")
    if len(predicted_scores) != len(reference_scores):
        raise GQMInputError(
            "predicted_scores",
            predicted_scores,
            f"has {len(predicted_scores)} scores for {len(reference_scores)} reference scores",
        )
    n = len(reference_scores)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    correct = sum(
        _sign(reference_scores[i] - reference_scores[j]) == _sign(predicted_scores[i] - predicted_scores[j])
        for i, j in pairs
    )
    return correct / len(pairs)


def mean_ranking_accuracy(
    groups: Sequence[tuple[Sequence[float], Sequence[float] | None]],
) -> float:
    """Mean of :func:`ranking_accuracy` over ``(reference, predicted)`` pairs, one per group."""
    if not groups:
        raise GQMInputError("groups", groups, "needs at least one group")
    return sum(ranking_accuracy(ref, pred) for ref, pred in groups) / len(groups)
