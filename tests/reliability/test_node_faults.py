"""Node and GCS faults on a multi-node Ray cluster on one machine.

Runs ``bench.node_chaos --quick --redis`` in a process of its own (it starts its own Ray cluster:
a head with 0 CPUs and 4 worker nodes; this test session's Ray would be in the way): members
stream through the product's client (``RewardClient``), half over HTTP and half over the handle,
while an ingress replica and a ledger replica are killed, a worker node holding a scorer replica
dies, then a node holding an ingress and a ledger replica; then, on a cluster with GCS fault
tolerance on a local ``redis-server``, the GCS is down for 20 s, and the whole head (GCS, Serve
controller, head raylet and proxy) is killed and a new head starts on the same Redis 20 s later,
while members stream from a worker node over its own Serve proxy and a handle. Every member gets
its group's one verdict: none lost, none scored twice, no group split. The engine is scripted:
what is tested is how Ray, Serve and the app survive a node or the head, not the model.
"""

from __future__ import annotations

import json

import pytest

from tests.own_cluster import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster, pytest.mark.timeout(900)]


# How long the GCS (and the head) stay down; groups count as due while down only if they were sent by
# the outage's margin before its end, and at least this long must be left for them.
HEAD_DOWN_S = 20
MIN_DUE_WINDOW_S = 5.0
# In the order a cut message needs them: which phase, then whether one scorer froze (a share of the groups
# waiting) or all were slow.
OUTAGE_KEYS = ("phase", "groups_due_while_down", "groups_waiting_for_the_outage", "scorers_answering_while_down",
               "outage_margin_s", "max_latency_s", "in_flight_at_fault", "answered_while_down", "scorers_replaced",
               "app_status_after", "replicas_back_s")


def test_no_member_is_lost_when_a_node_the_gcs_or_the_head_dies(tmp_path):
    out = tmp_path / "rows.json"
    # The GCS and the head stay down 20 s (the bench's default is 5): on CI's loaded machine a 5 s
    # outage once saw no answer over HTTP at all, and groups took 7-10 s while the GCS was down, so a
    # 10 s outage left too little of it for a group to be due (bench.node_chaos.outage_waits).
    run = run_bench(["bench.node_chaos", "--quick", "--redis", "--head-down-s", str(HEAD_DOWN_S), "--out", str(out)],
                    tmp_path, timeout_s=840)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    rows = {row["phase"]: row for row in json.loads(out.read_text())}
    print(json.dumps(rows, indent=1))
    assert set(rows) == {"baseline", "ingress_kill", "ledger_kill", "scorer_node_kill", "ingress_ledger_node_kill",
                         "gcs_restart", "head_restart"}
    for phase, row in rows.items():
        assert row["members_sent"] == 96 and row["members_valid"] == 96, (phase, row["failures"])
        assert row["members_lost"] == 0 and row["groups_duplicated"] == 0 and row["split_groups"] == 0, row
        assert row["transports"] == ["handle", "http"]
    # The faults hit what they were meant to hit, while members were in flight.
    assert "Replica" in rows["scorer_node_kill"]["victim_held"]
    # The node holding the most ingress and ledger replicas (both, where Serve placed them together).
    held = rows["ingress_ledger_node_kill"]["victim_held"]
    assert "Ingress" in held or "Ledger" in held, held
    for phase in ("ingress_kill", "ledger_kill", "scorer_node_kill", "ingress_ledger_node_kill", "gcs_restart",
                  "head_restart"):
        assert rows[phase]["in_flight_at_fault"] > 0, rows[phase]
    # While the GCS or the whole head was down, worker-node proxies and handles kept answering, every
    # scorer replica kept running (no model reload), and the restarted controller still runs the app.
    for phase in ("gcs_restart", "head_restart"):
        # What pytest's message keeps of a failed check here (it cuts a whole row short).
        row = {key: rows[phase][key] for key in OUTAGE_KEYS}
        assert row["answered_while_down"]["http"] > 0 and row["answered_while_down"]["handle"] > 0, row
        # No group that had time to be scored while it was down waited for it: nothing froze waiting
        # for the GCS (a frozen scorer replica holds every group the ring gives it).
        assert row["groups_waiting_for_the_outage"] == 0, row
        if row["outage_margin_s"] <= HEAD_DOWN_S - MIN_DUE_WINDOW_S:
            assert row["groups_due_while_down"] >= 3, row
        else:
            # A machine so loaded that a group the outage did not hold took most of it (the full suite's
            # two shards: 16.7 s of a 20 s outage) leaves no group due by the margin: then the evidence
            # that nothing froze is that every scorer replica answered while it was down.
            assert row["scorers_answering_while_down"] == 3, row
        assert row["scorers_replaced"] == 0 and row["app_status_after"] == "RUNNING", row
        assert row["replicas_back_s"] is not None, row
    # Serve ran every scorer replica again after each node died.
    assert rows["scorer_node_kill"]["replicas_back_s"] is not None
    assert rows["ingress_ledger_node_kill"]["replicas_back_s"] is not None
    assert run.returncode == 0, run.stderr[-3000:]
