"""Datasets on disk: parquet and JSON Lines, read and written in batches (never whole in memory).

Parquet is read with pyarrow batch by batch (``ParquetFile.iter_batches``). JSON Lines are parsed
line by line: pyarrow's JSON reader rejects a whole block at the first value whose type differs
from the rows before it, and such a row must become one flagged bad row, not a failed run.
Output is written in parts (one file per batch of finished rows, each written to a temporary
name and renamed into place, so a part on disk is always complete) and merged at the end.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from grrm_cli.columns import is_component_column

Format = Literal["parquet", "jsonl"]
FORMATS: tuple[str, ...] = ("parquet", "jsonl")
SUFFIXES: dict[str, Format] = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
EXTENSIONS: dict[Format, str] = {"parquet": ".parquet", "jsonl": ".jsonl"}

# Arrow types of the result columns (explicit: a batch of invalid rows must not infer `null`).
RESULT_TYPES: dict[str, pa.DataType] = {
    "scores": pa.list_(pa.int64()),
    "rewards": pa.list_(pa.float64()),
    "ranking": pa.string(),
    "valid": pa.bool_(),
    "failure": pa.string(),
    "error": pa.string(),
    "attempts": pa.int64(),
    "prompt_tokens": pa.int64(),
    "completion_tokens": pa.int64(),
}
# The type of a recipe part's column (grrm_cli/columns.py: component_<name>), written after RESULT_TYPES'.
COMPONENT_TYPE = pa.list_(pa.float64())


def component_columns(names: Sequence[str]) -> list[str]:
    """The recipe parts' result columns among ``names``, in the order they are written (by name)."""
    return sorted({name for name in names if is_component_column(name)})


class DatasetError(ValueError):
    """A dataset that cannot be read or written as asked; the message names the file or column."""


@dataclass
class InputRow:
    """One row of a dataset: its position (0-based, over the whole dataset) and its columns."""

    index: int
    values: dict[str, Any]
    # Why the row could not be read (a JSON Lines line that is not a JSON object).
    problem: str | None = None


def detect_format(path: Path, given: str | None = None) -> Format:
    """The format ``given``, else the one the name says (``.parquet``, ``.jsonl``), else a directory's files'."""
    if given:
        if given not in FORMATS:
            raise DatasetError(f"format: {given!r} is not one of {', '.join(FORMATS)}")
        return given  # type: ignore[return-value]
    if path.suffix.lower() in SUFFIXES:
        return SUFFIXES[path.suffix.lower()]
    if path.is_dir():
        found = {SUFFIXES[p.suffix.lower()] for p in path.iterdir() if p.suffix.lower() in SUFFIXES}
        if len(found) == 1:
            return found.pop()
    raise DatasetError(
        f"{path}: cannot tell parquet from JSON Lines by the name; name it .parquet or .jsonl, or pass the format"
    )


