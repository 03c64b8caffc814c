"""The language gate's detector: ``lingua`` (``lingua-language-detector``) over the gate's ten languages.

GRRM's reference detects a translation's language with lingua, built from exactly the ten languages of
:data:`cluster.language_gate.GATED_LANGUAGES`; :func:`lingua_detector` builds that detector once per
process and mode and wraps it as a :class:`cluster.language_gate.LanguageDetector`. lingua's detector
is safe to share between threads (its documentation says so), so one wrapper serves every worker thread.

Modes (``bench/language_gate.py`` measures each; BENCHMARKS has the figures):

- ``lazy``: lingua's own default, high accuracy, each language model loaded when a text first needs it;
- ``preloaded``: high accuracy, every model loaded when the detector is built
  (``with_preloaded_language_models``): the same verdicts as ``lazy``;
- ``low_accuracy``: the small models only (``with_low_accuracy_mode``), lazily loaded: less memory and
  faster, but lingua says accuracy drops for texts under 120 characters;
- ``low_accuracy_preloaded``: both.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal, get_args

from lingua import IsoCode639_1, Language, LanguageDetectorBuilder
from lingua import LanguageDetector as _Lingua

from cluster.language_gate import GATED_LANGUAGES

__all__ = ["DEFAULT_MODE", "DETECTOR_MODES", "DetectorMode", "LinguaDetector", "lingua_detector"]

DetectorMode = Literal["lazy", "preloaded", "low_accuracy", "low_accuracy_preloaded"]
DETECTOR_MODES: tuple[str, ...] = get_args(DetectorMode)
DEFAULT_MODE: DetectorMode = "preloaded"

# lingua's language of each gated code, and back.
_LANGUAGES: dict[str, Language] = {
    code: Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper())) for code in sorted(GATED_LANGUAGES)
}
_CODES: dict[Language, str] = {language: code for code, language in _LANGUAGES.items()}

# One lingua detector per mode and process (built on first use), whatever the number of callers.
_built: dict[str, _Lingua] = {}
_build_lock = threading.Lock()


class LinguaDetector:
    """lingua's answers as two-letter codes (``None`` where lingua cannot tell), one per text, in order.

    ``parallel``: one call to lingua's ``detect_languages_in_parallel_of`` for the whole batch (its own
    thread pool, Rust's rayon: as many threads as the process may use, ``RAYON_NUM_THREADS`` to bound it;
    the call holds the GIL until the batch is done). Otherwise ``detect_language_of`` per text, the
    reference's own call, on the calling thread, the GIL free for others between texts. Both give the
    same answers.
    """

    def __init__(self, detector: _Lingua, mode: DetectorMode, parallel: bool):
        self._detector = detector
        self.mode = mode
        self.parallel = parallel

    def detect(self, texts: Sequence[str]) -> list[str | None]:
        """The language of each text: a gated code, or ``None`` when undetermined."""
        if self.parallel:
            languages = self._detector.detect_languages_in_parallel_of(list(texts))
        else:
            languages = [self._detector.detect_language_of(text) for text in texts]
        return [None if language is None else _CODES[language] for language in languages]


def _build(mode: DetectorMode) -> _Lingua:
    builder = LanguageDetectorBuilder.from_languages(*_LANGUAGES.values())
    if mode.startswith("low_accuracy"):
        builder = builder.with_low_accuracy_mode()
    if mode.endswith("preloaded"):
        builder = builder.with_preloaded_language_models()
    return builder.build()


def lingua_detector(mode: DetectorMode = DEFAULT_MODE, *, parallel: bool = False) -> LinguaDetector:
    """The process's lingua detector over the ten gated languages, built on the first call for ``mode``.

    The default, ``preloaded`` one text at a time, is the bench's choice (``bench/language_gate.py``,
    BENCHMARKS): it gives the reference's verdicts (high accuracy, lingua's default builder; on the bench's
    4,096 candidates ``low_accuracy`` changes 7 verdicts, short and mixed texts), one core gates GRRM's step
    of 512 x 8 candidates in about 0.5 s of CPU (the issue's bound is 1 s; ``low_accuracy`` takes about
    0.2 s, not worth a verdict unlike the reference's), and it loads its models here, once, rather than in
    the first groups' gates as ``lazy`` does. One text at a time rather than lingua's parallel call: that
    call saves no CPU, a group's few candidates gain nothing from a thread pool, and it holds the GIL (the
    replica's event loop) until its whole batch is done, where one text at a time lets CPython hand the GIL
    over between texts. Building ``preloaded`` takes about 1.5 s of CPU and 200-250 MB of memory: call
    this off the event loop (a worker thread), before the first group.
    """
    if mode not in DETECTOR_MODES:
        raise ValueError(f"mode: unknown language detector mode {mode!r}; known: {', '.join(DETECTOR_MODES)}")
    with _build_lock:
        detector = _built.get(mode)
        if detector is None:
            detector = _built[mode] = _build(mode)
    return LinguaDetector(detector, mode, parallel)
