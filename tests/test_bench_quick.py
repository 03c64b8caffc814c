"""Every benchmark runs in --quick mode, so none can rot, and writes the output contract that
outside checks read. Each test asserts that its benchmark ran end to end and wrote well-formed
results, not what it measured: a --quick run is the smallest that executes every code path, and
the full runs measure. Where a measured property has a cheap test elsewhere, a comment names it.
They run in this test process, on the session's Ray cluster and Serve instance where they need one (``bench.common.local_serve``),
with results in a temporary directory: the committed bench/results/ keep the full runs.

Where a test elsewhere already runs a benchmark's own measuring code on an app it deploys anyway,
the benchmark is checked there instead of here: bench.chaos's phases (baseline, dangling flood,
bad inputs, engine-core and replica kills) in tests/reliability/test_engine_death.py, bench.repair's
comparison in tests/engines/test_vllm_repair.py, bench.tensor_parallel's scoring and row arithmetic
in tests/serving/test_tensor_parallel.py. bench.node_chaos runs in tests/reliability/test_node_faults.py.

One exception, for CI's time: bench.verl_trainer (real verl trainings, minutes each). Its row
arithmetic is tested in milliseconds (tests/test_bench_verl_trainer.py), the trainer modes it runs
by tests/verl_trainer/, and its after-batch baseline's overrides by test_harness_parts.py; run
`python -m bench.verl_trainer --quick` by hand after changing it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

# A backstop for a hung run, not a speed target: CI's own limit bounds the whole run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(autouse=True)
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the benchmark writes (``GRRM_BENCH_RESULTS``)."""
    monkeypatch.setenv("GRRM_BENCH_RESULTS", str(tmp_path))
    return tmp_path


def run_quick(module: str) -> None:
    """``python -m bench.<module> --quick``, in this process; it must report success."""
    assert importlib.import_module(f"bench.{module}").main(["--quick"]) == 0


def test_overlap_quick(results):
    run_quick("overlap")
    rows = json.loads((results / "overlap.json").read_text())
    assert {r["mode"] for r in rows} == {"colocated_sequential", "separate_after_batch", "streamed",
                                         "streamed_largest_first"}
    for row in rows:
        assert {"n", "reward_to_generation", "mode", "step_s", "exposed_reward_s", "limit_exposed_s", "simulated"} <= set(row)
    for row in (r for r in rows if r["mode"].startswith("streamed")):
        assert row["exposed_reward_s"] >= row["limit_exposed_s"] - 1e-9  # nothing beats the limit
        colocated = next(r for r in rows if r["mode"] == "colocated_sequential" and r["n"] == row["n"]
                         and r["reward_to_generation"] == row["reward_to_generation"])
        assert row["step_s"] < colocated["step_s"]
    assert (results / "overlap.png").stat().st_size > 0