def dataset_files(path: Path, fmt: Format) -> list[Path]:
    """The files of a dataset: the file itself, or a directory's files of that format in name order."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and SUFFIXES.get(p.suffix.lower()) == fmt)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file or directory")
    return [path]


def parquet_schema(path: Path) -> pa.Schema | None:
    """The schema of a parquet dataset (its first file), or None when it has no files."""
    files = dataset_files(path, "parquet")
    return pq.read_schema(files[0]) if files else None


def count_rows(path: Path, fmt: Format) -> int:
    """Rows in a dataset: parquet metadata, or non-blank lines (one streaming pass) for JSON Lines."""
    if fmt == "parquet":
        return sum(pq.ParquetFile(file).metadata.num_rows for file in dataset_files(path, fmt))
    rows = 0
    for file in dataset_files(path, fmt):
        with open(file, "rb") as lines:
            rows += sum(1 for line in lines if line.strip())
    return rows


def read_rows(
    path: Path, fmt: Format, *, batch_rows: int = 1024, columns: Sequence[str] | None = None, start: int = 0
) -> Iterator[list[InputRow]]:
    """The rows from position ``start`` on, in batches of at most ``batch_rows``.

    ``columns`` keeps only those columns (parquet reads only them); a JSON Lines row lacking one
    simply lacks the key.
    """
    reader = _read_parquet if fmt == "parquet" else _read_jsonl
    batch: list[InputRow] = []
    for row in reader(path, batch_rows, columns, start):
        batch.append(row)
        if len(batch) >= batch_rows:
            yield batch
            batch = []
    if batch:
        yield batch


def _read_parquet(path: Path, batch_rows: int, columns: Sequence[str] | None, start: int) -> Iterator[InputRow]:
    offset = 0  # position of the current file's first row in the dataset
    for file in dataset_files(path, "parquet"):
        parquet = pq.ParquetFile(file)
        metadata = parquet.metadata
        row_groups, first = [], offset
        for group in range(metadata.num_row_groups):
            rows_in_group = metadata.row_group(group).num_rows
            if first + rows_in_group > start or row_groups:
                row_groups.append(group)
            else:
                first += rows_in_group  # a row group wholly before `start` is not read
        index = first
        if row_groups:
            for record_batch in parquet.iter_batches(batch_size=batch_rows, row_groups=row_groups, columns=columns):
                for values in record_batch.to_pylist():
                    if index >= start:
                        yield InputRow(index, values)
                    index += 1
        offset += metadata.num_rows


def _read_jsonl(path: Path, batch_rows: int, columns: Sequence[str] | None, start: int) -> Iterator[InputRow]:
    index = 0
    for file in dataset_files(path, "jsonl"):
        with open(file, "rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue  # blank lines are not rows
                if index >= start:
                    yield _parse_line(index, line, number, file, columns)
                index += 1


def _parse_line(index: int, line: bytes, number: int, file: Path, columns: Sequence[str] | None) -> InputRow:
    try:
        values = json.loads(line)
    except ValueError as error:
        return InputRow(index, {}, f"{file.name} line {number}: not valid JSON ({error}): {_preview(line)}")
    if not isinstance(values, dict):
        return InputRow(index, {}, f"{file.name} line {number}: a JSON {type(values).__name__}, not an object")
    if columns is not None:
        values = {column: values[column] for column in columns if column in values}
    return InputRow(index, values)


def _preview(line: bytes, limit: int = 120) -> str:
    text = line.decode("utf-8", errors="replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."


# -- writing ---------------------------------------------------------------------------------------


@dataclass
class PartWriter:
    """Writes batches of output rows as complete files (temporary name, fsync, rename).

    Parquet needs one type per column: ``schema`` (known from a parquet input) fixes them all;
    otherwise ``fixed_types`` fixes some (the group's columns: a bad row's wrong-typed value is
    written as null there, its error says what it was) and the rest are inferred from the values
    and must agree across parts. Integers in ``text_columns`` are written as their decimal text
    (group ids: JSON Lines often mix numeric and text ids; the service saw the text).
    """

    fmt: Format
    schema: pa.Schema | None = None
    fixed_types: dict[str, pa.DataType] = field(default_factory=dict)
    text_columns: frozenset[str] = frozenset()
    _seen: pa.Schema | None = None

    def write(self, path: Path, rows: Sequence[dict[str, Any]]) -> None:
        """Write ``rows`` to ``path`` atomically."""
        temporary = path.with_name(path.name + ".tmp")
        if self.fmt == "jsonl":
            with open(temporary, "wb") as out:
                out.write(b"".join(json_line(row) for row in rows))
                _sync(out)
        else:
            table = self.table(rows)
            pq.write_table(table, temporary)
            with open(temporary, "rb+") as written:
                _sync(written)
        os.replace(temporary, path)
        sync_directory(path.parent)

    def table(self, rows: Sequence[dict[str, Any]]) -> pa.Table:
        """The rows as one Arrow table (raises DatasetError for a column parquet cannot hold)."""
        parts = component_columns([name for row in rows for name in row])
        if self.schema is not None:
            # The recipe's parts are known from the answers only: their columns join the input's schema.
            schema = pa.schema([*self.schema, *(pa.field(name, COMPONENT_TYPE) for name in parts)])
            return pa.Table.from_pylist(list(rows), schema=schema)
        names = list(dict.fromkeys(name for row in rows for name in row
                                   if name not in RESULT_TYPES and not is_component_column(name)))
        arrays, fields = [], []
        for name in [*names, *RESULT_TYPES, *parts]:
            values = [row.get(name) for row in rows]
            wanted = RESULT_TYPES.get(name) or self.fixed_types.get(name) or (COMPONENT_TYPE if name in parts else None)
            if name in self.text_columns:
                values = [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in values]
                wanted = pa.string()
            if wanted is not None:
                array = pa.array([value if _fits(value, wanted) else None for value in values], type=wanted)
            else:
                try:
                    array = pa.array(values)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
                    raise _mixed_types(name, error) from None
            arrays.append(array)
            fields.append(pa.field(name, array.type))
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        self._seen = table.schema if self._seen is None else self._agree(table.schema)
        return table

    def _agree(self, schema: pa.Schema) -> pa.Schema:
        """The schema of every part so far; a column whose type changed names itself."""
        try:
            return unify([self._seen, schema])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            for new in schema:
                old = self._seen.field(new.name) if new.name in self._seen.names else new
                try:
                    pa.unify_schemas([pa.schema([old]), pa.schema([new])], promote_options="permissive")
                except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
                    raise _mixed_types(new.name, error) from None
            raise


def _mixed_types(name: str, error: Exception) -> DatasetError:
    return DatasetError(
        f"column {name!r}: its values have different types ({error}); a parquet column holds one type: "
        "write JSON Lines output (-o OUTPUT.jsonl) to keep every value as it is"
    )


def _fits(value: Any, wanted: pa.DataType) -> bool:
    if value is None:
        return True
    if pa.types.is_string(wanted):
        return isinstance(value, str)
    if pa.types.is_boolean(wanted):
        return isinstance(value, bool)
    if pa.types.is_integer(wanted):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_list(wanted):
        return isinstance(value, list) and all(_fits(item, wanted.value_type) for item in value)
    return True


def unify(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """One schema for parts written separately (ints widen to floats, nulls to any type); result columns last,
    the recipe's parts after them (a part first seen in a later file is null before it)."""
    merged = pa.unify_schemas(list(schemas), promote_options="permissive")
    inputs = [f for f in merged if f.name not in RESULT_TYPES and not is_component_column(f.name)]
    results = [merged.field(name) for name in [*RESULT_TYPES, *component_columns(merged.names)] if name in merged.names]
    return pa.schema(inputs + results)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order (missing ones null) and types."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def merge_parts(parts: Sequence[Path], output: Path, fmt: Format, empty_schema: pa.Schema) -> None:
    """Concatenate part files, in order, into ``output`` (written to a temporary name, then renamed)."""
    temporary = output.with_name(output.name + ".tmp")
    if fmt == "jsonl":
        with open(temporary, "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, out)
            _sync(out)
    else:
        schema = unify([pq.read_schema(part) for part in parts]) if parts else empty_schema
        with pq.ParquetWriter(temporary, schema) as writer:
            for part in parts:
                writer.write_table(conform(pq.read_table(part), schema))
        with open(temporary, "rb+") as written:
            _sync(written)
    os.replace(temporary, output)
    sync_directory(output.parent)


def json_line(row: dict[str, Any]) -> bytes:
    """One JSON Lines line (UTF-8, non-JSON values from parquet as text)."""
    return (json.dumps(row, ensure_ascii=False, default=_json_value) + "\n").encode("utf-8")


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _sync(handle) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
