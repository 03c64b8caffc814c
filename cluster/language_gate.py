"""The language gate of GRRM's reference (``enable_language_detection``; GQM spec section 5b).

Before a group is deduplicated, each extracted translation's language is detected over exactly ten
languages (:data:`GATED_LANGUAGES`). A translation whose detected language is not the group's target
gets the default reward and never reaches the model. A translation passes unchecked when the target
is not one of the ten (ja, th, uk, ... pass) or when it is empty after ``.strip()``.

Pure: the detector is injected (:class:`LanguageDetector`); the one the service uses is built with
``lingua`` in ``deployments/language_detection.py``. Tests and scripted engines may pass their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cluster.gqm import LANGUAGE_NAMES

__all__ = ["GATED_LANGUAGES", "LanguageDetector", "LanguageGate", "target_code"]

# The reference builds its detector from exactly these (two-letter ISO 639-1 codes).
GATED_LANGUAGES: frozenset[str] = frozenset({"en", "zh", "de", "ru", "ko", "fr", "es", "pt", "it", "nl"})

# A target given as a name ("English", as the prompt shows it) gates like its code.
_CODE_BY_NAME: dict[str, str] = {name.casefold(): code for code, name in LANGUAGE_NAMES.items()}


@runtime_checkable
class LanguageDetector(Protocol):
    """Detects the language of each text, in order.

    Returns one entry per text: its two-letter code (one of :data:`GATED_LANGUAGES`), or ``None`` when
    the detector cannot tell (lingua's ``detect_language_of`` returns ``None`` when unsure). It must be
    safe to call from worker threads.
    """

    def detect(self, texts: Sequence[str]) -> list[str | None]: ...


def target_code(trg_lang: str) -> str | None:
    """The two-letter code of a group's target language, as the gate compares it.

    A two-letter value is a code already (the request schema admits known codes only). A longer value is
    a language name: a name the prompts use for a code (``cluster.gqm.LANGUAGE_NAMES``, compared without
    case or surrounding spaces: "English", "german") maps back to that code; any other name gives
    ``None``, which is not one of the ten, so its group is not gated (the reference only ever sees codes).
    """
    value = trg_lang.strip()
    if len(value) <= 2:
        return value
    return _CODE_BY_NAME.get(value.casefold())


class LanguageGate:
    """The reference's language gate over an injected detector (one gate per process is enough)."""

    def __init__(self, detector: LanguageDetector):
        self.detector = detector

    def passes(self, trg_lang: str, texts: Sequence[str]) -> list[bool]:
        """Whether each text passes the gate for the target ``trg_lang`` (a code or a name), in order.

        A text passes unchecked when the target is not one of :data:`GATED_LANGUAGES` or the text is empty
        after ``.strip()``; only the others are given to the detector, in one call. Otherwise a text passes
        iff its detected language equals the target. An undetermined detection (``None``) fails, as in the
        reference, which compares lingua's answer (``None`` when unsure) with the target code.
        """
        verdicts = [True] * len(texts)
        code = target_code(trg_lang)
        if code not in GATED_LANGUAGES:
            return verdicts
        checked = [i for i, text in enumerate(texts) if text.strip()]
        if not checked:
            return verdicts
        detected = self.detector.detect([texts[i] for i in checked])
        if len(detected) != len(checked):
            raise ValueError(f"the language detector answered {len(detected)} languages for {len(checked)} texts")
        for i, language in zip(checked, detected):
            verdicts[i] = language == code
        return verdicts
