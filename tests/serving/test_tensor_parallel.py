"""Tensor parallelism that runs: deployments/local.yaml's app with
``engine.tensor_parallel_size: 2`` on real Ray Serve and the CPU build of vLLM. Placement is
chosen, not forced (deployments/placement.py): on CPU the replica runs its two TP ranks as
processes (vLLM's ``mp`` executor), so every replica's engine core has two TP worker children.

Routing and member assembly are the TP = 1 ones: 6 groups of 4 streamed member by member,
half over HTTP and half over the handle, all valid, each scored once, on one replica. Then one
TP rank's process is killed mid-stream: the replica's engine is dead, the replica ends itself,
its members are re-sent and scored elsewhere, and Serve starts a new TP replica; no member is
lost (bench/chaos.py's phases, as in tests/reliability/test_engine_death.py)."""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest
from ray import serve

from bench.chaos import chaos_config, fault_phase, replica_infos, row_summary, tensor_parallel_worker_pid
from cluster.tiny_model import ensure_tiny_model
from deployments.app import build_app

pytestmark = [pytest.mark.slow, pytest.mark.memory_heavy, pytest.mark.timeout(900)]

APP = "tensor-parallel"
GROUPS = 24  # the rank kill: enough groups in flight when it strikes
BASELINE_GROUPS = 6  # streamed member by member: enough to show assembly and routing on TP replicas


@pytest.fixture(scope="module")
def tensor_parallel_app(serve_instance, tmp_path_factory):
    model = ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-grrm")
    config = chaos_config(model, tensor_parallel_size=2)
    # A probe is answered between two engine steps, and a TP = 2 step waits for both ranks: with the
    # other shard's trainings on the same 2 cores, probes took past local.yaml's 8 s and Serve replaced
    # healthy replicas (false hang alarms). A killed rank is found by the engine's death, not the probe.
    config = config.model_copy(update={"replicas": config.replicas.model_copy(update={"hang_timeout_s": 30.0})})
    started = time.monotonic()
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    print(f"\n2 TP=2 replicas running {time.monotonic() - started:.1f} s after serve.run")
    yield f"{serve_instance}/{APP}", serve.get_deployment_handle("GRRMReplica", app_name=APP)
    serve.delete(APP)


def test_tensor_parallel_replicas_run_their_ranks_and_score_members_over_http_and_the_handle(tensor_parallel_app):
    url, handle = tensor_parallel_app
    info = httpx.get(f"{url}/v1/info", timeout=30).json()
    assert info["tensor_parallel_size"] == 2 and info["distributed_executor_backend"] == "mp", info
    assert info["replicas"].get("RUNNING") == 2, info
    # Each replica's engine core runs two TP ranks as its own processes.
    infos = asyncio.run(replica_infos(handle, APP))
    assert len(infos) == 2, infos
    for info in infos.values():
        for rank in (0, 1):
            assert psutil.Process(tensor_parallel_worker_pid(info["pid"], rank)).is_running()
    row = asyncio.run(fault_phase(url, handle, APP, None, run="tp-baseline", groups=BASELINE_GROUPS))
    transports = {answer["transport"] for answer in row["answers"]}
    summary = row_summary(row)
    assert transports == {"http", "handle"}
    assert row["members_sent"] == row["members_valid"] == BASELINE_GROUPS * 4, summary
    assert row["split_groups"] == 0 and row["groups_duplicated"] == 0 and row["ledger_mismatches"] == 0, summary


def test_bench_tensor_parallel_scores_whole_groups_on_the_tensor_parallel_replicas(tensor_parallel_app):
    """bench.tensor_parallel's scoring (what its --quick run measured per TP size), on this app."""
    from bench.tensor_parallel import score_groups

    url, _ = tensor_parallel_app
    row = asyncio.run(score_groups(url, groups=4, concurrency=4))
    assert row["groups"] == row["valid"] == 4, row
    assert row["groups_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0, row


def test_a_killed_tensor_parallel_rank_loses_no_member(tensor_parallel_app):
    url, handle = tensor_parallel_app
    row = asyncio.run(fault_phase(url, handle, APP, "tp_worker_kill", run="tp-kill", groups=GROUPS))
    summary = row_summary(row)
    assert row["in_flight_at_fault"] > 0, summary
    assert row["members_lost"] == 0 and row["members_valid"] == GROUPS * 4, summary
    assert row["split_groups"] == 0 and row["ledger_mismatches"] == 0, summary
    assert row["scorings_seen"] == GROUPS and row["groups_duplicated"] == 0, summary
    assert row["engine_core_left"] is False, "the killed rank's process is still there"
    assert row["replicas_back_s"] is not None, "Serve did not run 2 TP replicas again"

