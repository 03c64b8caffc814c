"""Small datasets shaped like GRRM's published ranking test sets (grrm_cli/presets.py says where the
shapes come from), laid out as ``hf download`` lays them out, with accuracies worked out by hand.

Every candidate carries a ``[q=N]`` marker: the scripted engine (simulated/scripted_engine.py) scores
it N, so what ``grrm eval --config`` predicts is known, and each group's accuracy below is worked out
pair by pair (sign of r_i - r_j against sign of p_i - p_j, ties included) from the markers and the
reference ``scores``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCRIPTED_CONFIG = """\
applications:
  - name: grrm
    import_path: deployments.app:build_app
    args:
      engine:
        kind: scripted
"""


def group(src_lang: str, trg_lang: str, markers: list[int], reference: list) -> dict:
    """One row: a source, candidates the scripted engine scores ``markers``, the reference ``scores``."""
    return {
        "src_lang": src_lang, "trg_lang": trg_lang, "src_text": f"source {src_lang} {markers}",
        "mt_texts": [f"candidate {i} [q={q}]" for i, q in enumerate(markers)], "scores": reference,
    }


# TowerBlocks-MT-Ranking: test.parquet (and train.parquet, never evaluated) at the repository's root;
# Gemini's integer scores; both directions in the one held-out set.
TOWERBLOCKS_TEST = [
    # (0,1) + +, (0,2) + +, (1,2) + = wrong: 2 of 3
    group("zh", "en", [8, 3, 3], [9, 4, 2]),
    # (0,1) - -: 1 of 1
    group("en", "zh", [2, 6], [3, 8]),
    # (0,1) = =, (0,2) + - wrong, (0,3) + +, (1,2) + - wrong, (1,3) + +, (2,3) + +: 4 of 6
    group("zh", "en", [5, 5, 9, 1], [7, 7, 6, 2]),
]
TOWERBLOCKS_EXPECTED = {"all": (2 / 3 + 1 + 4 / 6) / 3, "zh-en": (2 / 3 + 4 / 6) / 2, "en-zh": 1.0}
TOWERBLOCKS_TYPES = pa.schema([
    ("src_text", pa.string()), ("trg_text", pa.string()), ("src_lang", pa.string()), ("trg_lang", pa.string()),
    ("mt_texts", pa.list_(pa.string())), ("analysis", pa.string()), ("scores", pa.list_(pa.int64())),
])

# MT_Ranking_Metric_Test: one file per test set under data/; human scores, floats for pSQM and the
# averaged MQM (penalties as negative numbers: higher is better), 1/0 for the Seed-X-Challenge pairs.
METRIC_TEST = {
    "wmt_newstest2020_psqm": ("data/wmt_newstest2020_zhen_psqm_group_test.parquet", pa.float64(), [
        group("zh", "en", [7, 4, 6], [5.5, 2.0, 4.5]),  # + +, + +, - -: 3 of 3
        group("zh", "en", [3, 5], [4.0, 1.5]),  # + -: 0 of 1
    ]),
    "wmt_generalMT2022_enzh_mqm": ("data/wmt_generalMT2022_enzh_mqm_group_test.parquet", pa.float64(), [
        group("en", "zh", [6, 2, 9], [-1.0, -5.0, 0.0]),  # + +, - -, - -: 3 of 3
    ]),
    "wmt_generalMT2022_zhen_mqm": ("data/wmt_generalMT2022_zhen_avgmqm_group_test.parquet", pa.float64(), [
        group("zh", "en", [4, 7], [-2.5, -2.5]),  # a tie the prediction orders: 0 of 1
    ]),
    "wmt_generalMT2022_ende_mqm": ("data/wmt_generalMT2022_ende_avgmqm_group_test.parquet", pa.float64(), [
        # (0,1) (0,2) (0,3) + +, (1,2) - = wrong, (1,3) (2,3) + +: 5 of 6
        group("en", "de", [9, 5, 5, 1], [0.0, -3.0, -1.0, -10.0]),
    ]),
    "wmt_generalMT2022_enru_mqm": ("data/wmt_generalMT2022_enru_avgmqm_group_test.parquet", pa.float64(), [
        group("en", "ru", [8, 3], [-1.0, -4.0]),  # + +: 1 of 1
    ]),
    "seedx_challenge_ranking": ("data/seedx_challenge.ranking.max_bleurt.parquet", pa.int64(), [
        group("en", "zh", [9, 2], [1, 0]),  # + +: 1 of 1
        group("zh", "en", [1, 4], [1, 0]),  # + -: 0 of 1
    ]),
}
METRIC_TEST_EXPECTED = {
    "wmt_newstest2020_psqm": 0.5, "wmt_generalMT2022_enzh_mqm": 1.0, "wmt_generalMT2022_zhen_mqm": 0.0,
    "wmt_generalMT2022_ende_mqm": 5 / 6, "wmt_generalMT2022_enru_mqm": 1.0, "seedx_challenge_ranking": 0.5,
}


def write_towerblocks(root: Path) -> Path:
    """The repository as downloaded: train.parquet (here one group nobody may score) and test.parquet."""
    root.mkdir(parents=True)
    for name, rows in (("train", [group("zh", "en", [1, 9], [9, 1])]), ("test", TOWERBLOCKS_TEST)):
        full = [{**row, "trg_text": "reference", "analysis": "Gemini's comparison"} for row in rows]
        pq.write_table(pa.Table.from_pylist(full, schema=TOWERBLOCKS_TYPES), root / f"{name}.parquet")
    (root / "README.md").write_text("dataset card\n")
    return root


def write_metric_test(root: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """The repository as downloaded: README.md and data/<one parquet file per test set>."""
    (root / "data").mkdir(parents=True)
    for name, (path, score_type, rows) in METRIC_TEST.items():
        if name in leave_out:
            continue
        schema = pa.schema([("src_lang", pa.string()), ("trg_lang", pa.string()), ("src_text", pa.string()),
                            ("mt_texts", pa.list_(pa.string())), ("scores", pa.list_(score_type))])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), root / path)
    (root / "README.md").write_text("dataset card\n")
    return root
