"""``grrm eval``: ranking accuracy (docs/gqm.md section 6) against accuracies computed by hand,
per language pair, with its bootstrap interval; and the ``grrm`` console script itself."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from argparse import Namespace
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grrm_cli.evaluate import AccuracyTally, Evaluation
from grrm_cli.main import main

ROOT = Path(__file__).resolve().parents[2]

# Each row's accuracy worked out pair by pair (sign of r_i - r_j against sign of p_i - p_j).
ROWS = [
    # (0,1) + +, (0,2) + +, (1,2) - -: 3 of 3
    {"src_lang": "en", "trg_lang": "de", "reference": [3, 1, 2], "scores": [9, 2, 5], "valid": True, "failure": None},
    # (0,1) + -, (0,2) + -, (1,2) - -: 1 of 3
    {"src_lang": "en", "trg_lang": "de", "reference": [3, 1, 2], "scores": [1, 2, 3], "valid": True, "failure": None},
    # ties count: (0,1) = =, (0,2) (0,3) (1,2) (1,3) + +, (2,3) + = wrong: 5 of 6
    {"src_lang": "zh", "trg_lang": "en", "reference": [5, 5, 1, 0], "scores": [7, 7, 2, 2], "valid": True, "failure": None},
    # an invalid verdict (no scores) counts 0
    {"src_lang": "zh", "trg_lang": "en", "reference": [1, 2], "scores": None, "valid": False, "failure": "parse_failed"},
    # left out: a row that held no group, a row without a reference, scores for another group size
    {"src_lang": "zh", "trg_lang": "en", "reference": [1, 2], "scores": None, "valid": False, "failure": "bad_row"},
    {"src_lang": "zh", "trg_lang": "en", "reference": None, "scores": [1, 2], "valid": True, "failure": None},
    {"src_lang": "zh", "trg_lang": "en", "reference": [1, 2, 3], "scores": [1, 2], "valid": True, "failure": None},
]
EXPECTED = {"all": (1 + 1 / 3 + 5 / 6 + 0) / 4, "en-de": (1 + 1 / 3) / 2, "zh-en": (5 / 6 + 0) / 2}


def write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_eval_matches_hand_computed_accuracies(tmp_path, capsys, suffix):
    path = write(tmp_path / f"scored{suffix}", ROWS)
    assert main(["eval", str(path), "--reference-column", "reference", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["groups"] == 4 and report["invalid_predictions"] == 1
    assert report["accuracy"] == pytest.approx(EXPECTED["all"])
    assert report["by_language_pair"]["en-de"]["accuracy"] == pytest.approx(EXPECTED["en-de"])
    assert report["by_language_pair"]["zh-en"]["accuracy"] == pytest.approx(EXPECTED["zh-en"])
    assert report["by_language_pair"]["zh-en"]["groups"] == 2
    assert report["skipped_rows"] == {
        "bad_row": 1,
        "reference: must be a list of numbers": 1,
        "scores: has 2 scores for 3 reference scores": 1,
    }
    low, high = report["accuracy_ci95"]
    assert 0 <= low <= report["accuracy"] <= high <= 1 and high - low > 0.1  # 4 groups: a wide interval
    assert "bootstrap" in report["ci_method"]


def test_eval_prints_a_table_and_names_a_missing_column(tmp_path, capsys):
    path = write(tmp_path / "scored.parquet", ROWS)
    assert main(["eval", str(path), "--reference-column", "reference"]) == 0
    out = capsys.readouterr().out
    assert "en-de" in out and "zh-en" in out and f"{EXPECTED['all']:.4f}" in out and "95% CI" in out
    assert main(["eval", str(path), "--reference-column", "reference_scores"]) == 2
    assert "no column 'reference_scores'" in capsys.readouterr().err


def test_bootstrap_over_value_counts_is_the_bootstrap_over_groups():
    rng = np.random.default_rng(1)
    accuracies = rng.choice([0.0, 1 / 3, 2 / 3, 1.0], p=[0.1, 0.2, 0.3, 0.4], size=300)
    tally = AccuracyTally()
    for value in accuracies:
        tally.add(float(value), invalid=False)
    low, high = tally.interval(np.random.default_rng(7), resamples=20_000)
    # The plain bootstrap: resample the groups themselves.
    means = accuracies[np.random.default_rng(8).integers(0, len(accuracies), size=(20_000, len(accuracies)))].mean(axis=1)
    plain_low, plain_high = np.percentile(means, [2.5, 97.5])
    assert low == pytest.approx(plain_low, abs=0.006) and high == pytest.approx(plain_high, abs=0.006)
    # ... and, with 300 groups, close to the normal approximation.
    half = 1.96 * accuracies.std(ddof=1) / np.sqrt(len(accuracies))
    assert low == pytest.approx(accuracies.mean() - half, abs=0.01) and high == pytest.approx(accuracies.mean() + half, abs=0.01)
    constant = AccuracyTally()
    for _ in range(5):
        constant.add(0.5, invalid=False)
    assert constant.interval(np.random.default_rng(0), 100) == (0.5, 0.5)


def test_a_language_pair_is_reported_only_where_the_row_has_both_languages():
    evaluation = Evaluation()
    args = Namespace(reference_column="reference", predicted_column="scores", src_lang_column="src_lang",
                     trg_lang_column="trg_lang")
    evaluation.add_row({"reference": [1, 2], "scores": [1, 2]}, args)
    evaluation.add_row({"reference": [1, 2], "scores": [2, 1], "src_lang": "en", "trg_lang": "fr"}, args)
    report = evaluation.report(resamples=100, seed=0)
    assert report["accuracy"] == 0.5 and list(report["by_language_pair"]) == ["en-fr"]


def test_the_grrm_console_script_is_declared_and_installed():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"grrm": "grrm_cli.main:main"}
    (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "grrm"]
    assert entry.value == "grrm_cli.main:main"
    grrm = Path(sys.executable).with_name("grrm")
    completed = subprocess.run([str(grrm), "--help"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert all(command in completed.stdout for command in ("serve", "score", "eval"))
