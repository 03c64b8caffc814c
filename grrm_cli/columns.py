"""From a dataset row to a group and from a verdict to output columns (pure: no I/O, no Ray).

A row holds a group in five columns whose names the user may change (:class:`ColumnMapping`), and
may hold a reference translation with its language and notes (optional columns: a row without them
sends none); every other column passes through. The output adds :data:`RESULT_COLUMNS` and one
column per part of the service's recipe, ``component_<name>`` (each candidate's value before
weighting, beside ``rewards``); an input column that already bears one of those names is kept under
:func:`kept_name` (``scores`` becomes ``input_scores``), never overwritten.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cluster.protocol.schema import GroupRequest, GroupResult
from cluster.protocol.members import RowContext

# What `grrm score` adds to every row, in this order (then the recipe's parts, COMPONENT_PREFIX + name).
RESULT_COLUMNS: tuple[str, ...] = (
    "scores",  # one integer per candidate, in candidate order; null unless valid
    "rewards",  # each candidate's reward by the service's recipe; null without a recipe's answer
    "ranking",  # the model's ranking line (`B > A = C`), when it wrote one
    "valid",
    "failure",  # why not valid: the service's reason, or `bad_row` for a row that is not a group
    "error",  # the failure in words, naming the field for a bad row
    "attempts",  # generations the scorer spent on the group (retries of unparseable answers)
    "prompt_tokens",
    "completion_tokens",
)
BAD_ROW = "bad_row"
# One column per recipe part: each candidate's value of it before weighting (null where it has none).
COMPONENT_PREFIX = "component_"
_CLASHING = re.compile(r"^(input_)*(" + "|".join(RESULT_COLUMNS) + "|" + COMPONENT_PREFIX + r".+)$")


def is_component_column(column: str) -> bool:
    """Whether ``column`` is a recipe part's result column (``component_<name>``)."""
    return column.startswith(COMPONENT_PREFIX)


def kept_name(column: str) -> str:
    """The output name of an input column: ``input_<name>`` when ``<name>`` clashes with a result column.

    Any name of the form ``input_..._scores`` moves one ``input_`` further too, so the mapping is
    one-to-one without looking at the other columns (JSON Lines reveal their columns row by row).
    """
    return f"input_{column}" if _CLASHING.match(column) else column


@dataclass(frozen=True)
class ColumnMapping:
    """Which input columns hold the group; fixed languages for datasets without language columns."""

    source: str = "source"
    candidates: str = "candidates"
    src_lang: str = "src_lang"
    trg_lang: str = "trg_lang"
    group_id: str = "group_id"
    # Used for rows without the language column (None: the column is required).
    src_lang_value: str | None = None
    trg_lang_value: str | None = None
    # Optional: a row without them (or with nulls) sends none.
    ref_text: str = "ref_text"
    ref_lang: str = "ref_lang"
    notes: str = "notes"
    references: bool = True  # False: the rows' references are not sent (grrm eval's pass without them)

    def field_column(self, field: str) -> str:
        """The dataset column behind a GroupRequest field (for error messages)."""
        return getattr(self, field, field)

    def describe(self) -> dict[str, str | None]:
        """The mapping as plain data (recorded with partial output, to refuse a resume with other columns)."""
        return dict(self.__dict__)


class ColumnsError(ValueError):
    """A dataset without the columns that hold its groups (a setup error, not a run of bad rows)."""


def required_columns(mapping: ColumnMapping) -> list[str]:
    """Columns a dataset must have (the languages only when no fixed value is given)."""
    languages = ((mapping.src_lang, mapping.src_lang_value), (mapping.trg_lang, mapping.trg_lang_value))
    return [mapping.source, mapping.candidates] + [column for column, fixed in languages if fixed is None]


def check_columns(present: list[str], mapping: ColumnMapping, where: str) -> None:
    """Raise :class:`ColumnsError` naming the missing columns and the options that name them."""
    missing = [column for column in required_columns(mapping) if column not in present]
    if missing:
        raise ColumnsError(
            f"{where} has no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(present) or 'none'}); "
            "name the columns with --source-column, --candidates-column, --src-lang-column, --trg-lang-column "
            "(or give --src-lang/--trg-lang)"
        )


def to_group(row: Mapping[str, Any], mapping: ColumnMapping) -> tuple[GroupRequest | None, str | None]:
    """The group a row holds, or None and the reason it holds none (naming the dataset column)."""
    missing = [
        column
        for column, fallback in (
            (mapping.source, None),
            (mapping.candidates, None),
            (mapping.src_lang, mapping.src_lang_value),
            (mapping.trg_lang, mapping.trg_lang_value),
        )
        if row.get(column) is None and fallback is None
    ]
    if missing:
        return None, "; ".join(f"{column}: missing or null" for column in missing)
    group_id = row.get(mapping.group_id)
    if isinstance(group_id, int) and not isinstance(group_id, bool):
        group_id = str(group_id)  # integer ids are common; the API's ids are strings
    fields = {
        "group_id": group_id,
        "source": row[mapping.source],
        "candidates": row[mapping.candidates],
        "src_lang": row.get(mapping.src_lang) if row.get(mapping.src_lang) is not None else mapping.src_lang_value,
        "trg_lang": row.get(mapping.trg_lang) if row.get(mapping.trg_lang) is not None else mapping.trg_lang_value,
        **row_context(row, mapping).fields(),
    }
    try:
        return GroupRequest.model_validate(fields), None
    except ValidationError as error:
        problems = []
        for item in error.errors():
            field, *rest = item["loc"] or ("row",)
            where = mapping.field_column(str(field)) + "".join(f"[{part}]" for part in rest)
            problems.append(f"{where}: {item['msg']}")
        return None, "; ".join(problems)


def row_context(row: Mapping[str, Any], mapping: ColumnMapping) -> RowContext:
    """A row's reference and notes (none where its columns are missing or null; no reference when
    ``mapping.references`` is off). A half pair stays one: the request refuses it, naming the field."""
    refs = (row.get(mapping.ref_text), row.get(mapping.ref_lang)) if mapping.references else (None, None)
    return RowContext.of(*refs, row.get(mapping.notes))


def result_fields(result: GroupResult | None, failure: str | None = None, error: str | None = None) -> dict[str, Any]:
    """The result columns of one row: the service's verdict, or a failure without one; then one column
    per part of the recipe's answer (``component_<name>``: each candidate's value, null where it has none)."""
    if result is None:
        return {
            "scores": None, "rewards": None, "ranking": None, "valid": False, "failure": failure, "error": error,
            "attempts": 0, "prompt_tokens": 0, "completion_tokens": 0,
        }
    parts = result.components or []
    names = sorted({name for candidate in parts for name in candidate})
    return {
        "scores": list(result.scores) if result.valid and result.scores is not None else None,
        "rewards": list(result.rewards) if result.rewards is not None else None,
        "ranking": result.ranking,
        "valid": bool(result.valid),
        "failure": result.failure,
        "error": result.error,
        "attempts": result.attempts,
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        **{COMPONENT_PREFIX + name: [candidate.get(name) for candidate in parts] for name in names},
    }


def bad_row_fields(problem: str) -> dict[str, Any]:
    """The result columns of a row that holds no valid group."""
    return result_fields(None, BAD_ROW, problem)


def output_row(row: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """Every input column (under its kept name) followed by the result columns."""
    return {**{kept_name(column): value for column, value in row.items()}, **fields}


def renamed_columns(columns: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The input columns that are kept under another name, and that name."""
    return {column: kept_name(column) for column in columns if kept_name(column) != column}
