"""The dataset side of ``grrm score`` without a scorer: rows to groups, result columns, clashing
column names, parquet and JSON Lines parts, and the partial output a killed run leaves."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster.protocol.schema import GroupResult, Usage
from grrm_cli import columns as cols
from grrm_cli.dataset import RESULT_TYPES, DatasetError, InputRow, PartWriter, count_rows, detect_format, read_rows
from grrm_cli.progress import Progress
from grrm_cli.resume import OrderedOutput, ResumeError, WorkDir

GROUP = {"source": "Hi", "candidates": ["Hallo", "Servus"], "src_lang": "en", "trg_lang": "de"}


def test_a_row_becomes_a_group_under_renamed_columns():
    mapping = cols.ColumnMapping(candidates="mt_texts", source="src_text")
    group, problem = cols.to_group({"src_text": "Hi", "mt_texts": ["Hallo", "Servus"], "src_lang": "en",
                                    "trg_lang": "de", "group_id": 17}, mapping)
    assert problem is None and group.candidates == ["Hallo", "Servus"] and group.group_id == "17"
    fixed = cols.ColumnMapping(src_lang_value="en", trg_lang_value="de")
    group, problem = cols.to_group({"source": "Hi", "candidates": ["a", "b"]}, fixed)
    assert problem is None and (group.src_lang, group.trg_lang) == ("en", "de")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({**GROUP, "mt_texts": "Hallo"}, "mt_texts: Input should be a valid list"),
        ({**GROUP, "mt_texts": ["Hallo"]}, "mt_texts: List should have at least 2 items"),
        ({**GROUP, "mt_texts": ["Hallo", 5]}, "mt_texts[1]: Input should be a valid string"),
        ({**GROUP, "mt_texts": ["Hallo", "  "]}, "mt_texts: Value error, candidates[1] must not be empty"),
        ({**GROUP, "mt_texts": ["a", "b"], "src_lang": "xx"}, "src_lang: Value error, unknown language code"),
        ({"mt_texts": ["a", "b"], "src_lang": "en"}, "source: missing or null; trg_lang: missing or null"),
    ],
)
def test_a_bad_row_names_the_dataset_column_and_the_problem(values, expected):
    group, problem = cols.to_group(values, cols.ColumnMapping(candidates="mt_texts"))
    assert group is None and problem.startswith(expected), problem


def test_result_columns_of_a_verdict_a_failure_and_a_bad_row():
    verdict = GroupResult(scores=[3, 9], ranking="B > A", valid=True, attempts=2, usage=Usage(prompt_tokens=5, completion_tokens=7))
    assert cols.result_fields(verdict) == {
        "scores": [3, 9], "rewards": None, "ranking": "B > A", "valid": True, "failure": None, "error": None,
        "attempts": 2, "prompt_tokens": 5, "completion_tokens": 7,
    }  # a service without a recipe: no rewards, no parts
    # With a recipe: the rewards, and one column per part, each candidate's value (null where it has none).
    composed = verdict.model_copy(update={"rewards": [0.03, 0.05], "components": [
        {"grrm": 0.03, "bleu": 0.4}, {"grrm": 0.09, "overlong": -0.04}]})
    fields = cols.result_fields(composed)
    assert fields["rewards"] == [0.03, 0.05]
    assert {name: value for name, value in fields.items() if cols.is_component_column(name)} == {
        "component_bleu": [0.4, None], "component_grrm": [0.03, 0.09], "component_overlong": [None, -0.04]}
    flagged = cols.result_fields(GroupResult(valid=False, failure="parse_failed", error="no verdict", attempts=2))
    assert flagged["scores"] is None and flagged["failure"] == "parse_failed" and flagged["attempts"] == 2
    bad = cols.bad_row_fields("candidates: Input should be a valid list")
    assert bad["valid"] is False and bad["failure"] == "bad_row" and bad["error"].startswith("candidates")
    assert list(bad) == list(cols.RESULT_COLUMNS) == list(RESULT_TYPES)


def test_input_columns_that_clash_with_result_columns_are_kept_under_a_new_name():
    assert cols.kept_name("scores") == "input_scores"
    assert cols.kept_name("input_scores") == "input_input_scores"  # never lands on another kept name
    assert cols.kept_name("reference_scores") == "reference_scores" and cols.kept_name("source") == "source"
    assert cols.kept_name("component_bleu") == "input_component_bleu" and cols.kept_name("rewards") == "input_rewards"
    row = {"source": "Hi", "scores": [1, 2], "input_scores": [3, 4], "valid": "yes"}
    out = cols.output_row(row, cols.bad_row_fields("x"))
    assert out["input_scores"] == [1, 2] and out["input_input_scores"] == [3, 4] and out["input_valid"] == "yes"
    assert out["scores"] is None and out["valid"] is False
    assert cols.renamed_columns(list(row)) == {"scores": "input_scores", "input_scores": "input_input_scores", "valid": "input_valid"}


def test_a_rows_reference_and_notes_go_with_its_group_and_a_half_pair_is_a_bad_row_naming_it():
    context = {"ref_text": "Hallo!", "ref_lang": "de", "notes": "informal"}
    group, problem = cols.to_group({**GROUP, **context}, cols.ColumnMapping())
    assert problem is None and (group.ref_text, group.ref_lang, group.notes) == ("Hallo!", "de", "informal")
    # Other column names; nulls (a JSON null, a parquet null) are no reference at all.
    renamed = cols.ColumnMapping(ref_text="reference", ref_lang="reference_lang", notes="glossary")
    group, _ = cols.to_group({**GROUP, "reference": "Hallo!", "reference_lang": "de", "glossary": None}, renamed)
    assert (group.ref_text, group.ref_lang, group.notes) == ("Hallo!", "de", None)
    group, _ = cols.to_group({**GROUP, "ref_text": None, "ref_lang": None}, cols.ColumnMapping())
    assert group.ref_text is None
    # Scored without references (grrm eval's second pass): the notes still go.
    group, _ = cols.to_group({**GROUP, **context}, cols.ColumnMapping(references=False))
    assert (group.ref_text, group.ref_lang, group.notes) == (None, None, "informal")
    group, problem = cols.to_group({**GROUP, "ref_text": "Hallo!"}, cols.ColumnMapping())
    assert group is None and "ref_text: given without ref_lang" in problem


def test_the_recipes_part_columns_follow_the_result_columns_in_every_part_and_the_merged_output(tmp_path):
    from grrm_cli.dataset import merge_parts

    verdict = GroupResult(scores=[3, 9], valid=True, rewards=[0.3, 0.9], components=[{"grrm": 0.3}, {"grrm": 0.9}])
    first = cols.output_row(GROUP, cols.result_fields(verdict))
    bad = cols.output_row(GROUP, cols.bad_row_fields("x"))
    later = cols.output_row(GROUP, cols.result_fields(verdict.model_copy(update={
        "components": [{"grrm": 0.3, "bleu": 0.5}, {"grrm": 0.9, "bleu": 0.25}]})))
    writer = PartWriter("parquet")
    writer.write(tmp_path / "p1.parquet", [first, bad])
    writer.write(tmp_path / "p2.parquet", [later])
    merge_parts([tmp_path / "p1.parquet", tmp_path / "p2.parquet"], tmp_path / "out.parquet", "parquet",
                pa.schema([]))
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == [*GROUP, *RESULT_TYPES, "component_bleu", "component_grrm"]
    assert table.column("component_grrm").to_pylist() == [[0.3, 0.9], None, [0.3, 0.9]]
    assert table.column("component_bleu").to_pylist() == [None, None, [0.5, 0.25]]
    assert table.column("rewards").to_pylist() == [[0.3, 0.9], None, [0.3, 0.9]]
    # A parquet input's own schema: the part columns join it.
    typed = PartWriter("parquet", schema=pa.schema([*(pa.field(n, pa.string()) for n in ("source", "src_lang",
                                                                                        "trg_lang")),
                                                   pa.field("candidates", pa.list_(pa.string())),
                                                   *(pa.field(n, t) for n, t in RESULT_TYPES.items())]))
    assert typed.table([first]).column_names[-1] == "component_grrm"


def test_a_dataset_without_the_group_columns_is_one_clear_error():
    with pytest.raises(cols.ColumnsError, match="no column 'candidates'.*--candidates-column"):
        cols.check_columns(["source", "mt_texts", "src_lang", "trg_lang"], cols.ColumnMapping(), "data.parquet")
    cols.check_columns(["source", "candidates"], cols.ColumnMapping(src_lang_value="en", trg_lang_value="de"), "x")


def test_json_lines_are_read_line_by_line_and_a_broken_line_is_one_row(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"a": 1}\n\nnot json\n[1, 2]\n{"a": "x", "b": [1]}\n')
    rows = [row for batch in read_rows(path, "jsonl", batch_rows=2) for row in batch]
    assert [row.index for row in rows] == [0, 1, 2, 3] and count_rows(path, "jsonl") == 4
    assert rows[0].values == {"a": 1} and rows[3].values == {"a": "x", "b": [1]}
    assert "line 3: not valid JSON" in rows[1].problem and "line 4: a JSON list" in rows[2].problem
    assert [row.index for batch in read_rows(path, "jsonl", start=2) for row in batch] == [2, 3]
    assert detect_format(path) == "jsonl" and detect_format(tmp_path / "x.parquet") == "parquet"
    with pytest.raises(DatasetError, match="cannot tell"):
        detect_format(tmp_path / "x.csv")


def test_parquet_is_read_in_batches_from_any_row(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"i": list(range(50))}), path, row_group_size=8)
    assert count_rows(path, "parquet") == 50
    for start in (0, 7, 8, 31, 49, 50):
        rows = [row for batch in read_rows(path, "parquet", batch_rows=5, start=start) for row in batch]
        assert [row.index for row in rows] == [row.values["i"] for row in rows] == list(range(start, 50))


def test_parquet_parts_from_json_lines_type_the_group_columns_and_refuse_mixed_others(tmp_path):
    writer = PartWriter("parquet", fixed_types={"candidates": pa.list_(pa.string())}, text_columns=frozenset({"group_id"}))
    rows = [
        cols.output_row({"group_id": 7, "candidates": ["a", "b"], "note": None}, cols.bad_row_fields("x")),
        cols.output_row({"group_id": "g", "candidates": "not a list", "note": 1}, cols.bad_row_fields("y")),
    ]
    writer.write(tmp_path / "part.parquet", rows)
    table = pq.read_table(tmp_path / "part.parquet")
    assert table.column("group_id").to_pylist() == ["7", "g"]
    assert table.column("candidates").to_pylist() == [["a", "b"], None]  # the wrong-typed value: null
    assert table.schema.field("scores").type == pa.list_(pa.int64())  # typed even when every row is invalid
    with pytest.raises(DatasetError, match="column 'note'.*JSON Lines output"):
        writer.table([{"note": "text"}])  # int before, text now: no parquet type holds both
    with pytest.raises(DatasetError, match="column 'mixed'"):
        PartWriter("parquet").table([{"mixed": [1]}, {"mixed": "x"}])


def finished(index: int, values: dict | None = None) -> tuple[InputRow, dict]:
    return InputRow(index, values or {"i": index}), {**cols.bad_row_fields(f"row {index}"), "attempts": index}


def test_rows_finished_out_of_order_are_written_in_order_and_journaled_at_once(tmp_path):
    work = WorkDir(tmp_path / "out.jsonl")
    work.start({"input": "x"})
    output = OrderedOutput(work, PartWriter("jsonl"), "jsonl", start=0, part_rows=2, part_s=3600)
    for index in (1, 3, 0):
        output.finish(*finished(index))
    # Rows 0 and 1 form a part; 3 waits for 2 and stays in the (rewritten) journal.
    assert [p.name for _, _, p in work.parts()] == ["part-000000000000-000000000002.jsonl"]
    assert set(work.journaled(beyond=output.committed)) == {3}
    output.finish(*finished(2))
    output.finish(*finished(4))
    output.close()
    assert work.committed_rows() == 5 and work.journaled(beyond=5) == {}
    output.merge("jsonl", pa.schema([]))
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["i"] for line in lines] == [0, 1, 2, 3, 4] and not work.path.exists()


def test_a_killed_run_leaves_complete_parts_and_a_journal_a_rerun_can_read(tmp_path):
    work = WorkDir(tmp_path / "out.parquet")
    work.start({"input": "x"})
    output = OrderedOutput(work, PartWriter("parquet"), "parquet", start=0, part_rows=2, part_s=3600)
    for index in (0, 1, 3, 4):
        output.finish(*finished(index))
    # Killed here (no close): a half-written part and a cut journal line are what a kill can leave.
    (work.path / "part-000000000002-000000000004.parquet.tmp").write_bytes(b"PAR1 half")
    with open(work.journal_path, "ab") as journal:
        journal.write(b'{"row": 5, "fie')
    rerun = WorkDir(tmp_path / "out.parquet")
    assert rerun.committed_rows() == 2
    rerun.remove_unfinished_writes()
    assert not list(rerun.path.glob("*.tmp")) and rerun.committed_rows() == 2
    assert sorted(rerun.journaled(beyond=2)) == [3, 4] and rerun.journaled(beyond=2)[4]["attempts"] == 4


def test_partial_output_of_another_input_or_other_columns_is_not_continued(tmp_path):
    work = WorkDir(tmp_path / "out.jsonl")
    work.start({"input": "a.jsonl", "columns": {"candidates": "candidates"}})
    work.check({"input": "b.jsonl", "columns": {"candidates": "candidates"}})  # nothing written yet: restarts
    output = OrderedOutput(work, PartWriter("jsonl"), "jsonl", start=0, part_rows=10, part_s=3600)
    output.finish(*finished(1))  # journaled only
    output.close()
    with pytest.raises(ResumeError, match="input: was 'b.jsonl', now 'c.jsonl'"):
        work.check({"input": "c.jsonl", "columns": {"candidates": "candidates"}})
    work.check({"input": "b.jsonl", "columns": {"candidates": "candidates"}})


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_with_rate_and_eta_on_a_terminal_and_silent_otherwise():
    terminal = _Terminal()
    progress = Progress(total=100, done=20, stream=terminal)
    progress.started -= 10  # 10 s ago
    progress.advance(30)
    progress.advance(10, scored_here=False)  # resumed rows count as done, not in the rate
    line = progress.line()
    assert "60/100" in line and "60%" in line and "3.0 groups/s" in line and "ETA 0m13s" in line
    progress.close()
    assert terminal.getvalue().startswith("\r[") and terminal.getvalue().endswith("\n")
    piped = io.StringIO()  # not a terminal: nothing, not even at the end
    quiet = Progress(total=100, stream=piped)
    quiet.advance(50)
    quiet.close()
    assert piped.getvalue() == ""
