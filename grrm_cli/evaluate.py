"""``grrm eval PATH...``: ranking accuracy of predicted scores, per test set and run, as GRRM reports it.

The accuracy of one group is :func:`cluster.gqm.ranking_accuracy` (docs/gqm.md section 6: the
share of candidate pairs whose order, ties included, the prediction gets right; a group without
predicted scores, i.e. an invalid verdict, scores 0). It is the metric of GRRM's own evaluation
(eval/run_ranking_acc_eval.py: ``compare_orderings`` of the predicted and reference rankings, an
unparsed answer 0), which averages over every (run, group) of a test set; with the same groups in
every run that is the mean over groups of each group's mean over runs, computed here. Reported
overall and per language pair with a 95% confidence interval: the percentile bootstrap over groups
(groups resampled with replacement). Per-group accuracies take few distinct values, so the tally
keeps a count per value, and a resample of n groups is one multinomial draw over those values:
the same distribution as resampling rows, in memory proportional to the distinct values.

With ``--preset`` (:mod:`grrm_cli.presets`) the columns are those of a published dataset and every
test set is reported apart, with GRRM's published number and, where GRRM publishes one, the
unweighted average over the sets (its interval from the sets' bootstrap means averaged draw by
draw). With ``--url``/``--app``/``--config`` the dataset is first scored by ``grrm score`` itself
(resumable, bad rows flagged), ``--runs`` times, into ``-o DIR/run-K/``; when rows of the dataset carry
a reference translation, each run is scored again without them (``grrm score --without-references``,
into ``DIR/run-K-without-references/``) and the report adds, over exactly the rows that have one, the
ranking accuracy with and without the references (``references``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cluster import gqm
from grrm_cli import score
from grrm_cli.columns import BAD_ROW, ColumnMapping, kept_name
from cluster.protocol.members import RowContext
from grrm_cli.dataset import EXTENSIONS, DatasetError, Format, InputRow, detect_format, parquet_schema, read_rows
from grrm_cli.presets import PRESETS, Preset, locate_sets
from grrm_cli.resume import WorkDir

CI_METHOD = "percentile bootstrap over groups"
EXAMPLES = """\
examples:
  grrm eval scored.parquet --reference-column reference_scores
  grrm eval --preset towerblocks-mt-ranking --url http://127.0.0.1:8000 --runs 4 -o runs/ TowerBlocks-MT-Ranking/
  grrm eval --preset mt-ranking-metric-test runs/run-1 runs/run-2    # scored runs, evaluated again

