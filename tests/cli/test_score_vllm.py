"""``grrm score`` for real: the tiny vLLM-CPU model in this process (``--config``), and the local
Serve application (deployments/local.yaml: 2 vLLM-CPU replicas) over HTTP (``--url``), through a
Serve handle (``--app``) and with Ray Data (``--ray``); a run killed with SIGKILL and rerun; bad
rows in every input. The tiny model's scores are meaningless: what is checked is that every row
comes back exactly once, in order, scored or flagged with its reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cluster import gqm
from cluster.tiny_model import ensure_tiny_model
from grrm_cli.dataset import read_rows
from grrm_cli.main import main
from grrm_cli.resume import WorkDir
from tests.conftest import LOCAL_APP

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
LOCAL_YAML = ROOT / "deployments" / "local.yaml"
APP = LOCAL_APP  # the session's deployment of local.yaml (tests/conftest.py)
# GRRM's own data keeps reference scores in `scores`: the output must keep them as `input_scores`.
DEMO = [
    {**{k: v for k, v in row.items() if k != "reference_scores"}, "scores": row["reference_scores"]}
    for row in map(json.loads, (ROOT / "data" / "demo_groups.jsonl").read_text().splitlines())
]
BAD = {
    "bad-one-candidate": ({"candidates": ["Hallo"]}, "candidates: List should have at least 2 items"),
    "bad-language": ({"src_lang": "xx"}, "src_lang: Value error, unknown language code"),
    "bad-no-source": ({"source": None}, "source: missing or null"),
}


BAD_TYPE_LINE = '{"group_id": "bad-type", "src_lang": "en", "trg_lang": "de", "source": "Hi", "candidates": "Hallo"}\n'


def bad_rows() -> list[dict]:
    base = {"src_lang": "en", "trg_lang": "de", "source": "Hi", "candidates": ["Hallo", "Servus"], "scores": [3, 4]}
    return [{**base, "group_id": group_id, **change} for group_id, (change, _) in BAD.items()]


def write_dataset(path: Path, rows: list[dict], extra_lines: str = "") -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows) + extra_lines)
    return path


def output_rows(path: Path) -> list[dict]:
    fmt = "parquet" if path.suffix == ".parquet" or (path.is_dir() and list(path.glob("*.parquet"))) else "jsonl"
    return [row.values for batch in read_rows(path, fmt) for row in batch]


def check_scored(rows: list[dict], sources: list[dict], extra_ids: tuple = ()) -> None:
    """Every input row once, in order; groups scored on the model's scale, bad rows flagged with their reason."""
    assert [row["group_id"] for row in rows] == [source["group_id"] for source in sources] + list(extra_ids)
    for source, row in zip(sources, rows):
        if source["group_id"] in BAD:
            assert (row["valid"], row["failure"], row["scores"]) == (False, "bad_row", None)
            assert row["error"].startswith(BAD[source["group_id"]][1]), row["error"]
            continue
        assert row["valid"] is True, row
        assert len(row["scores"]) == len(row["candidates"]) and all(0 <= s <= 10 for s in row["scores"])
        assert row["input_scores"] == source["scores"]  # the clashing input column, kept
        assert row["attempts"] >= 1 and row["prompt_tokens"] > 100 and row["completion_tokens"] > 0


def run_score(*argv: str, summary: Path) -> dict:
    assert main(["score", *argv, "--summary-json", str(summary)]) == 0
    return json.loads(summary.read_text())


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    """deployments/local.yaml with the tiny model built in a temporary directory."""
    directory = tmp_path_factory.mktemp("cli")
    model = ensure_tiny_model(directory / "tiny-grrm")
    document = yaml.safe_load(LOCAL_YAML.read_text())
    document["applications"][0]["args"]["engine"]["model"] = str(model)
    path = directory / "local.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def restore_environment():
    """In-process scoring applies the config's replica environment to this process: undo it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.usefixtures("restore_environment")
def test_in_process_jsonl_to_parquet_with_bad_rows(tiny_config, tmp_path, capsys):
    rows = DEMO + bad_rows()
    # A wrong-typed value and a broken line exist only in JSON Lines.
    source = write_dataset(tmp_path / "groups.jsonl", rows, extra_lines=BAD_TYPE_LINE + "{oops\n")
    summary = run_score(str(source), "-o", str(tmp_path / "scored.parquet"), "--config", str(tiny_config),
                        "--concurrency", "8", summary=tmp_path / "summary.json")
    scored = output_rows(tmp_path / "scored.parquet")
    check_scored(scored, rows, extra_ids=("bad-type", None))
    assert scored[-2]["error"] == "candidates: Input should be a valid list" and scored[-2]["candidates"] is None
    assert scored[-1]["failure"] == "bad_row" and "line 25: not valid JSON" in scored[-1]["error"]
    assert summary["groups"] == 25 and summary["valid"] == 20 and summary["failures"] == {"bad_row": 5}
    assert summary["renamed_columns"] == {"scores": "input_scores"} and summary["prompt_tokens"] > 0
    assert "vllm engine" in summary["scorer"] and "in this process" in summary["scorer"]
    assert "input column 'scores' kept as 'input_scores'" in capsys.readouterr().out
    # The output is what `grrm eval` reads: its accuracy is the mean of the spec's per-group accuracy.
    assert main(["eval", str(tmp_path / "scored.parquet"), "--reference-column", "input_scores", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = sum(gqm.ranking_accuracy(r["input_scores"], r["scores"]) for r in scored[:20]) / 20
    assert report["groups"] == 20 and report["accuracy"] == pytest.approx(expected)
    assert report["skipped_rows"]["bad_row"] == 5


@pytest.mark.usefixtures("restore_environment")
def test_in_process_parquet_to_jsonl(tiny_config, tmp_path):
    rows = DEMO[:6] + bad_rows()
    source = write_dataset(tmp_path / "groups.parquet", rows)
    summary = run_score(str(source), "-o", str(tmp_path / "scored.jsonl"), "--config", str(tiny_config),
                        summary=tmp_path / "summary.json")
    check_scored(output_rows(tmp_path / "scored.jsonl"), rows)
    assert summary["groups"] == 9 and summary["valid"] == 6 and summary["failures"] == {"bad_row": 3}


@pytest.fixture(scope="module")
def app_url(local_app):
    """The local application (2 vLLM-CPU replicas), the session's deployment (tests/conftest.py)."""
    return local_app[0]


