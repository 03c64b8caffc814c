"""The language gate (GQM spec 5b): its rules over an injected detector, and lingua's detector at the edge."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from bench.language_gate import CORPUS, Candidate, Group
from cluster.language_gate import GATED_LANGUAGES, LanguageDetector, LanguageGate, target_code
from deployments.language_detection import DETECTOR_MODES, LinguaDetector, lingua_detector

GERMAN = "Die Sitzung wurde wegen des Sturms auf nächsten Dienstag verschoben."
ENGLISH = "The meeting has been postponed until next Tuesday because of the storm."
CHINESE = "由于暴风雨，会议推迟到下周二举行。"


class Scripted:
    """A detector answering from a table (None for texts not in it), recording what it was asked."""

    def __init__(self, answers: dict[str, str | None]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def detect(self, texts: Sequence[str]) -> list[str | None]:
        self.calls.append(list(texts))
        return [self.answers.get(text) for text in texts]


@pytest.fixture(scope="module")
def detector() -> LinguaDetector:
    """The service's detector, as ``lingua_detector()`` builds it."""
    return lingua_detector()


def test_the_ten_gated_languages_are_the_references():
    assert GATED_LANGUAGES == {"en", "zh", "de", "ru", "ko", "fr", "es", "pt", "it", "nl"}


@pytest.mark.parametrize(("trg_lang", "code"), [
    ("en", "en"), ("zh", "zh"), ("ja", "ja"),
    ("English", "en"), (" german ", "de"), ("CHINESE", "zh"), ("Japanese", "ja"), ("Ukrainian", "uk"),
    ("Klingon", None), ("Simplified Chinese", None),
])
def test_target_code_from_a_code_or_a_name(trg_lang, code):
    assert target_code(trg_lang) == code


def test_a_target_outside_the_ten_passes_everything_unchecked():
    scripted = Scripted({GERMAN: "de"})
    gate = LanguageGate(scripted)
    for target in ("ja", "th", "uk", "Japanese", "Klingon"):
        assert gate.passes(target, [GERMAN, "", "?"]) == [True, True, True]
    assert scripted.calls == []


def test_blank_texts_pass_and_are_never_detected():
    scripted = Scripted({GERMAN: "de", ENGLISH: "en"})
    gate = LanguageGate(scripted)
    assert gate.passes("en", ["", " ", "\n\t", ENGLISH, GERMAN]) == [True, True, True, True, False]
    assert scripted.calls == [[ENGLISH, GERMAN]]  # one call for the group, blanks left out
    assert gate.passes("en", ["", "  "]) == [True, True]
    assert len(scripted.calls) == 1


def test_an_undetermined_language_fails_as_in_the_reference():
    # lingua answers None when unsure; the reference compares that with the target code.
    gate = LanguageGate(Scripted({ENGLISH: "en"}))
    assert gate.passes("en", ["2024", ENGLISH]) == [False, True]


def test_a_detector_answering_the_wrong_number_of_languages_is_an_error():
    class Short:
        def detect(self, texts):
            return ["en"]

    with pytest.raises(ValueError, match="1 languages for 2 texts"):
        LanguageGate(Short()).passes("en", [ENGLISH, GERMAN])


def test_lingua_gates_a_german_sentence_for_an_english_target(detector):
    assert isinstance(detector, LanguageDetector)
    gate = LanguageGate(detector)
    for target in ("en", "English"):
        assert gate.passes(target, [GERMAN]) == [False]
    for target in ("de", "German"):
        assert gate.passes(target, [GERMAN]) == [True]


def test_lingua_on_a_mixed_group(detector):
    gate = LanguageGate(detector)
    texts = [ENGLISH, GERMAN, "", "   ", CHINESE, "Thank you very much.", CORPUS["en"][0][5]]
    assert gate.passes("en", texts) == [True, False, True, True, False, True, True]
    assert gate.passes("zh", texts) == [False, False, True, True, True, False, False]
    assert gate.passes("ja", texts) == [True] * len(texts)


def test_the_batch_path_answers_as_the_one_by_one_path(detector):
    texts = [sentence for sentences, shorts in CORPUS.values() for sentence in (*sentences[:4], *shorts)]
    texts += ["2024", "OK", "Hotel", f"{ENGLISH} {GERMAN}"]
    one_by_one = detector.detect(texts)
    assert lingua_detector(detector.mode, parallel=True).detect(texts) == one_by_one
    assert None in one_by_one and set(one_by_one) - {None} == GATED_LANGUAGES  # every answer kind seen
    assert one_by_one[:4] == ["en"] * 4


def test_one_lingua_detector_per_mode_and_process():
    built: list[LinguaDetector] = []
    threads = [threading.Thread(target=lambda: built.append(lingua_detector("low_accuracy"))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(d._detector) for d in built}) == 1
    assert lingua_detector("low_accuracy", parallel=True)._detector is built[0]._detector
    assert built[0].detect([GERMAN]) == ["de"]


def test_an_unknown_mode_is_refused_naming_it():
    assert set(DETECTOR_MODES) == {"lazy", "preloaded", "low_accuracy", "low_accuracy_preloaded"}
    with pytest.raises(ValueError, match="mode: unknown language detector mode 'fast'"):
        lingua_detector("fast")  # type: ignore[arg-type]


def test_the_bench_owes_verdicts_by_the_spec():
    """bench.language_gate counts wrong verdicts against these."""
    candidates = (Candidate(GERMAN, "source", "de"), Candidate(ENGLISH, "sentence", "en"), Candidate(" ", "blank", None),
                  Candidate("2024", "symbols", None))
    assert Group("de", "en", candidates).owed() == [False, True, True, None]
    assert Group("de", "ja", candidates).owed() == [True, True, True, None]


def test_the_bench_runs_quick(tmp_path, monkeypatch):
    """``python -m bench.language_gate --quick`` writes its rows (each configuration in a fresh process)."""
    import json

    from bench import language_gate

    monkeypatch.setenv("GRRM_BENCH_RESULTS", str(tmp_path))
    assert language_gate.main(["--quick"]) == 0
    rows = json.loads((tmp_path / "language_gate.json").read_text())
    assert {(row["mode"], row["api"]) for row in rows} == {
        ("lazy", "serial"), ("low_accuracy", "serial"), ("low_accuracy", "parallel")}
    for row in rows:
        assert row["candidates"] == 128 and row["wrong"] == row["wrongly_gated"] + row["wrongly_passed"]
        assert row["gated"] > 0 and row["cpu_s"] > 0 and row["rss_mb"] > 0
    low = [row for row in rows if row["mode"] == "low_accuracy"]
    assert low[0]["gated"] == low[1]["gated"]  # one model, the same verdicts through either lingua API
    assert language_gate.report_section(rows).startswith("## ")
