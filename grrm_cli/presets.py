"""GRRM's own ranking test sets as their authors publish them on Hugging Face (``grrm eval --preset``).

A preset names a dataset's columns (the group to score, the reference scores) and its test sets:
which file holds each, the column of GRRM's published table it fills, and GRRM's number there.
The facts come from GRRM's repository (github.com/NJUNLP/GRRM; read at the fork DoubleVII/GRRM,
commit 88d0618, whose eval fix 30f2c04 makes eval/run_ranking_acc_eval.py report the accuracy)
and the datasets' cards on Hugging Face:

* files: ``utils/config.py`` (``RANKING_TEST_DATA_META_INFO``: data id, path, language pair);
* columns: ``eval/run_ranking_acc_eval.py`` sends ``src_text``, ``mt_texts``, ``src_lang`` and
  ``trg_lang`` of every set to the model and compares with ``scores`` (one per candidate, higher is
  better: ``utils/helpers._score_to_rank`` ranks them in descending order); both cards list them;
* numbers: README, "Reward Model Ranking Accuracy", row "GRRM (RLVR)". Its "Avg." is the unweighted
  mean of the six MT_Ranking_Metric_Test sets, the held-out set left out: that reproduces the Avg.
  of every row of the table (64.01 = mean of 57.77, 62.17, 66.00, 61.04, 66.67, 70.39).

Not confirmed (the files could not be downloaded where this was written): the column types of
MT_Ranking_Metric_Test beyond the card's names (``scores`` of the MQM sets may be floats) and
that ``test.parquet`` sits at the root of TowerBlocks-MT-Ranking (GRRM's config says so; the
card names a 512-row ``test`` split). The column flags of ``grrm eval`` override a preset's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grrm_cli.columns import ColumnMapping
from grrm_cli.dataset import SUFFIXES, DatasetError


@dataclass(frozen=True)
class RankingSet:
    """One test set of a preset: a file of the published dataset and GRRM's number on it."""

    name: str  # GRRM's data id (utils/config.py), the key of the set in the report
    path: str  # the file, relative to the root of the downloaded dataset repository
    label: str  # the column of GRRM's published table
    published: float  # GRRM (RLVR)'s ranking accuracy there, as a fraction

    @property
    def stem(self) -> str:
        """The file name without its suffix: how the set is recognised in a folder (scored runs keep it)."""
        return Path(self.path).stem


@dataclass(frozen=True)
class Preset:
    """A published ranking test dataset: its columns, its test sets, and the average GRRM publishes."""

    name: str
    repo_id: str  # the Hugging Face dataset (`hf download REPO_ID --repo-type dataset`)
    sets: tuple[RankingSet, ...]
    # The group, as grrm score reads it (GRRM's sets share these names; none has a group id column).
    group: ColumnMapping = ColumnMapping(source="src_text", candidates="mt_texts")
    reference: str = "scores"
    # GRRM's "Avg." over all the preset's sets; None where the table has no average of them.
    published_average: float | None = None


TOWERBLOCKS = Preset(
    name="towerblocks-mt-ranking",
    repo_id="double7/TowerBlocks-MT-Ranking",
    # The test split: 512 held-out groups of 2-4 candidates, Zh->En and En->Zh together (utils/config.py
    # gives its pair as zh/en -> en/zh), ranked by Gemini-2.5-Pro. train.parquet beside it is GRRM's
    # training data and is never picked.
    sets=(RankingSet("tower_zhen_ranking_testset", "test.parquet", "held-out (Zh↔En)", 0.8258),),
)

MT_RANKING_METRIC_TEST = Preset(
    name="mt-ranking-metric-test",
    repo_id="double7/MT_Ranking_Metric_Test",
    # Human-derived WMT sets (pSQM, MQM averaged over raters) and the Seed-X-Challenge pairs, one file each.
    sets=(
        RankingSet("wmt_newstest2020_psqm", "data/wmt_newstest2020_zhen_psqm_group_test.parquet",
                   "NT20 (Zh→En)", 0.5777),
        RankingSet("wmt_generalMT2022_enzh_mqm", "data/wmt_generalMT2022_enzh_mqm_group_test.parquet",
                "GenMT22 (En→Zh)", 0.6217),
        RankingSet("wmt_generalMT2022_zhen_mqm", "data/wmt_generalMT2022_zhen_avgmqm_group_test.parquet",
                "GenMT22 (Zh→En)", 0.6600),
        RankingSet("wmt_generalMT2022_ende_mqm", "data/wmt_generalMT2022_ende_avgmqm_group_test.parquet",
                "GenMT22 (En→De)", 0.6104),
        RankingSet("wmt_generalMT2022_enru_mqm", "data/wmt_generalMT2022_enru_avgmqm_group_test.parquet",
                "GenMT22 (En→Ru)", 0.6667),
        RankingSet("seedx_challenge_ranking", "data/seedx_challenge.ranking.max_bleurt.parquet", "Seed-X-Challenge",
                0.7039),
    ),
    published_average=0.6401,
)

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (TOWERBLOCKS, MT_RANKING_METRIC_TEST)}


def locate_sets(preset: Preset, path: Path) -> dict[RankingSet, Path]:
    """The preset's test sets found at ``path`` and their files, in the preset's order.

    ``path`` is the downloaded dataset repository, a folder holding the sets' files (its ``data/``
    folder, or a folder of scored runs, whose files keep the input's names), or one file: a set's
    own (by name), or any file for a preset of one set (a scored output may be named anything).
    A folder is searched by file name without suffix, so parquet and JSON Lines both count.
    """
    if path.is_file():
        for ranking_set in preset.sets:
            if path.stem == ranking_set.stem:
                return {ranking_set: path}
        if len(preset.sets) == 1:
            return {preset.sets[0]: path}
        raise DatasetError(
            f"{path}: not one of the files of preset {preset.name} ({', '.join(s.stem for s in preset.sets)}); "
            "give the folder that holds them"
        )
    if not path.is_dir():
        raise DatasetError(f"{path}: no such file or directory")
    found: dict[RankingSet, Path] = {}
    for ranking_set in preset.sets:
        for folder in (path / Path(ranking_set.path).parent, path):
            matches = sorted(
                file for file in folder.glob(f"{ranking_set.stem}.*")
                if file.is_file() and file.stem == ranking_set.stem and file.suffix.lower() in SUFFIXES
            ) if folder.is_dir() else []
            if len(matches) > 1:
                raise DatasetError(f"{folder}: {', '.join(m.name for m in matches)} are the same test set; keep one")
            if matches:
                found[ranking_set] = matches[0]
                break
    if not found:
        raise DatasetError(
            f"{path}: none of the files of preset {preset.name} ({', '.join(s.path for s in preset.sets)}); "
            f"download them with `hf download {preset.repo_id} --repo-type dataset --local-dir DIR` and give DIR"
        )
    return found