def test_over_http_parquet(app_url, tmp_path):
    rows = DEMO + bad_rows()
    source = write_dataset(tmp_path / "groups.parquet", rows)
    summary = run_score(str(source), "-o", str(tmp_path / "scored.parquet"), "--url", app_url,
                        summary=tmp_path / "summary.json")
    check_scored(output_rows(tmp_path / "scored.parquet"), rows)
    assert summary["valid"] == 20 and summary["failures"] == {"bad_row": 3} and "vllm engine" in summary["scorer"]


def test_through_a_serve_handle_jsonl(app_url, tmp_path):
    rows = DEMO[:8] + bad_rows()
    source = write_dataset(tmp_path / "groups.jsonl", rows)
    summary = run_score(str(source), "-o", str(tmp_path / "scored.jsonl"), "--app", APP,
                        summary=tmp_path / "summary.json")
    check_scored(output_rows(tmp_path / "scored.jsonl"), rows)
    assert summary["valid"] == 8 and summary["scorer"].startswith(f"Serve application '{APP}'")


def test_with_ray_data(app_url, tmp_path):
    rows = DEMO + bad_rows()
    source = write_dataset(tmp_path / "groups.parquet", rows)
    summary = run_score(str(source), "-o", str(tmp_path / "scored"), "--ray", "--app", APP, "--batch-rows", "6",
                        "--ray-workers", "2", summary=tmp_path / "summary.json")
    scored = output_rows(tmp_path / "scored")
    # Ray Data writes a folder of files; row order across files is Ray's, so compare as sets.
    assert sorted(row["group_id"] for row in scored) == sorted(row["group_id"] for row in rows)
    check_scored(sorted(scored, key=lambda r: r["group_id"]), sorted(rows, key=lambda r: r["group_id"]))
    assert summary["groups"] == 23 and summary["valid"] == 20 and "via Ray Data" in summary["scorer"]


def durable_rows(work: WorkDir) -> dict[int, dict]:
    """The rows a killed run left on disk: parts and journal (what a rerun must not score again)."""
    rows: dict[int, dict] = {}
    for first, _, path in work.parts():
        for offset, values in enumerate(output_rows(path)):
            rows[first + offset] = {k: values[k] for k in ("group_id", "scores", "valid", "attempts", "prompt_tokens")}
    committed = max(rows, default=-1) + 1
    for index, fields in work.journaled(committed).items():
        rows[index] = {"group_id": None, **{k: fields[k] for k in ("scores", "valid", "attempts", "prompt_tokens")}}
    return rows


def test_killed_mid_run_then_rerun_scores_every_row_exactly_once(app_url, tmp_path):
    rows = [{**row, "group_id": f"{row['group_id']}-{copy}"} for copy in range(5) for row in DEMO] + bad_rows()
    source = write_dataset(tmp_path / "groups.jsonl", rows)
    output = tmp_path / "scored.parquet"
    work = WorkDir(output)
    command = [sys.executable, "-m", "grrm_cli", "score", str(source), "-o", str(output), "--url", app_url,
               "--concurrency", "1", "--part-rows", "4"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if work.exists() and len(durable_rows(work)) >= 10:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed:\n" + process.stdout.read()[-3000:]
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()
    assert not output.exists()
    before = durable_rows(work)
    assert 10 <= len(before) < len(rows)

    # The same command; only the concurrency differs (it is not part of what the partial output records).
    rerun = command[4:-4] + ["--concurrency", "8", "--part-rows", "4"]
    summary = run_score(*rerun, summary=tmp_path / "summary.json")
    scored = output_rows(output)
    check_scored(scored, rows)  # each row once, in input order
    assert summary["resumed"] == len(before) and summary["scored_now"] == len(rows) - len(before)
    for index, kept in before.items():  # rows written before the kill are in the output as they were
        after = scored[index]
        assert {k: after[k] for k in kept if k != "group_id"} == {k: v for k, v in kept.items() if k != "group_id"}
    assert not work.path.exists()
