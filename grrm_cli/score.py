"""``grrm score INPUT -o OUTPUT``: score every group of a dataset, resumably.

Rows are read in batches, sent with at most ``--concurrency`` groups in flight, and written as
they finish (:mod:`grrm_cli.resume`): a rerun of the same command after a crash or Ctrl-C scores
only the rows not yet written. A row that holds no valid group is written with ``valid: false``,
``failure: bad_row`` and the reason; the run goes on. ``--ray`` hands the same work to Ray Data
(:mod:`grrm_cli.ray_data`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from cluster.protocol.schema import DEFAULT_TENANT, TENANT_PATTERN
from grrm_cli import columns as cols
from grrm_cli.client_options import CLIENT_DEFAULTS, add_retry_options, add_token_option
from grrm_cli.dataset import (
    RESULT_TYPES,
    DatasetError,
    Format,
    InputRow,
    PartWriter,
    count_rows,
    detect_format,
    parquet_schema,
    read_rows,
)
from grrm_cli.progress import Progress, Summary
from grrm_cli.output_lock import OutputLocked, output_lock
from grrm_cli.resume import OrderedOutput, ResumeError, WorkDir, input_identity
from grrm_cli.scorers import GroupScoring, InProcessScoring, ScoringStopped, ServiceScoring, SetupError
from grrm_client.config import ClientConfig

# Groups in flight (grrm eval scores as grrm score does).
CONCURRENCY = 16
# A dataset job has no training step waiting on it: a group gets twice a trainer's attempts before its row
# is written as failed (a rerun would redo the whole file's failures).
MAX_ATTEMPTS = 2 * CLIENT_DEFAULTS.max_attempts

EXAMPLES = """\
examples:
  grrm score data/demo_groups.jsonl -o scored.parquet --url http://127.0.0.1:8000
  grrm score train.parquet -o scored.parquet --app grrm --candidates-column mt_texts
  grrm score data/demo_groups.jsonl -o scored.jsonl --config deployments/local.yaml
  grrm score groups/ -o scored/ --ray --app grrm      # folders of parquet files, on the Ray cluster