def test_serving_quick(serve_instance, results):
    run_quick("serving")
    rows = json.loads((results / "serving.json").read_text())
    assert {r["path"] for r in rows} == {"in_process", "handle", "http"}
    assert all({"concurrency", "engine", "groups_per_s", "p50_ms", "p99_ms"} <= set(r) for r in rows)
    for row in rows:
        assert row["groups_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0, row
        if row["path"] == "in_process":
            assert row["added_p50_ms"] == 0


def test_handle_path_quick(serve_instance, results):
    run_quick("handle_path")
    rows = {row["path"]: row for row in json.loads((results / "handle_path.json").read_text())}
    assert set(rows) == {"bare_serve", "bare_serve_group_router", "replica_serve_router", "replica_group_router",
                         "replica_client", "replica_client_members"}
    assert rows["bare_serve"]["vs_bare_serve"] == 1.0 and all(row["rounds"] == 1 for row in rows.values())
    # The bridge's path makes one call per member: 4 per group, each counted.
    members = rows["replica_client_members"]
    assert members["calls_per_s"] == pytest.approx(4 * members["groups_per_s"])
    for row in rows.values():
        assert row["groups_per_s"] > 0 and row["simulated"]
        # The per-process split of CPU is measured (how much each spends is the full run's figure).
        assert row["cpu_ms_per_group_driver"] >= 0 and row["cpu_ms_per_group_replica"] >= 0


def test_routing_quick(serve_instance, results):
    run_quick("routing")
    result = json.loads((results / "routing.json").read_text())
    # Whether the group-aware router keeps a group's repeats on one replica is tests/test_routing.py's (the
    # ring and the sticky assignments); the prefix-cache hit rates it buys are the full run's measure.
    assert {row["router"] for row in result["rows"]} == {"group_aware", "serve_default"}
    for row in result["rows"]:
        assert row["groups"] == 2 and row["requests_per_group"] == 2, row
        assert 0 <= row["prefix_cache_hit_rate"] <= 1 and row["tokens_computed_per_group"] > 0, row
    assert 0 <= result["prefix_cache_hit_rate_group_aware"] <= 1


def test_autoscale_quick(serve_instance, results):
    run_quick("autoscale")
    [run] = json.loads((results / "autoscale.json").read_text())["runs"]
    assert run["policy"] == "engine_work" and run["members_lost"] == 0
    # That the policy grows the pool for announced bursts and lets it go is tests/serving/test_scaling.py's
    # (and tests/test_autoscaling.py's, in milliseconds); the replica-seconds it saves are the full run's.
    assert run["timeline"] and all(point["serving"] <= point["replicas"] for point in run["timeline"])
    assert 0 < run["serving_replica_seconds"] <= run["replica_seconds"] and run["peak_pool_replica_seconds"] > 0
    assert (results / "autoscale.png").stat().st_size > 0


def test_plan_check_quick(serve_instance, results):
    run_quick("plan_check")
    result = json.loads((results / "plan_check.json").read_text())
    rows = {row["pool"]: row for row in result["rows"]}
    assert set(rows) == {"fixed", "engine_work"} and all(row["members_lost"] == 0 for row in rows.values())
    # The profile's cold start was measured on this Serve, as the fixed pool started.
    assert result["profile"]["cold_start_s"] > 0 and "fixed pool" in result["profile"]["source"]
    for pool, row in rows.items():
        assert row["replica_s_per_step_predicted"] > 0 and row["replica_s_per_step_measured"] > 0, pool
        assert row["replica_s_per_step_repredicted"] > 0, pool
        timelines = result["timelines"][pool]
        assert timelines["predicted"] and timelines["measured"], pool
    # How close the prediction comes is the full run's measure (the replay's arithmetic: tests/planning/);
    # a fixed pool holds its size in both.
    fixed = rows["fixed"]
    assert fixed["peak_predicted"] == fixed["peak_measured"] == result["workload"]["max_replicas"] == 2
    assert (results / "plan_check.png").stat().st_size > 0


def test_gqm_vs_sqm_quick(results):
    run_quick("gqm_vs_sqm")
    result = json.loads((results / "gqm_vs_sqm.json").read_text())
    assert set(result["by_group_size"]) == {"2", "4"}
    # One GQM prompt per group spends fewer tokens per candidate than one SQM prompt per candidate.
    assert result["by_group_size"]["4"]["gqm_tokens_over_sqm"] < 1


def test_engines_quick(results):
    run_quick("engines")
    result = json.loads((results / "engines.json").read_text())
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


def test_score_cli_quick(serve_instance, results):
    run_quick("score_cli")
    rows = {row["path"]: row for row in json.loads((results / "score_cli.json").read_text())}
    assert set(rows) == {"bare_http", "grrm_score_url", "grrm_score_app", "grrm_score_ray"}
    assert rows["bare_http"]["vs_bare_http"] == 1.0
    quick_groups = importlib.import_module("bench.score_cli").QUICK_GROUPS
    assert all(row["groups"] == quick_groups and row["groups_per_s"] > 0 and row["simulated"] for row in rows.values())


def test_ensemble_quick(results):
    run_quick("ensemble")
    result = json.loads((results / "ensemble.json").read_text())
    parts = ("large_groups", "large_groups_by_prompt_shift", "position_bias")
    for part in parts:
        assert result[part], part
        for row in result[part]:
            assert row["groups"] == result["groups_per_setting"] == 8, row
            assert row["tokens_estimated"] or row["valid"] == row["groups"], row  # every group scored
            assert 0 <= row["ranking_accuracy"] <= 1 and row["prompts_per_group"] >= 1, row
            # What splitting is for: no prompt holds more candidates than GRRM was trained on.
            if "prompts of 8" in row["method"] or "split 8" in row["method"]:
                assert row["max_candidates_per_prompt"] <= 8, row
    # A K-permutation ensemble sends K prompts per group.
    for row in result["position_bias"]:
        if "K=4" in row["method"]:
            assert row["prompts_per_group"] == 4, row


def test_soak_quick(serve_instance, results):
    run_quick("soak")
    result = json.loads((results / "soak.json").read_text())
    summary = result["summary"]
    # Load with malformed members mixed in: no request errors, every malformed member refused, and the
    # replicas' memory and tail latency recorded per window (how they drift is the full run's measure).
    assert summary["errors"] == 0 and summary["groups"] > 0 and summary["bad_refused"] > 0, summary
    assert result["windows"] and all("completed" in window and "p99_ms" in window for window in result["windows"])
    assert any(key.startswith("rss_growth_mib_") for key in summary), summary
    assert (results / "soak.png").stat().st_size > 0


def test_hostile_tenants_quick(serve_instance, results):
    run_quick("hostile_tenants")
    rows = json.loads((results / "hostile_tenants.json").read_text())
    # A tenant whose groups never complete: the default bound refuses its excess, first come first served
    # does not. That the other tenant is answered beside them is tests/reliability/test_hostile_tenants.py's
    # (test_a_tenant_whose_groups_never_complete_cannot_take_the_replicas_slots); how fast, the full run's.
    stall = {row["mode"]: row for row in rows if row["case"] == "stall"}
    assert stall["defaults"]["flood_refused"] > 0 and stall["fifo"]["flood_refused"] == 0
    assert all(row["alpha_solo_s"] > 0 and row["alpha_beside_s"] > 0 for row in stall.values()), stall
    # Announcements under many names: the report stays within its bound and a withdrawal empties it.
    phases = {row["phase"]: row for row in rows if row["case"] == "announcements"}
    assert phases["announced"]["report_keys"] < phases["announced"]["report_keys_per_tenant_format"]
    assert phases["withdrawn"]["report_keys"] < phases["announced"]["report_keys"]
    refusals = {row["refusal"]: row for row in rows if row["case"] == "refusals"}
    assert refusals["413 over max_request_bytes"]["answered"] == 2 and set(refusals) == {
        "401 unauthenticated", "413 over max_request_bytes"}


def test_fair_share_quick(serve_instance, results):
    run_quick("fair_share")
    rows = json.loads((results / "fair_share.json").read_text())
    floods = {row["mode"]: row for row in rows if row["case"] == "http_bound"}
    assert set(floods) == {"fifo", "fair", "fair+flood_limit_8", "fair+flood_client_32"}
    # That the fair queue keeps a small run's rewards from waiting behind a flood, as first come first served
    # does not, is tests/test_fair_share.py's (the queue's order); by how much, the full run's measure.
    assert all(row["beside_over_alone"] > 0 and row["flood_groups_per_s"] > 0 for row in floods.values()), floods
    shares = [row for row in rows if row["case"] == "weights"]
    assert [row["weight"] for row in shares] == [1.0, 1.0, 2.0] and sum(row["share"] for row in shares) == pytest.approx(1)
    assert {row["mode"] for row in rows if row["case"] == "alone"} == {"fifo", "fair"}
    assert (results / "fair_share.png").stat().st_size > 0