The acceptance check of a deployment against GRRM's published table: docs/scoring-datasets.md.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm eval``."""
    parser = subparsers.add_parser(
        "eval",
        help="ranking accuracy of predicted scores against reference scores",
        description=(
            "GRRM's ranking accuracy (docs/gqm.md section 6) of predicted scores (e.g. the output of grrm\n"
            "score) against reference scores in another column: the share of candidate pairs ordered as the\n"
            "reference orders them (ties included), averaged over groups and runs; a group without predicted\n"
            "scores counts 0. Overall and per language pair, with a 95% confidence interval (percentile\n"
            "bootstrap over groups). Rows that grrm score flagged as bad_row, and rows whose reference is not\n"
            "a list of at least 2 numbers, are skipped and counted. --preset reads one of GRRM's published\n"
            "test datasets and reports each of its test sets beside GRRM's published number; --url, --app\n"
            "or --config scores the dataset first."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH",
        help="scored datasets (.parquet or .jsonl files, or folders of them), one per run of the same groups; with "
             "--url/--app/--config one dataset to score",
    )
    parser.add_argument(
        "--preset", choices=sorted(PRESETS),
        help="a published GRRM test dataset: its columns, its test sets (files of PATH) and GRRM's numbers",
    )

    names = parser.add_argument_group("columns (a preset's defaults; the flags override them)")
    names.add_argument(
        "--reference-column", metavar="NAME",
        help="the reference scores, one per candidate (required without --preset); when scoring, as the input names "
             "it (grrm score keeps a column named scores as input_scores)",
    )
    names.add_argument("--predicted-column", default="scores", metavar="NAME", help="default: %(default)s")
    names.add_argument("--src-lang-column", metavar="NAME", help="default: src_lang")
    names.add_argument("--trg-lang-column", metavar="NAME", help="default: trg_lang")
    names.add_argument("--source-column", metavar="NAME", help="when scoring: the source text (default: source)")
    names.add_argument("--candidates-column", metavar="NAME", help="when scoring: the candidates (default: candidates)")
    names.add_argument("--ref-text-column", metavar="NAME",
                       help="when scoring: a reference translation, optional (default: ref_text); rows with one are "
                            "also scored without it, and both accuracies reported")
    names.add_argument("--ref-lang-column", metavar="NAME", help="when scoring: the reference's language (default: "
                                                                 "ref_lang)")
    names.add_argument("--notes-column", metavar="NAME", help="when scoring: notes for the model (default: notes)")

    scoring = parser.add_argument_group("score first, as grrm score does (at most one)")
    target = scoring.add_mutually_exclusive_group()
    target.add_argument("--url", help="base URL of a running service, e.g. http://127.0.0.1:8000")
    target.add_argument("--app", metavar="NAME", help="a Serve application on the current Ray cluster, e.g. grrm")
    target.add_argument("--config", type=Path, metavar="FILE",
                        help="a Serve config file's engine, in this process (starts it for every file and run)")
    scoring.add_argument("-o", "--output", type=Path, metavar="DIR",
                         help="where the scored runs go (DIR/run-K/); a rerun continues or reuses them")
    scoring.add_argument("--runs", type=int, default=1, metavar="N",
                         help="score every group N times and average, as GRRM's evaluation does (default: %(default)s)")
    scoring.add_argument("--concurrency", type=int, default=score.CONCURRENCY, metavar="N",
                         help="groups in flight (default: %(default)s)")

    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=["parquet", "jsonl"], help="when the name does not say")
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    out.add_argument("--resamples", type=int, default=10_000, metavar="N",
                     help="bootstrap resamples (default: %(default)s)")
    out.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    parser.set_defaults(handler=main)
    return parser


class UsageError(ValueError):
    """A command line that cannot be run as given; the message names the option."""


@dataclass(frozen=True)
class Columns:
    """The columns of a scored dataset that evaluation reads."""

    reference: str
    predicted: str = "scores"
    src_lang: str = "src_lang"
    trg_lang: str = "trg_lang"
    # Set: only the rows whose reference translation (this column) is not empty are evaluated.
    ref_text: str | None = None

    def wanted(self) -> list[str]:
        """The columns to read (``failure`` too: grrm score's bad rows are skipped, not scored 0)."""
        return list(dict.fromkeys([self.predicted, self.reference, self.src_lang, self.trg_lang, "failure",
                                   *([self.ref_text] if self.ref_text else [])]))


@dataclass(frozen=True)
class Scoring:
    """How ``grrm eval`` scores the dataset first: ``grrm score``'s target and input columns."""

    target: tuple[str, str]  # ("--url", URL), ("--app", NAME) or ("--config", FILE)
    output: Path
    runs: int
    concurrency: int
    input_columns: dict[str, str | None]  # grrm score's column option -> name (None: its default)

    @property
    def ref_text(self) -> str:
        """The input's column of reference translations (grrm score's default unless named)."""
        return self.input_columns.get("--ref-text-column") or ColumnMapping().ref_text


@dataclass(frozen=True)
class EvalJob:
    """A validated ``grrm eval`` command."""

    paths: tuple[Path, ...]
    columns: Columns
    preset: Preset | None
    scoring: Scoring | None
    fmt: str | None
    resamples: int
    seed: int


