"""Every benchmark runs in --quick mode, so none can rot (issue 6), and writes the output
contract that outside checks read. Results go to a temporary directory: the committed
bench/results/ keep the full runs.

One exception, for CI's time: bench.verl_trainer (real verl trainings, minutes each). Its row
arithmetic is tested in milliseconds (tests/test_bench_verl_trainer.py), the trainer modes it runs
by tests/verl_trainer/, and its after-batch baseline's overrides by test_harness_parts.py; run
`python -m bench.verl_trainer --quick` by hand after changing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def run_quick(module: str, results: Path, timeout_s: float = 360) -> None:
    env = {**os.environ, "GRRM_BENCH_RESULTS": str(results), "RAY_USAGE_STATS_ENABLED": "0"}
    completed = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--quick"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout_s,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


def test_overlap_quick(tmp_path):
    run_quick("overlap", tmp_path)
    rows = json.loads((tmp_path / "overlap.json").read_text())
    assert {r["mode"] for r in rows} == {"colocated_sequential", "separate_after_batch", "streamed",
                                         "streamed_largest_first"}
    for row in rows:
        assert {"n", "reward_to_generation", "mode", "step_s", "exposed_reward_s", "limit_exposed_s", "simulated"} <= set(row)
    for row in (r for r in rows if r["mode"].startswith("streamed")):
        assert row["exposed_reward_s"] >= row["limit_exposed_s"] - 1e-9  # nothing beats the limit
        colocated = next(r for r in rows if r["mode"] == "colocated_sequential" and r["n"] == row["n"]
                         and r["reward_to_generation"] == row["reward_to_generation"])
        assert row["step_s"] < colocated["step_s"]
    assert (tmp_path / "overlap.png").stat().st_size > 0


def test_serving_quick(tmp_path):
    run_quick("serving", tmp_path)
    rows = json.loads((tmp_path / "serving.json").read_text())
    assert {r["path"] for r in rows} == {"in_process", "handle", "http"}
    assert all({"concurrency", "engine", "groups_per_s", "p50_ms", "p99_ms"} <= set(r) for r in rows)


def test_routing_quick(tmp_path):
    run_quick("routing", tmp_path)
    result = json.loads((tmp_path / "routing.json").read_text())
    assert result["prefix_cache_hit_rate_group_aware"] > result["prefix_cache_hit_rate_serve_default"]


def test_autoscale_quick(tmp_path):
    run_quick("autoscale", tmp_path)
    result = json.loads((tmp_path / "autoscale.json").read_text())
    assert result["requests_dropped"] == 0 and result["answered"] == result["sent"]
    assert result["max_replicas_seen_serving"] >= 2 and result["first_new_replica_serving_s"] is not None


def test_gqm_vs_sqm_quick(tmp_path):
    run_quick("gqm_vs_sqm", tmp_path)
    result = json.loads((tmp_path / "gqm_vs_sqm.json").read_text())
    assert set(result["by_group_size"]) == {"2", "4"}
    # One GQM prompt per group spends fewer tokens per candidate than one SQM prompt per candidate.
    assert result["by_group_size"]["4"]["gqm_tokens_over_sqm"] < 1


def test_chaos_quick(tmp_path):
    run_quick("chaos", tmp_path)
    result = json.loads((tmp_path / "chaos.json").read_text())
    phases = {row["phase"]: row for row in result["phases"]}
    assert set(phases) == {"baseline", "dangling_flood", "engine_core_kill"}
    for row in phases.values():
        assert row["members_lost"] == 0 and row["groups_duplicated"] == 0 and row["split_groups"] == 0, row
    assert set(phases["dangling_flood"]["dangling_answered"]) == {"timeout"}  # each one answered, none lost
    # What each bad input gets is asserted by the API's own tests; here: each was sent and no replica died of it.
    assert len(result["bad_inputs"]) == 3
    assert all(row["replicas_running_after"] == row["replicas_running_before"] for row in result["bad_inputs"])


def test_engines_quick(tmp_path):
    run_quick("engines", tmp_path)
    result = json.loads((tmp_path / "engines.json").read_text())
    rows = result["rows"]
    assert {(r["dtype"], r["mode"], r["constraint"], r["side"]) for r in rows} == {
        (dtype, mode, constraint, side) for dtype in ("float32", "bfloat16") for mode in ("greedy", "sampled")
        for constraint in ("none", "regex") for side in ("engine", "plain")
    }
    for row in rows:
        assert row["tokens"] > 0 and row["tokens_per_s"] > 0
        if row["constraint"] == "none":  # fixed answer lengths on both sides: the same tokens
            assert row["tokens"] == row["batch"] * result["answer_tokens"], row
    assert set(result["targets"]["engine_vs_plain"]) == {"float32/greedy", "float32/sampled", "bfloat16/greedy",
                                                         "bfloat16/sampled"}


def test_score_cli_quick(tmp_path):
    run_quick("score_cli", tmp_path)
    rows = {row["path"]: row for row in json.loads((tmp_path / "score_cli.json").read_text())}
    assert set(rows) == {"bare_http", "grrm_score_url", "grrm_score_app", "grrm_score_ray"}
    assert rows["bare_http"]["vs_bare_http"] == 1.0
    assert all(row["groups"] == 120 and row["groups_per_s"] > 0 and row["simulated"] for row in rows.values())


@pytest.mark.parametrize("module", ["ensemble", "repair", "soak"])
def test_other_benchmarks_quick(tmp_path, module):
    run_quick(module, tmp_path)
    assert (tmp_path / f"{module}.json").exists()


def test_tensor_parallel_quick(tmp_path):
    run_quick("tensor_parallel", tmp_path)
    rows = json.loads((tmp_path / "tensor_parallel.json").read_text())
    assert [(r["tensor_parallel_size"], r["executor"]) for r in rows] == [(1, "none"), (2, "mp")]
    assert all(r["valid"] == r["groups"] == 8 for r in rows)
    assert all(r["start_s"] > 0 and r["groups_per_s"] > 0 for r in rows)
    assert rows[0]["groups_per_s_vs_tp1"] == 1.0 and rows[1]["groups_per_s_vs_tp1"] > 0
