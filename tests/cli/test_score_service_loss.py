"""``grrm score --url`` when the service goes away mid-run: the run stops (exit 1) without writing
the groups it could not get answers for, and the rerun, once the service is back, scores exactly
those, announcing them to the autoscaling as work due within ``--finish-within-s`` and withdrawing
that when it ends. The application runs the scripted engine: this is about the command's reaction to the
service, not about scores (tests/cli/test_score_vllm.py scores with real vLLM)."""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray import serve

from cluster.demand_report import reported_groups
from cluster.engines import EngineConfig, ScriptedEngineOptions
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from grrm_cli.dataset import read_rows
from grrm_cli.main import main
from grrm_cli.resume import WorkDir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "grrm-cli-loss"


def deploy() -> None:
    config = AppConfig(
        # 0.2 s a group, 2 at a time: the run lasts ~12 s, far longer than the app takes to go away.
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.2)),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0),
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")


def test_a_lost_service_stops_the_run_and_the_rerun_scores_only_what_is_missing(serve_instance, tmp_path, capsys):
    rows = [
        {"group_id": f"g{i}", "source": f"Source {i}.", "candidates": [f"a {i} [q=3]", f"b {i} [q=7]"],
         "src_lang": "en", "trg_lang": "de"}
        for i in range(120)
    ]
    source, output = tmp_path / "groups.parquet", tmp_path / "scored.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    command = ["score", str(source), "-o", str(output), "--url", f"{serve_instance}/{APP}", "--concurrency", "2",
               "--max-attempts", "2", "--deadline-s", "20", "--summary-json", str(tmp_path / "summary.json")]
    deploy()
    work = WorkDir(output)
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(main(command)))
    runner.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and runner.is_alive():
        if work.exists() and work.committed_rows() + len(work.journaled(work.committed_rows())) >= 10:
            break
        time.sleep(0.01)
    serve.delete(APP)  # the service goes away mid-run
    runner.join(timeout=120)
    assert status == [1], capsys.readouterr()
    assert "grrm score: stopped:" in capsys.readouterr().err
    assert not output.exists()
    committed = work.committed_rows()
    written = committed + len(work.journaled(committed))
    assert 10 <= written < len(rows)
    # Only answers were written: nothing flagged as unreachable or refused.
    for _, _, part in work.parts():
        assert all(row.values["valid"] for batch in read_rows(part, "parquet") for row in batch)
    assert all(fields["valid"] for fields in work.journaled(committed).values())

    deploy()
    replica = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    announced: list[float] = []  # the demand the (one) replica reports to the autoscaling, while the rerun runs
    rerun: list[int] = []
    try:
        # A rerun may send more at once.
        runner = threading.Thread(target=lambda: rerun.append(main([*command, "--concurrency", "16",
                                                                    "--finish-within-s", "600"])))
        runner.start()
        while runner.is_alive():
            groups = reported_groups(replica.record_autoscaling_stats.remote().result(), "default")
            announced.append(-1.0 if groups is None else groups)
            time.sleep(0.05)
        runner.join()
        # The ingress hands the withdrawal to the replica in the background, after answering it.
        withdrawn_by = time.monotonic() + 30
        while True:
            after = replica.record_autoscaling_stats.remote().result()
            if reported_groups(after, "default") == 0.0 or time.monotonic() > withdrawn_by:
                break
            time.sleep(0.1)
    finally:
        serve.delete(APP)
    assert rerun == [0]
    assert float(len(rows) - written) in announced, announced  # the rows left, announced once the scorer was up
    assert reported_groups(after, "default") == 0.0  # withdrawn at the end (within 30 s at the replica)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumed"] == written and summary["scored_now"] == len(rows) - written
    scored = [row.values for batch in read_rows(output, "parquet") for row in batch]
    assert [row["group_id"] for row in scored] == [row["group_id"] for row in rows]
    assert all(row["valid"] and row["scores"] == [3, 7] for row in scored)  # the scripted engine's marker scores