Rerun the same command after a crash or Ctrl-C: rows already written are kept, the rest are
scored. Partial output lives in OUTPUT.parts/ until the run completes. One run writes an output at
a time (OUTPUT.lock): a second one on the same output is refused, naming the first.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm score``."""
    parser = subparsers.add_parser(
        "score",
        help="score every group of a parquet or JSON Lines dataset",
        description=(
            "Score every group (a source and its candidate translations) of a dataset and write the\n"
            "dataset back with the columns scores, rewards, ranking, valid, failure, error, attempts,\n"
            "prompt_tokens and completion_tokens added, then one column per part of the service's reward\n"
            "recipe, component_<name> (each candidate's value before weighting). A row's reference\n"
            "translation and notes, where it has them, go with its group. A row that holds no valid group\n"
            "is written with valid false, failure bad_row and the reason in error."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", type=str, metavar="INPUT", help="a .parquet or .jsonl file (or, with --ray, a folder)")
    parser.add_argument("-o", "--output", required=True, metavar="OUTPUT", help="a .parquet or .jsonl file (with --ray: a folder)")

    where = parser.add_argument_group("where to score (exactly one)")
    target = where.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="base URL of a running service, e.g. http://127.0.0.1:8000")
    target.add_argument("--app", metavar="NAME", help="a Serve application on the current Ray cluster, e.g. grrm")
    target.add_argument(
        "--config", type=Path, metavar="FILE",
        help="a Serve config file: score in this process with its engine and scoring settings (no Ray)",
    )
    where.add_argument("--ray", action="store_true", help="read, score and write with Ray Data (needs --app)")
    where.add_argument("--address", help="Ray cluster to join for --app/--ray (default: RAY_ADDRESS or the local one)")
    add_token_option(where, used_with="--url")
    where.add_argument(
        "--tenant", default=DEFAULT_TENANT, metavar="NAME",
        help="who this job is on a shared service (metered and fairly served as one; default: %(default)s)",
    )

    add_column_options(parser)

    files = parser.add_argument_group("files")
    files.add_argument("--input-format", choices=["parquet", "jsonl"], help="when the name does not say")
    files.add_argument("--output-format", choices=["parquet", "jsonl"], help="when the name does not say")
    files.add_argument("--overwrite", action="store_true", help="replace OUTPUT (and discard partial output)")
    files.add_argument("--batch-rows", type=int, default=1024, metavar="N", help="rows read at once (default: %(default)s)")
    files.add_argument(
        "--part-rows", type=int, default=1024, metavar="N",
        help="finished rows per part file of the partial output (default: %(default)s)",
    )
    files.add_argument(
        "--part-seconds", type=float, default=30.0, metavar="S",
        help="write a part at least this often while rows finish (default: %(default)s)",
    )
    files.add_argument("--summary-json", type=Path, metavar="FILE", help="also write the summary as JSON")

    run = parser.add_argument_group("run")
    run.add_argument("--concurrency", type=int, default=CONCURRENCY, metavar="N",
                     help="groups in flight (default: %(default)s)")
    add_retry_options(run, max_attempts=MAX_ATTEMPTS)
    run.add_argument(
        "--ray-workers", type=int, default=2, metavar="N",
        help="Ray Data actors calling the service, each with --concurrency groups in flight (default: %(default)s)",
    )
    run.add_argument(
        "--finish-within-s", type=float, metavar="S",
        help="announce the rows left to the service's autoscaling as work to finish within S seconds, so the pool "
             "grows for them (withdrawn when the run ends; --url or --app only)",
    )
    run.add_argument(
        "--trace", metavar="FILE",
        help="record this run's trace for grrm plan --trace: JSON, when each group was sent and its engine tokens, "
             "rewritten as each burst of groups ends and at the end (--url or --app only)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    parser.set_defaults(handler=main)
    return parser


def add_column_options(parser: argparse.ArgumentParser) -> None:
    """The options naming the dataset columns that hold a group (``grrm score``'s and ``grrm profile``'s)."""
    names = parser.add_argument_group("input columns")
    defaults = cols.ColumnMapping()
    names.add_argument("--source-column", default=defaults.source, metavar="NAME", help="default: %(default)s")
    names.add_argument(
        "--candidates-column", default=defaults.candidates, metavar="NAME",
        help="a list of strings (default: %(default)s; GRRM's own data: mt_texts)",
    )
    names.add_argument("--src-lang-column", default=defaults.src_lang, metavar="NAME", help="default: %(default)s")
    names.add_argument("--trg-lang-column", default=defaults.trg_lang, metavar="NAME", help="default: %(default)s")
    names.add_argument("--group-id-column", default=defaults.group_id, metavar="NAME", help="optional (default: %(default)s)")
    names.add_argument("--src-lang", metavar="LANG", help="source language of rows without a source language column")
    names.add_argument("--trg-lang", metavar="LANG", help="target language of rows without a target language column")
    names.add_argument("--ref-text-column", default=defaults.ref_text, metavar="NAME",
                       help="a reference translation, optional (default: %(default)s; with --ref-lang-column)")
    names.add_argument("--ref-lang-column", default=defaults.ref_lang, metavar="NAME",
                       help="the reference's language, optional (default: %(default)s)")
    names.add_argument("--notes-column", default=defaults.notes, metavar="NAME",
                       help="notes for the model (terminology, style), optional (default: %(default)s)")
    names.add_argument("--without-references", action="store_true",
                       help="send no row's reference (notes still go): to compare with scoring with them")


def column_mapping(args: argparse.Namespace) -> cols.ColumnMapping:
    """The column options (:func:`add_column_options`) as a mapping."""
    return cols.ColumnMapping(
        source=args.source_column,
        candidates=args.candidates_column,
        src_lang=args.src_lang_column,
        trg_lang=args.trg_lang_column,
        group_id=args.group_id_column,
        src_lang_value=args.src_lang,
        trg_lang_value=args.trg_lang,
        ref_text=args.ref_text_column,
        ref_lang=args.ref_lang_column,
        notes=args.notes_column,
        references=not args.without_references,
    )


@dataclass(frozen=True)
class ScoreJob:
    """A validated ``grrm score`` command."""

    input: Path
    output: Path
    input_format: Format
    output_format: Format
    mapping: cols.ColumnMapping
    concurrency: int
    batch_rows: int
    part_rows: int
    part_seconds: float
    overwrite: bool
    progress: bool
    finish_within_s: float | None = None  # announce the rows left as work due within this (None: announce nothing)

    def identity(self) -> dict[str, Any]:
        """What partial output must match to be continued."""
        return {
            **input_identity(self.input, self.input_format),
            "output_format": self.output_format,
            "columns": self.mapping.describe(),
        }


def job_from_args(args: argparse.Namespace) -> ScoreJob:
    """Check the command line once; errors name the option."""
    for option in ("concurrency", "batch_rows", "part_rows", "max_attempts", "ray_workers"):
        if getattr(args, option) < 1:
            raise SetupError(f"--{option.replace('_', '-')}: must be at least 1")
    if not re.fullmatch(TENANT_PATTERN, args.tenant):
        raise SetupError(f"--tenant: {args.tenant!r} is not a tenant name (letters, digits, '_', '.', '-', at most 64, "
                         "starting with a letter or digit)")
    if args.finish_within_s is not None:
        if not args.finish_within_s > 0:
            raise SetupError("--finish-within-s: must be above 0 seconds")
        if args.config is not None or args.ray:
            raise SetupError("--finish-within-s: needs a service's pool to scale (--url or --app, without --ray)")
    if args.trace is not None and (args.config is not None or args.ray):
        # Ray Data's workers are clients of their own: each would record a part of the run into one file.
        raise SetupError("--trace: records one client's requests to a service (--url or --app, without --ray)")
    if args.ray and not args.app:
        raise SetupError("--ray: needs --app NAME (Ray Data workers call the application's Serve handle)")
    source = Path(args.input)
    output = Path(args.output)
    if not args.ray and source.resolve() == output.resolve():
        raise SetupError("-o: OUTPUT must not be INPUT")
    input_format = detect_format(source, args.input_format)
    output_format = detect_format(output, args.output_format) if (args.output_format or output.suffix) else input_format
    return ScoreJob(
        input=source,
        output=output,
        input_format=input_format,
        output_format=output_format,
        mapping=column_mapping(args),
        concurrency=args.concurrency,
        batch_rows=args.batch_rows,
        part_rows=args.part_rows,
        part_seconds=args.part_seconds,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        finish_within_s=args.finish_within_s,
    )


def scoring_from_args(args: argparse.Namespace) -> GroupScoring:
    """The scorer the command names (``--url``, ``--app`` or ``--config``)."""
    if args.config is not None:
        return InProcessScoring(args.config)
    client = ClientConfig(
        tenant=args.tenant,
        transport="http" if args.url else "handle",
        http_url=args.url or ClientConfig().http_url,
        app_name=args.app or ClientConfig().app_name,
        token_env=args.token_env,
        deadline_s=args.deadline_s,
        max_attempts=args.max_attempts,
        trace_path=args.trace,
    )
    return ServiceScoring(client, ray_address=args.address)


def part_writer(job: ScoreJob, input_schema: pa.Schema | None) -> PartWriter:
    """How parts are written: the input's own types when it is parquet, else inferred per column."""
    if job.output_format == "jsonl":
        return PartWriter("jsonl")
    if input_schema is not None:
        fields = [pa.field(cols.kept_name(f.name), f.type) for f in input_schema]
        return PartWriter("parquet", schema=pa.schema(fields + [pa.field(n, t) for n, t in RESULT_TYPES.items()]))
    mapping = job.mapping
    fixed = {
        cols.kept_name(mapping.source): pa.string(),
        cols.kept_name(mapping.candidates): pa.list_(pa.string()),
        cols.kept_name(mapping.src_lang): pa.string(),
        cols.kept_name(mapping.trg_lang): pa.string(),
    }
    return PartWriter("parquet", fixed_types=fixed, text_columns=frozenset({cols.kept_name(mapping.group_id)}))