def job_from_args(args: argparse.Namespace) -> EvalJob:
    """Check the command line once and settle the columns; errors name the option."""
    for option in ("resamples", "runs", "concurrency"):
        if getattr(args, option) < 1:
            raise UsageError(f"--{option}: must be at least 1")
    preset = PRESETS[args.preset] if args.preset else None
    reference = args.reference_column or (preset.reference if preset else None)
    if reference is None:
        raise UsageError("--reference-column: required without --preset (the column of reference scores)")
    src_lang = args.src_lang_column or (preset.group.src_lang if preset else "src_lang")
    trg_lang = args.trg_lang_column or (preset.group.trg_lang if preset else "trg_lang")
    target = next(((flag, str(value)) for flag, value in (("--url", args.url), ("--app", args.app),
                                                         ("--config", args.config)) if value is not None), None)
    scoring = None
    if target is None:
        for option, value in (("--output", args.output), ("--source-column", args.source_column),
                              ("--candidates-column", args.candidates_column),
                              ("--ref-text-column", args.ref_text_column), ("--ref-lang-column", args.ref_lang_column),
                              ("--notes-column", args.notes_column)):
            if value is not None:
                raise UsageError(f"{option}: only when scoring (--url, --app or --config)")
        if args.runs != 1:
            raise UsageError("--runs: only when scoring (--url, --app or --config); give one scored PATH per run")
        # A preset reads grrm score's output of its dataset, which keeps the reference as input_scores.
        columns = Columns(reference=args.reference_column or kept_name(reference), predicted=args.predicted_column,
                          src_lang=src_lang, trg_lang=trg_lang)
    else:
        if len(args.paths) != 1:
            raise UsageError(f"{target[0]}: give one PATH, the dataset to score (more runs: --runs N)")
        if args.output is None:
            raise UsageError(f"--output: {target[0]} needs a folder for the scored runs")
        scoring = Scoring(
            target=target, output=args.output, runs=args.runs, concurrency=args.concurrency,
            input_columns={
                "--source-column": args.source_column or (preset.group.source if preset else None),
                "--candidates-column": args.candidates_column or (preset.group.candidates if preset else None),
                "--src-lang-column": src_lang,
                "--trg-lang-column": trg_lang,
                "--ref-text-column": args.ref_text_column,
                "--ref-lang-column": args.ref_lang_column,
                "--notes-column": args.notes_column,
            },
        )
        # The columns as grrm score writes them back (an input column named like a result column is renamed).
        columns = Columns(reference=kept_name(reference), predicted=args.predicted_column,
                          src_lang=kept_name(src_lang), trg_lang=kept_name(trg_lang))
    if columns.reference == columns.predicted:
        raise UsageError(f"--reference-column: {columns.reference!r} is the predicted column too")
    return EvalJob(paths=tuple(Path(p) for p in args.paths), columns=columns, preset=preset, scoring=scoring,
                   fmt=args.format, resamples=args.resamples, seed=args.seed)


# -- accuracy --------------------------------------------------------------------------------------


