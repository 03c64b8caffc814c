"""The GQM and SQM prompts as GRRM's reference code builds them, re-implemented from the wire-format
spec (``docs/gqm.md`` sections 1, 1b and 2) for the tests: no import of ``cluster.gqm`` and no code
from it. Prompts are built by plain concatenation (the project's builder uses ``str.format``), and
where the reference and the project differ this module does what the **reference** does:

- a half reference pair (``ref_text`` without ``ref_lang``, or the reverse, or one of them blank)
  is dropped silently: no reference block (the project refuses it, naming the field);
- an unknown two-letter code is kept as given (the project refuses it, naming the field).
"""

from __future__ import annotations

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Section 1's tables, typed from the spec.
SPEC_TASKS = {
    "ranking_score": "Finally, rank and score the candidates with integer scores on a scale from 0 to 10.",
    "ranking": "Finally, rank the candidates in order of quality from best to worst.",
    "score": "Finally, score the candidates with integer scores on a scale from 0 to 10.",
}
SPEC_EXAMPLES = {
    "ranking_score": "At the end section, first output the rankings in descending order, for example: "
    "`B > A = D > C`. Then, on the last line, output the scores, for example: `B: 9, A: 7, D: 7, C: 2`.",
    "ranking": "Output the rankings in descending order on the last line, for example: `B > A = D > C`.",
    "score": "Output the scores on the last line, for example: `A: 4, B: 9, C: 7, D: 9`.",
}
# Section 1's sentence, as the spec writes it: "Two-letter codes map to names: en English, ...".
SPEC_LANGUAGES = dict(
    pair.split(" ")
    for pair in (
        "en English, zh Chinese, de German, ru Russian, ko Korean, ja Japanese, fr French, es Spanish, "
        "pt Portuguese, it Italian, nl Dutch, th Thai, ro Romanian, ar Arabic, el Greek, vi Vietnamese, uk Ukrainian"
    ).split(", ")
)

FENCE = "```"


def spec_language(value: str) -> str:
    """A two-letter code's name; anything else (a name, an unknown code) as given: the reference's map."""
    return SPEC_LANGUAGES.get(value, value)


def spec_reference_block(ref_text: str | None, ref_lang: str | None) -> str:
    """Section 1b's reference block: empty unless both are given and non-blank; both stripped."""
    if ref_text is None or ref_lang is None or not ref_text.strip() or not ref_lang.strip():
        return ""
    return (
        "\n\nYou may refer to the following reference, if helpful, when evaluating the translations.\n\n"
        + spec_language(ref_lang.strip())
        + " reference:\n"
        + FENCE
        + "\n"
        + ref_text.strip()
        + "\n"
        + FENCE
        + "\n"
    )


def spec_notes_block(notes: str | None, evaluated: str) -> str:
    """The notes block (sections 1b and 2): empty for missing or blank notes; the notes stripped.
    ``evaluated`` is "translations" in the group prompt and "translation" in the single one."""
    if notes is None or not notes.strip():
        return ""
    return (
        "\n\nYou may refer to the following notes, if helpful, when evaluating the "
        + evaluated
        + ".\n\nNotes:\n"
        + FENCE
        + "\n"
        + notes.strip()
        + "\n"
        + FENCE
        + "\n"
    )


def spec_group_prompt(
    source: str,
    candidates: list[str],
    src_lang: str,
    trg_lang: str,
    prompt_type: str = "ranking_score",
    add_example: bool = False,
    ref_text: str | None = None,
    ref_lang: str | None = None,
    notes: str | None = None,
) -> str:
    """The group prompt (sections 1 and 1b); languages as codes or names."""
    task = SPEC_TASKS[prompt_type]
    if add_example:
        task = task + " " + SPEC_EXAMPLES[prompt_type]
    blocks = ""
    for index, candidate in enumerate(candidates):
        blocks += "Translation " + LETTERS[index] + ":\n" + FENCE + "\n" + candidate + "\n" + FENCE + "\n"
    return (
        "Given a source text in "
        + spec_language(src_lang)
        + " and multiple translation candidates in "
        + spec_language(trg_lang)
        + ". Perform a step by step analysis and comparison of the translation quality for the candidates. "
        + task
        + "\n\nSource text:\n"
        + FENCE
        + "\n"
        + source
        + "\n"
        + FENCE
        + "\n\n"
        + blocks
        + spec_reference_block(ref_text, ref_lang)
        + spec_notes_block(notes, "translations")
    )


def spec_single_prompt(source: str, candidate: str, src_lang: str, trg_lang: str, notes: str | None = None) -> str:
    """The single-candidate (SQM) prompt (section 2), with its notes block."""
    return (
        "Given a source text in "
        + spec_language(src_lang)
        + " and a translation text in "
        + spec_language(trg_lang)
        + ". Perform a step by step analysis of translation quality and assign a score on a scale from 0 to 10."
        + "\nSource text:\n"
        + FENCE
        + "\n"
        + source
        + "\n"
        + FENCE
        + "\n\nTranslation text:\n"
        + FENCE
        + "\n"
        + candidate
        + "\n"
        + FENCE
        + "\n"
        + spec_notes_block(notes, "translation")
    )
