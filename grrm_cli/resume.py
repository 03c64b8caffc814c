"""Partial output that survives a crash: part files for the finished prefix, a journal for the rest.

``grrm score ... -o OUTPUT`` keeps its work in ``OUTPUT.parts/`` until it is done:

* ``manifest.json``: which input and which column options the parts belong to (a rerun with
  another input or other options is refused instead of mixing two datasets);
* ``part-<first>-<end>.<ext>``: output rows ``first .. end-1``, complete (written under a
  temporary name, fsynced, renamed); together they cover the rows ``0 .. committed-1``;
* ``journal.jsonl``: the result columns of every row finished beyond that prefix (rows finish out
  of order), one line each, appended and flushed as each row finishes. It is rewritten with only
  the rows still beyond the prefix after each new part.

Every finished row is thus on disk as soon as it is finished: a killed run loses only the rows it
was still waiting for. A rerun starts after the committed prefix, takes journalled rows as they
are (they are not sent again) and scores the rest. When every row is in a part, the parts are
merged into ``OUTPUT`` (temporary name, then rename) and the folder is removed. A crash at any
point leaves either complete parts and a journal whose last line may be cut (ignored), or a
complete ``OUTPUT``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from grrm_cli.columns import output_row
from grrm_cli.dataset import EXTENSIONS, Format, InputRow, PartWriter, dataset_files, merge_parts, sync_directory

_PART = re.compile(r"^part-(\d{12})-(\d{12})\.(parquet|jsonl)$")
MANIFEST_VERSION = 1


class ResumeError(RuntimeError):
    """Partial output that cannot be continued as asked (another input, other options, damage)."""


def input_identity(path: Path, fmt: Format) -> dict[str, Any]:
    """What identifies an input between runs: its resolved path, size and modification time."""
    files = dataset_files(path, fmt)
    stats = [file.stat() for file in files]
    return {
        "input": str(path.resolve()),
        "input_files": len(files),
        "input_bytes": sum(stat.st_size for stat in stats),
        "input_mtime_ns": max((stat.st_mtime_ns for stat in stats), default=0),
    }


class WorkDir:
    """The ``OUTPUT.parts/`` folder of one output."""

    def __init__(self, output: Path):
        self.output = output
        self.path = output.with_name(output.name + ".parts")
        self.manifest_path = self.path / "manifest.json"
        self.journal_path = self.path / "journal.jsonl"

    def exists(self) -> bool:
        """Whether partial output from an earlier run is here."""
        return self.manifest_path.is_file()

    def start(self, identity: Mapping[str, Any]) -> None:
        """Begin a new run's folder (an existing one is continued only through :meth:`check`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        temporary = self.manifest_path.with_name("manifest.json.tmp")
        temporary.write_text(json.dumps({"version": MANIFEST_VERSION, **identity}, indent=2))
        os.replace(temporary, self.manifest_path)
        sync_directory(self.path)

    def check(self, identity: Mapping[str, Any]) -> None:
        """Refuse to continue partial output made from another input or with other options."""
        try:
            recorded = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as error:
            raise ResumeError(f"{self.manifest_path}: unreadable ({error}); delete {self.path} to start over") from None
        expected = {"version": MANIFEST_VERSION, **identity}
        differing = sorted(key for key in expected.keys() | recorded.keys() if expected.get(key) != recorded.get(key))
        if differing and not self.parts() and not self.journaled(0):
            self.start(identity)  # nothing was written under the old options: nothing to protect
            return
        if differing:
            details = "; ".join(f"{key}: was {recorded.get(key)!r}, now {expected.get(key)!r}" for key in differing)
            raise ResumeError(
                f"{self.path} holds partial output of another run ({details}); rerun with the same input and "
                f"options to continue it, or delete it (or pass --overwrite) to start over"
            )

    def discard(self) -> None:
        """Delete the folder and everything in it."""
        shutil.rmtree(self.path, ignore_errors=True)

    def remove_unfinished_writes(self) -> None:
        """Delete the temporary files a killed run was writing (before continuing its output)."""
        for path in self.path.glob("*.tmp"):
            path.unlink()

    def parts(self) -> list[tuple[int, int, Path]]:
        """Complete part files as (first row, end row, path), in row order."""
        found = []
        for path in self.path.iterdir():
            match = _PART.match(path.name)
            if match:
                found.append((int(match[1]), int(match[2]), path))
        found.sort()
        end = 0
        for first, last, path in found:
            if first != end:
                raise ResumeError(f"{self.path}: {path.name} does not follow row {end}; delete the folder to start over")
            end = last
        return found

    def committed_rows(self) -> int:
        """Rows 0 .. N-1 are in part files: N."""
        parts = self.parts()
        return parts[-1][1] if parts else 0

    def journaled(self, beyond: int) -> dict[int, dict[str, Any]]:
        """Result columns of the rows finished at or after ``beyond`` (a cut last line is ignored)."""
        results: dict[int, dict[str, Any]] = {}
        if not self.journal_path.is_file():
            return results
        with open(self.journal_path, "rb") as journal:
            for line in journal:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # the run was killed while writing this line
                if entry["row"] >= beyond:
                    results[entry["row"]] = entry["fields"]
        return results