@dataclass
class AccuracyTally:
    """Per-group accuracies of one slice of the data, as counts per distinct value."""

    counts: Counter = field(default_factory=Counter)
    invalid_predictions: int = 0

    def add(self, accuracy: float, *, invalid: int = 0) -> None:
        """One group's accuracy (its mean over runs) and how many of its runs had no valid prediction."""
        self.counts[accuracy] += 1
        self.invalid_predictions += invalid

    @property
    def groups(self) -> int:
        return sum(self.counts.values())

    def mean(self) -> float:
        return sum(value * count for value, count in self.counts.items()) / self.groups

    def resample_means(self, rng: np.random.Generator, resamples: int) -> np.ndarray:
        """The mean accuracy of ``resamples`` bootstrap resamples of the groups."""
        values = np.array(list(self.counts), dtype=float)
        weights = np.array(list(self.counts.values()), dtype=float)
        n = int(weights.sum())
        means = []
        chunk = max(1, 2_000_000 // max(len(values), 1))  # bounds the (resamples x values) draw matrix
        for done in range(0, resamples, chunk):
            draws = rng.multinomial(n, weights / n, size=min(chunk, resamples - done))
            means.append(draws @ values / n)
        return np.concatenate(means)

    def interval(self, rng: np.random.Generator, resamples: int, level: float = 0.95) -> tuple[float, float]:
        """Percentile bootstrap interval of the mean over groups."""
        return percentile_interval(self.resample_means(rng, resamples), level)


def percentile_interval(means: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` share of bootstrap means."""
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


@dataclass
class Evaluation:
    """The tallies of one dataset (or test set): overall, per language pair, and the rows left out."""

    columns: Columns
    overall: AccuracyTally = field(default_factory=AccuracyTally)
    by_pair: dict[str, AccuracyTally] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)

    def add_group(self, runs: list[dict[str, Any]]) -> None:
        """Score one group's prediction in every run against its reference (or count why it is left out)."""
        columns = self.columns
        if columns.ref_text is not None and RowContext.of(runs[0].get(columns.ref_text)).ref_text is None:
            return  # the comparison with and without references reads the rows that have one only
        if any(values.get("failure") == BAD_ROW for values in runs):
            self.skipped["bad_row"] += 1
            return
        reference = runs[0].get(columns.reference)
        accuracies = []
        for values in runs:
            try:
                accuracies.append(gqm.ranking_accuracy(reference, values.get(columns.predicted)))
            except gqm.GQMInputError as error:
                column = {"reference_scores": columns.reference, "predicted_scores": columns.predicted}
                self.skipped[f"{column.get(error.field, error.field)}: {error.problem}"] += 1
                return
            except TypeError:
                self.skipped["scores: not all numbers"] += 1
                return
        accuracy = sum(accuracies) / len(accuracies)
        invalid = sum(values.get(columns.predicted) is None for values in runs)
        self.overall.add(accuracy, invalid=invalid)
        src, trg = runs[0].get(columns.src_lang), runs[0].get(columns.trg_lang)
        if src is not None and trg is not None:
            self.by_pair.setdefault(f"{src}-{trg}", AccuracyTally()).add(accuracy, invalid=invalid)

    def report(self, rng: np.random.Generator, resamples: int) -> tuple[dict[str, Any], np.ndarray]:
        """The evaluation as plain data (keys holding accuracies contain ``accuracy``) and the overall
        bootstrap means (for an average over test sets)."""
        means = self.overall.resample_means(rng, resamples)

        def describe(tally: AccuracyTally, draws: np.ndarray) -> dict[str, Any]:
            return {
                "groups": tally.groups,
                "accuracy": tally.mean(),
                "accuracy_ci95": list(percentile_interval(draws)),
                "invalid_predictions": tally.invalid_predictions,
            }

        return {
            **describe(self.overall, means),
            "by_language_pair": {
                pair: describe(self.by_pair[pair], self.by_pair[pair].resample_means(rng, resamples))
                for pair in sorted(self.by_pair)
            },
            "skipped_rows": dict(sorted(self.skipped.items())),
        }, means


# -- reading ---------------------------------------------------------------------------------------


def evaluate(runs: list[Path], columns: Columns, fmt: str | None = None) -> Evaluation:
    """Stream the runs of one dataset side by side (row i of every run is the same group) into an
    :class:`Evaluation`."""
    formats = [detect_format(path, fmt) for path in runs]
    for path, path_format in zip(runs, formats):
        _check_parquet_columns(path, path_format, columns)
    evaluation = Evaluation(columns)
    seen: set[str] = set()
    streams = [_rows(path, path_format, columns.wanted()) for path, path_format in zip(runs, formats)]
    for index, rows in enumerate(zip_longest(*streams)):
        if any(row is None for row in rows):
            counts = ", ".join(f"{path}: {'ends' if row is None else 'goes on'}" for path, row in zip(runs, rows))
            raise DatasetError(f"the runs differ in length at row {index} ({counts}); runs must score the same rows")
        if any(row.problem for row in rows):
            evaluation.skipped["unreadable row"] += 1
            continue
        reference = rows[0].values.get(columns.reference)
        for path, row in zip(runs[1:], rows[1:]):
            if not _same(row.values.get(columns.reference), reference):
                raise DatasetError(f"{path} row {index}: another {columns.reference!r} than {runs[0]}'s; "
                                   "runs must score the same rows")
        seen.update(rows[0].values)
        evaluation.add_group([row.values for row in rows])
    if evaluation.overall.groups == 0:
        for column in (columns.predicted, columns.reference):
            if column not in seen:
                raise DatasetError(f"{runs[0]}: no row has the column {column!r}{_unscored_hint(columns)}")
        raise DatasetError(f"{runs[0]}: no row can be evaluated ({dict(evaluation.skipped) or 'no rows'})")
    return evaluation


def _same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN (a reference may hold one; each read makes a new float object)."""
    return a == b or repr(a) == repr(b)


def _rows(path: Path, fmt: Format, columns: list[str]) -> Iterator[InputRow]:
    for batch in read_rows(path, fmt, columns=columns, batch_rows=8192):
        yield from batch


def _check_parquet_columns(path: Path, fmt: Format, columns: Columns) -> None:
    if fmt != "parquet":
        return  # JSON Lines reveal their columns row by row
    try:
        schema = parquet_schema(path)
    except pa.ArrowException as error:
        raise DatasetError(f"{path}: not readable as parquet ({error})") from None
    present = schema.names if schema is not None else []
    for column in (columns.predicted, columns.reference):
        if column not in present:
            raise DatasetError(
                f"{path} has no column {column!r} (columns: {', '.join(present)}){_unscored_hint(columns)}")


def _unscored_hint(columns: Columns) -> str:
    if columns.reference != kept_name(columns.predicted):
        return ""
    return (f"; is it scored? grrm score keeps the reference {columns.predicted!r} as {columns.reference!r} and adds "
            "the predicted one: score it first (--url, --app or --config, or grrm score)")


# -- scoring first ---------------------------------------------------------------------------------


WITHOUT_REFERENCES = "-without-references"  # the folder suffix of a run scored without the rows' references


@dataclass(frozen=True)
class ScoredRuns:
    """What :func:`score_runs` wrote: the runs, and the same runs scored without the rows' references
    (empty when no row has one)."""

    runs: tuple[Path, ...]
    without_references: tuple[Path, ...] = ()


def score_runs(job: EvalJob) -> ScoredRuns:
    """Score the dataset ``--runs`` times with ``grrm score`` into ``DIR/run-K/`` (and, where rows carry a
    reference translation, again without them into ``DIR/run-K-without-references/``); the run folders (a
    preset's sets under their published file names, where the preset finds them) or, without a preset,
    the scored files. A finished output is reused and a partial one continued, so a rerun of the
    command picks up where it stopped."""
    scoring = job.scoring
    assert scoring is not None
    source = job.paths[0]
    if job.preset is not None:
        files = {file: Path(ranking_set.path).stem for ranking_set, file in locate_sets(job.preset, source).items()}
    else:
        files = {source: source.stem}
    referenced = any(has_references(file, detect_format(file, job.fmt), scoring.ref_text) for file in files)
    passes = [("", [])] + ([(WITHOUT_REFERENCES, ["--without-references"])] if referenced else [])
    scored: dict[str, list[Path]] = {suffix: [] for suffix, _ in passes}
    for run in range(1, scoring.runs + 1):
        for suffix, options in passes:
            folder = scoring.output / f"run-{run}{suffix}"
            folder.mkdir(parents=True, exist_ok=True)
            for file, stem in files.items():
                output = folder / (stem + (file.suffix or EXTENSIONS[detect_format(file, job.fmt)]))
                scored[suffix].append(output)
                _score_file(job, file, output, f"run {run}{' without references' if suffix else ''}", options)
    if job.preset is not None:
        folders = {suffix: tuple(scoring.output / f"run-{run}{suffix}" for run in range(1, scoring.runs + 1))
                   for suffix in scored}
        return ScoredRuns(folders[""], folders.get(WITHOUT_REFERENCES, ()))
    return ScoredRuns(tuple(scored[""]), tuple(scored.get(WITHOUT_REFERENCES, ())))


def _score_file(job: EvalJob, file: Path, output: Path, run: str, options: list[str]) -> None:
    """``grrm score FILE -o OUTPUT`` as the job scores (``options`` added), unless OUTPUT is finished."""
    scoring = job.scoring
    assert scoring is not None
    if output.exists() and not WorkDir(output).exists():
        print(f"grrm eval: {run}: {output} is scored already", file=sys.stderr)
        return
    print(f"grrm eval: {run} of {scoring.runs}: scoring {file} into {output}", file=sys.stderr)
    argv = ["score", str(file), "-o", str(output), *scoring.target, "--concurrency", str(scoring.concurrency),
            *options]
    argv += [item for option, name in scoring.input_columns.items() if name for item in (option, name)]
    if job.fmt:
        argv += ["--input-format", job.fmt]
    # Parsed by grrm score's own parser and run by its own handler, so that scoring here is grrm score
    # (its checks, retries, resumable output, bad rows) and cannot drift from it.
    parser = argparse.ArgumentParser(prog="grrm")
    score.add_parser(parser.add_subparsers())
    command = parser.parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the evaluation (--json)
        status = command.handler(command)
    if status != 0:
        raise ScoringFailed(status, f"scoring {file} ({run}) ended with status {status}; rerun the same "
                                    f"command to continue (finished outputs stay in {scoring.output})")


def has_references(path: Path, fmt: Format, column: str) -> bool:
    """Whether any row of a dataset holds a reference translation in ``column``."""
    if fmt == "parquet":
        schema = parquet_schema(path)
        if schema is None or column not in schema.names:
            return False
    return any(RowContext.of(row.values.get(column)).ref_text is not None
               for row in _rows(path, fmt, [column]))


class ScoringFailed(RuntimeError):
    """grrm score did not finish a file (its own message says why); carries its exit status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# -- reports ---------------------------------------------------------------------------------------


def reference_comparison(runs: list[Path], without: list[Path], columns: Columns, fmt: str | None,
                         rng: np.random.Generator, resamples: int) -> dict[str, Any]:
    """The ranking accuracy of the rows that have a reference translation (``columns.ref_text``), scored
    with it (``runs``) and without it (``without``, the same rows), each with its bootstrap interval."""
    scored = {name: evaluate(paths, columns, fmt).overall
              for name, paths in (("with_references", runs), ("without_references", without))}
    return {"groups": scored["with_references"].groups,
            **{name: {"accuracy": tally.mean(), "accuracy_ci95": list(tally.interval(rng, resamples))}
               for name, tally in scored.items()}}


def report(job: EvalJob, runs: tuple[Path, ...], without: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Evaluate the runs: one dataset without a preset, else each of the preset's test sets found;
    ``without``: the same runs scored without the rows' references (the ``references`` comparison)."""
    rng = np.random.default_rng(job.seed)
    ci_method = f"{CI_METHOD} ({job.resamples} resamples, seed {job.seed})"
    referenced = replace(job.columns, ref_text=kept_name(job.scoring.ref_text)) if job.scoring and without else None
    if job.preset is None:
        data, _ = evaluate(list(runs), job.columns, job.fmt).report(rng, job.resamples)
        if referenced is not None:
            data["references"] = reference_comparison(list(runs), list(without), referenced, job.fmt, rng,
                                                      job.resamples)
        return {**data, "runs": len(runs), "ci_method": ci_method}
    preset = job.preset
    located = [locate_sets(preset, run) for run in runs]
    for run, found in zip(runs[1:], located[1:]):
        if set(found) != set(located[0]):
            raise DatasetError(f"{run} holds other test sets ({', '.join(s.name for s in found)}) than {runs[0]} "
                               f"({', '.join(s.name for s in located[0])}); every run must hold the same")
    sets: dict[str, Any] = {}
    draws = []
    located_without = [locate_sets(preset, run) for run in without]
    for ranking_set in located[0]:
        files = [found[ranking_set] for found in located]
        data, means = evaluate(files, job.columns, job.fmt).report(rng, job.resamples)
        if referenced is not None and has_references(files[0], detect_format(files[0], job.fmt), referenced.ref_text):
            data["references"] = reference_comparison(files, [found[ranking_set] for found in located_without],
                                                      referenced, job.fmt, rng, job.resamples)
        sets[ranking_set.name] = {"label": ranking_set.label, "files": [str(f) for f in files],
                                  "published_accuracy": ranking_set.published, **data}
        draws.append(means)
    result: dict[str, Any] = {
        "preset": preset.name, "dataset": preset.repo_id, "runs": len(runs), "ci_method": ci_method,
        "sets": sets, "sets_missing": [s.name for s in preset.sets if s.name not in sets],
    }
    if preset.published_average is not None:
        result["average"] = {
            "sets": len(sets),
            "accuracy": float(np.mean([data["accuracy"] for data in sets.values()])),
            "accuracy_ci95": list(percentile_interval(np.mean(draws, axis=0))),
            "published_accuracy": preset.published_average,
            # GRRM's Avg. is over all the preset's sets; over fewer it is another number.
            "comparable": len(sets) == len(preset.sets),
        }
    return result


def table(result: dict[str, Any], columns: Columns) -> str:
    """The report for people."""
    published = "preset" in result
    if published:
        rows = []
        for data in result["sets"].values():
            rows.append((data["label"], data, data["published_accuracy"]))
            if len(data["by_language_pair"]) > 1:
                rows += [(f"  {pair}", pair_data, None) for pair, pair_data in data["by_language_pair"].items()]
        if "average" in result:
            average = result["average"]
            rows.append((f"average of {average['sets']} sets", average, average["published_accuracy"]))
        first = "test set"
    else:
        rows = [(pair, data, None) for pair, data in result["by_language_pair"].items()] + [("all", result, None)]
        first = "language pair"
    width = max(len(first), *(len(name) for name, _, _ in rows))
    runs = f", {result['runs']} runs" if result["runs"] > 1 else ""
    title = f"ranking accuracy of {columns.predicted!r} against {columns.reference!r}{runs} (docs/gqm.md section 6)"
    if published:
        title = f"preset {result['preset']} ({result['dataset']}): " + title
    header = f"{first.ljust(width)}  {'groups':>7}  {'accuracy':>8}  "
    header += f"{'95% CI':<16}  GRRM paper" if published else "95% CI"
    lines = [title, f"95% CI: {result['ci_method']}", "", header]
    for name, data, paper in rows:
        low, high = data["accuracy_ci95"]
        groups = data.get("groups", "")
        line = f"{name.ljust(width)}  {groups:>7}  {data['accuracy']:>8.4f}  [{low:.4f}, {high:.4f}]"
        lines.append(line + (f"  {paper:>10.4f}" if paper is not None else ""))
    blocks = result["sets"].values() if published else [result]
    for name, data in (result["sets"].items() if published else [("", result)]):
        if "references" in data:
            compared = data["references"]
            lines += ["", f"{name + ': ' if name else ''}the {compared['groups']} groups with a reference translation"]
            for key, label in (("with_references", "with it"), ("without_references", "without it")):
                low, high = compared[key]["accuracy_ci95"]
                lines.append(f"  {label:<11} {compared[key]['accuracy']:.4f}  [{low:.4f}, {high:.4f}]")
    invalid = sum(data["invalid_predictions"] for data in blocks)
    skipped: Counter = Counter()
    for data in blocks:
        skipped.update(data["skipped_rows"])
    lines += ["", f"invalid predictions (counted as 0): {invalid}"]
    if skipped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items()))
        lines.append(f"rows skipped: {sum(skipped.values())} ({reasons})")
    if published and result["sets_missing"]:
        lines.append(f"test sets not found: {', '.join(result['sets_missing'])}"
                     + ("; the average covers the others and is not GRRM's" if "average" in result else ""))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run ``grrm eval``; exit 2 when it cannot evaluate as asked, grrm score's status when scoring stopped."""
    try:
        job = job_from_args(args)
        scored = score_runs(job) if job.scoring else ScoredRuns(job.paths)
        result = report(job, scored.runs, scored.without_references)
    except (UsageError, DatasetError, OSError) as error:  # OSError: -o cannot be made, a file cannot be read
        print(f"grrm eval: error: {error}", file=sys.stderr)
        return 2
    except ScoringFailed as error:
        print(f"grrm eval: stopped: {error}", file=sys.stderr)
        return error.status
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else table(result, job.columns))
    return 0