async def score_dataset(job: ScoreJob, scoring: GroupScoring) -> Summary:
    """Score what the output does not hold yet, then merge it into OUTPUT; returns the summary."""
    started = time.monotonic()
    input_schema = parquet_schema(job.input) if job.input_format == "parquet" else None
    if input_schema is not None:
        cols.check_columns(input_schema.names, job.mapping, str(job.input))
    work = WorkDir(job.output)
    if job.overwrite:
        work.discard()
    elif job.output.exists() and not work.exists():
        raise SetupError(f"-o: {job.output} exists; pass --overwrite to replace it")
    identity = job.identity()
    if work.exists():
        work.check(identity)
        work.remove_unfinished_writes()
    else:
        work.start(identity)
    committed = work.committed_rows()
    journaled = work.journaled(committed)
    resumed = committed + len(journaled)

    writer = part_writer(job, input_schema)
    empty = writer.schema or pa.schema([pa.field(n, t) for n, t in RESULT_TYPES.items()])
    show_progress = job.progress and sys.stderr.isatty()
    # Read once, for the progress bar and the announcement alike (a large input takes a while to count).
    rows_in_input = count_rows(job.input, job.input_format) if show_progress or job.finish_within_s else None
    total = rows_in_input if show_progress else None
    progress = Progress(total, done=committed, enabled=show_progress)
    output = OrderedOutput(work, writer, job.output_format, start=committed, part_rows=job.part_rows,
                           part_s=job.part_seconds)
    # The groups this run still scores (a row is a group), announced once the scorer is up.
    left = rows_in_input - resumed if job.finish_within_s and rows_in_input is not None else 0
    run = _Run(job, scoring, output, journaled, progress, announce_groups=left)
    try:
        await run.rows(read_rows(job.input, job.input_format, batch_rows=job.batch_rows, start=committed))
    finally:
        output.close()
        progress.close()
        await run.close()
    output.merge(job.output_format, empty)
    ended = time.monotonic()
    scoring_from = run.scorer_ready or started
    return Summary.of_output(
        job.output, job.output_format, resumed=resumed, scored_now=run.finished, seconds=ended - scoring_from,
        startup_seconds=scoring_from - started, scorer=run.described, renamed=run.renamed,
    )