class OrderedOutput:
    """Collects finished rows (in any order) and writes them in row order as parts of a :class:`WorkDir`.

    :meth:`finish` journals a row at once; rows join the current part when every row before them
    has finished, and a part is written every ``part_rows`` rows or ``part_s`` seconds.
    """

    def __init__(self, work: WorkDir, writer: PartWriter, fmt: Format, *, start: int, part_rows: int, part_s: float):
        self.work = work
        self.writer = writer
        self.extension = EXTENSIONS[fmt]
        self.committed = start  # rows before this are in part files
        self.next_row = start  # rows before this have finished (in memory or in parts)
        self.part_rows = part_rows
        self.part_s = part_s
        self._pending: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # finished out of order
        self._part: list[dict[str, Any]] = []
        self._part_started = time.monotonic()
        self._journal = open(work.journal_path, "ab")  # noqa: SIM115 - closed by close()

    def finish(self, row: InputRow, fields: dict[str, Any], *, journal: bool = True) -> None:
        """Record a finished row; ``journal=False`` for a row taken from the journal itself."""
        if journal:
            self._journal.write(json.dumps({"row": row.index, "fields": fields}, ensure_ascii=False).encode() + b"\n")
            self._journal.flush()  # in the OS now: survives this process being killed
        self._pending[row.index] = (row.values, fields)
        while self.next_row in self._pending:
            values, done = self._pending.pop(self.next_row)
            self._part.append(output_row(values, done))
            self.next_row += 1
        if len(self._part) >= self.part_rows or (self._part and time.monotonic() - self._part_started >= self.part_s):
            self.commit()

    def commit(self) -> None:
        """Write the rows finished in order so far as a part, then shorten the journal."""
        if not self._part:
            return
        first, end = self.committed, self.committed + len(self._part)
        self.writer.write(self.work.path / f"part-{first:012d}-{end:012d}{self.extension}", self._part)
        self.committed, self._part = end, []
        self._part_started = time.monotonic()
        self._rewrite_journal()

    def _rewrite_journal(self) -> None:
        # Only rows beyond the parts stay; a crash before the rename leaves the old journal, whose
        # extra rows (now in a part) a rerun skips.
        temporary = self.work.journal_path.with_name("journal.jsonl.tmp")
        with open(temporary, "wb") as journal:
            for index, (_, fields) in sorted(self._pending.items()):
                journal.write(json.dumps({"row": index, "fields": fields}, ensure_ascii=False).encode() + b"\n")
            journal.flush()
            os.fsync(journal.fileno())
        self._journal.close()
        os.replace(temporary, self.work.journal_path)
        sync_directory(self.work.path)
        self._journal = open(self.work.journal_path, "ab")  # noqa: SIM115

    def close(self) -> None:
        """Write what can be written and make the journal durable (also after an interruption)."""
        try:
            self.commit()
        finally:
            if not self._journal.closed:
                self._journal.flush()
                os.fsync(self._journal.fileno())
                self._journal.close()

    def merge(self, fmt: Format, empty_schema: pa.Schema) -> None:
        """Every row is in a part: merge them into the output and remove the folder."""
        merge_parts([path for _, _, path in self.work.parts()], self.work.output, fmt, empty_schema)
        self.work.discard()
