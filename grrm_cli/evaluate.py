"""``grrm eval PREDICTED --reference-column NAME``: ranking accuracy of predicted scores.

The accuracy of one group is :func:`cluster.gqm.ranking_accuracy` (docs/gqm.md section 6: the
share of candidate pairs whose order, ties included, the prediction gets right; a group without
predicted scores, i.e. an invalid verdict, scores 0). Reported as the mean over groups, overall
and per language pair, with a 95% confidence interval: the percentile bootstrap over groups
(groups resampled with replacement). Per-group accuracies take few distinct values, so the tally
keeps a count per value, and a resample of n groups is one multinomial draw over those values:
the same distribution as resampling rows, in memory proportional to the distinct values.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cluster import gqm
from grrm_cli.columns import BAD_ROW
from grrm_cli.dataset import DatasetError, detect_format, parquet_schema, read_rows

CI_METHOD = "percentile bootstrap over groups"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm eval``."""
    parser = subparsers.add_parser(
        "eval",
        help="ranking accuracy of predicted scores against reference scores",
        description=(
            "GRRM's ranking accuracy (docs/gqm.md section 6) of the predicted scores in PREDICTED (e.g. the "
            "output of grrm score) against reference scores in another column: the share of candidate pairs "
            "ordered as the reference orders them (ties included), averaged over groups; a group without "
            "predicted scores counts 0. Overall and per language pair, with a 95%% confidence interval "
            "(percentile bootstrap over groups). Rows that grrm score flagged as bad_row, and rows whose "
            "reference is not a list of at least 2 numbers, are skipped and counted."
        ),
    )
    parser.add_argument("predicted", metavar="PREDICTED", help="a .parquet or .jsonl file (or a folder of them)")
    parser.add_argument("--reference-column", required=True, metavar="NAME", help="the reference scores, one per candidate")
    parser.add_argument("--predicted-column", default="scores", metavar="NAME", help="default: %(default)s")
    parser.add_argument("--src-lang-column", default="src_lang", metavar="NAME", help="default: %(default)s")
    parser.add_argument("--trg-lang-column", default="trg_lang", metavar="NAME", help="default: %(default)s")
    parser.add_argument("--format", choices=["parquet", "jsonl"], help="when the name does not say")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--resamples", type=int, default=10_000, metavar="N", help="bootstrap resamples (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    parser.set_defaults(handler=main)
    return parser


@dataclass
class AccuracyTally:
    """Per-group accuracies of one slice of the data, as counts per distinct value."""

    counts: Counter = field(default_factory=Counter)
    invalid_predictions: int = 0

    def add(self, accuracy: float, *, invalid: bool) -> None:
        self.counts[accuracy] += 1
        self.invalid_predictions += invalid

    @property
    def groups(self) -> int:
        return sum(self.counts.values())

    def mean(self) -> float:
        return sum(value * count for value, count in self.counts.items()) / self.groups

    def interval(self, rng: np.random.Generator, resamples: int, level: float = 0.95) -> tuple[float, float]:
        """Percentile bootstrap interval of the mean over groups."""
        values = np.array(list(self.counts), dtype=float)
        weights = np.array(list(self.counts.values()), dtype=float)
        n = int(weights.sum())
        means = []
        chunk = max(1, 2_000_000 // max(len(values), 1))  # bounds the (resamples x values) draw matrix
        for done in range(0, resamples, chunk):
            draws = rng.multinomial(n, weights / n, size=min(chunk, resamples - done))
            means.append(draws @ values / n)
        tail = (1 - level) / 2 * 100
        low, high = np.percentile(np.concatenate(means), [tail, 100 - tail])
        return float(low), float(high)


@dataclass
class Evaluation:
    """The tallies of a dataset: overall, per language pair, and the rows left out."""

    overall: AccuracyTally = field(default_factory=AccuracyTally)
    by_pair: dict[str, AccuracyTally] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)

    def add_row(self, values: dict[str, Any], args: argparse.Namespace) -> None:
        """Score one row's prediction against its reference (or count why it is left out)."""
        if values.get("failure") == BAD_ROW:
            self.skipped["bad_row"] += 1
            return
        reference = values.get(args.reference_column)
        predicted = values.get(args.predicted_column)
        try:
            accuracy = gqm.ranking_accuracy(reference, predicted)
        except gqm.GQMInputError as error:
            column = {"reference_scores": args.reference_column, "predicted_scores": args.predicted_column}
            self.skipped[f"{column.get(error.field, error.field)}: {error.problem}"] += 1
            return
        except TypeError:
            self.skipped["scores: not all numbers"] += 1
            return
        invalid = predicted is None
        self.overall.add(accuracy, invalid=invalid)
        src, trg = values.get(args.src_lang_column), values.get(args.trg_lang_column)
        if src is not None and trg is not None:
            self.by_pair.setdefault(f"{src}-{trg}", AccuracyTally()).add(accuracy, invalid=invalid)

    def report(self, resamples: int, seed: int) -> dict[str, Any]:
        """The evaluation as plain data (``--json``); keys holding accuracies contain ``accuracy``."""
        rng = np.random.default_rng(seed)

        def describe(tally: AccuracyTally) -> dict[str, Any]:
            low, high = tally.interval(rng, resamples)
            return {
                "groups": tally.groups,
                "accuracy": tally.mean(),
                "accuracy_ci95": [low, high],
                "invalid_predictions": tally.invalid_predictions,
            }

        return {
            **describe(self.overall),
            "ci_method": f"{CI_METHOD} ({resamples} resamples, seed {seed})",
            "by_language_pair": {pair: describe(self.by_pair[pair]) for pair in sorted(self.by_pair)},
            "skipped_rows": dict(sorted(self.skipped.items())),
        }


def evaluate(path: Path, args: argparse.Namespace) -> Evaluation:
    """Stream the dataset's relevant columns into an :class:`Evaluation`."""
    fmt = detect_format(path, args.format)
    wanted = [args.predicted_column, args.reference_column, args.src_lang_column, args.trg_lang_column, "failure"]
    wanted = list(dict.fromkeys(wanted))
    if fmt == "parquet":
        schema = parquet_schema(path)
        present = schema.names if schema is not None else []
        for column in (args.predicted_column, args.reference_column):
            if column not in present:
                raise DatasetError(f"{path} has no column {column!r} (columns: {', '.join(present)})")
        wanted = [column for column in wanted if column in present]
    evaluation = Evaluation()
    seen: set[str] = set()
    for batch in read_rows(path, fmt, columns=wanted, batch_rows=8192):
        for row in batch:
            if row.problem:
                evaluation.skipped["unreadable row"] += 1
                continue
            seen.update(row.values)
            evaluation.add_row(row.values, args)
    for column in (args.predicted_column, args.reference_column):
        if column not in seen and evaluation.overall.groups == 0:
            raise DatasetError(f"{path}: no row has the column {column!r}")
    if evaluation.overall.groups == 0:
        raise DatasetError(f"{path}: no row can be evaluated ({dict(evaluation.skipped) or 'no rows'})")
    return evaluation


def table(report: dict[str, Any], args: argparse.Namespace) -> str:
    """The report for people."""
    rows = [(pair, tally) for pair, tally in report["by_language_pair"].items()] + [("all", report)]
    width = max(len("language pair"), *(len(pair) for pair, _ in rows))
    lines = [
        f"ranking accuracy of {args.predicted_column!r} against {args.reference_column!r} (docs/gqm.md section 6)",
        f"95% CI: {report['ci_method']}",
        "",
        f"{'language pair'.ljust(width)}  {'groups':>7}  {'accuracy':>8}  95% CI",
    ]
    for pair, tally in rows:
        low, high = tally["accuracy_ci95"]
        lines.append(f"{pair.ljust(width)}  {tally['groups']:>7}  {tally['accuracy']:>8.4f}  [{low:.4f}, {high:.4f}]")
    skipped = report["skipped_rows"]
    lines += ["", f"invalid predictions (counted as 0): {report['invalid_predictions']}"]
    if skipped:
        lines.append(f"rows skipped: {sum(skipped.values())} (" + ", ".join(f"{k}: {v}" for k, v in skipped.items()) + ")")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run ``grrm eval``; exit 2 when the dataset cannot be evaluated."""
    if args.resamples < 1:
        print("grrm eval: error: --resamples: must be at least 1", file=sys.stderr)
        return 2
    try:
        evaluation = evaluate(Path(args.predicted), args)
    except DatasetError as error:
        print(f"grrm eval: error: {error}", file=sys.stderr)
        return 2
    report = evaluation.report(args.resamples, args.seed)
    print(json.dumps(report, indent=2) if args.json else table(report, args))
    return 0