class _Run:
    """One pass over the rows: bounded concurrency, a bounded reorder window, the first fatal error stops it."""

    def __init__(self, job: ScoreJob, scoring: GroupScoring, output: OrderedOutput, journaled: dict, progress: Progress,
                 announce_groups: int = 0):
        self.job = job
        self.announce_groups = announce_groups
        self.announced = False
        self.scoring = scoring
        self.output = output
        self.journaled = journaled
        self.progress = progress
        self.slots = asyncio.Semaphore(job.concurrency)
        # Rows may finish this far ahead of the oldest unfinished one (bounds what waits in memory).
        self.window = 8 * job.concurrency + 64
        self.advanced = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        self.fatal: BaseException | None = None
        self.started = False
        self.scorer_ready: float | None = None  # when the scorer had started (engine loaded, service checked)
        self.described = ""
        self.finished = 0  # rows written by this run
        self.renamed: dict[str, str] = {}
        self._columns_checked = job.input_format == "parquet"

    async def rows(self, batches) -> None:
        iterator = iter(batches)
        try:
            while self.fatal is None:
                batch = await asyncio.to_thread(next, iterator, None)
                if batch is None:
                    break
                self._see_columns(batch)
                for row in batch:
                    if not await self._row(row):
                        break
            if self.tasks:
                await asyncio.gather(*self.tasks)
        finally:
            for task in self.tasks:
                task.cancel()  # interrupted or stopped: unfinished rows are scored by the rerun
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.fatal is not None:
            raise self.fatal

    def _see_columns(self, batch: list[InputRow]) -> None:
        present = list(dict.fromkeys(column for row in batch for column in row.values))
        if not self._columns_checked:
            cols.check_columns(present, self.job.mapping, f"{self.job.input} (its first rows)")
            self._columns_checked = True
        self.renamed.update(cols.renamed_columns(present))

    async def _row(self, row: InputRow) -> bool:
        while row.index - self.output.next_row >= self.window and self.fatal is None:
            self.advanced.clear()
            await self.advanced.wait()
        if self.fatal is not None:
            return False
        if row.index in self.journaled:
            self.output.finish(row, self.journaled.pop(row.index), journal=False)
            self.progress.advance(scored_here=False)
            return True
        group, problem = (None, row.problem) if row.problem else cols.to_group(row.values, self.job.mapping)
        if group is None:
            self._finish(row, cols.bad_row_fields(problem or "not a group"))
            return True
        await self.slots.acquire()
        if self.fatal is not None:
            self.slots.release()
            return False
        if not self.started:
            self.started = True
            self.described = await self.scoring.start()
            self.scorer_ready = time.monotonic()
            if self.announce_groups > 0 and self.job.finish_within_s:
                self.announced = await self.scoring.announce(self.announce_groups, self.job.finish_within_s)
        task = asyncio.create_task(self._score(row, group))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _score(self, row: InputRow, group) -> None:
        try:
            fields = await self.scoring.score(group)
            self._finish(row, fields)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the first failure stops the run, reported once
            if self.fatal is None:
                self.fatal = error
            self.advanced.set()
        finally:
            self.slots.release()

    def _finish(self, row: InputRow, fields: dict[str, Any]) -> None:
        self.output.finish(row, fields)
        self.finished += 1
        self.progress.advance()
        self.advanced.set()

    async def close(self) -> None:
        if self.started:
            if self.announced:  # done or stopped: the pool need not hold replicas for the rest
                await self.scoring.announce(0, 1.0)
            await self.scoring.close()


def main(args: argparse.Namespace) -> int:
    """Run ``grrm score``; exit 0 when the output is complete, 1 when scoring stopped, 2 on bad usage."""
    try:
        job = job_from_args(args)
        with output_lock(job.output):  # one writer per output: a second run is refused, naming the first
            if args.ray:
                from grrm_cli.ray_data import score_with_ray_data

                summary = score_with_ray_data(job, app_name=args.app, address=args.address, workers=args.ray_workers,
                                              max_attempts=args.max_attempts, deadline_s=args.deadline_s,
                                              tenant=args.tenant)
            else:
                summary = asyncio.run(score_dataset(job, scoring_from_args(args)))
    except (SetupError, DatasetError, ResumeError, OutputLocked, cols.ColumnsError) as error:
        print(f"grrm score: error: {error}", file=sys.stderr)
        return 2
    except ScoringStopped as error:
        print(
            f"grrm score: stopped: {error}\nRows finished so far are kept in {args.output}.parts/; "
            "rerun the same command to continue.",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"\ngrrm score: interrupted; rerun the same command to continue ({args.output}.parts/ keeps "
              "every finished row)", file=sys.stderr)
        return 130
    print(summary.text())
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary.as_dict(), indent=2) + "\n")
    return 0
