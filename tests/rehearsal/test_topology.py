"""The production topology, rehearsed: no reward replica ever takes a policy GPU.

Runs ``bench.topology --quick`` in a process of its own (it starts its own Ray cluster: a head, one 8-GPU
``grrm-gpus`` node, two ``grrm-services`` nodes and one 8-GPU ``policy-gpus`` node, each declaring the
``rayStartParams`` the renderer writes; this test session's Ray would be in the way). The rendered application
runs on the scripted engine (each replica still asks for its GPU), scaled by groups through ``RewardClient``
from ``min_replicas`` to ``max_replicas``, back down and up again, while verl's own ``ResourcePoolManager``
places the trainer's placement group. The test reads the placement record and checks where everything ran,
at every phase and in every sample the rehearsal took: not how fast.
"""

from __future__ import annotations

import json

import pytest

from tests.own_cluster import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster, pytest.mark.timeout(900)]

PHASES = ["pool_at_min", "pool_at_max", "trainer_placed", "pool_scaled_down", "pool_scaled_up_again"]
TRAINER_PHASES = PHASES[2:]


def test_no_reward_replica_ever_takes_a_policy_gpu(tmp_path):
    from bench.topology import render_topology

    rendered = render_topology()
    groups = {group.role: group for group in rendered.groups}
    scaling = rendered.application()["args"]["replicas"]["autoscaling"]
    out = tmp_path / "topology.json"
    run = run_bench(["bench.topology", "--quick", "--out", str(out)], tmp_path, timeout_s=840)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    # Every rule the sampler checked, in every sample (not only the phases' records), held.
    assert result["violations"] == [], result["violations"]
    assert result["samples"] > len(PHASES)
    rows = result["rows"]
    assert [summary["phase"] for summary in result["summaries"]] == PHASES
    by_phase = {phase: [row for row in rows if row["phase"] == phase] for phase in PHASES}
    wanted = {"pool_at_min": scaling["min_replicas"], "pool_at_max": scaling["max_replicas"],
              "trainer_placed": scaling["max_replicas"], "pool_scaled_down": scaling["min_replicas"],
              "pool_scaled_up_again": scaling["max_replicas"]}
    assert scaling["max_replicas"] == groups["reward"].num_gpus  # the pool fills the reward node
    for phase, placed in by_phase.items():
        scorers = [row for row in placed if row["kind"] == "scorer"]
        assert len(scorers) == wanted[phase], (phase, scorers)
        # Each scorer replica on the reward node, holding a GPU of its own there.
        assert {row["node_group"] for row in scorers} == {groups["reward"].name}, (phase, scorers)
        assert all(len(row["gpus"]) == 1 for row in scorers), (phase, scorers)
        held = [(row["node"], row["gpus"][0]) for row in scorers]
        assert len(set(held)) == len(held), (phase, held)
        # The ingress and the ledger: one of each on each services node.
        for kind in ("ingress", "ledger"):
            services = [row for row in placed if row["kind"] == kind]
            assert {row["node_group"] for row in services} == {groups["services"].name}, (phase, services)
            assert len({row["node"] for row in services}) == len(services) == groups["services"].nodes
        assert not [row for row in placed if row["kind"] == "other_on_head"], phase
        trainer = [row for row in placed if row["kind"] == "trainer_pg"]
        if phase in TRAINER_PHASES:
            # verl's one STRICT_PACK group of n_gpus_per_node {CPU: 3, GPU: 1} bundles, held on the policy node.
            assert len(trainer) == rendered.trainer_nodes, (phase, trainer)
            for pg in trainer:
                assert pg["state"] == "CREATED" and pg["node_group"] == groups["policy"].name, (phase, pg)
                assert pg["strategy"] == "STRICT_PACK"
                assert pg["bundles"] == [{"CPU": 3.0, "GPU": 1.0}] * rendered.trainer_gpus_per_node
            runner = [row for row in placed if row["kind"] == "task_runner"]
            assert [row["node_group"] for row in runner] == [groups["policy"].name], (phase, runner)
        else:
            assert trainer == [], (phase, trainer)
    # The pool really came down and went up again: replicas of the second scale-up are new ones.
    first = {row["name"] for row in by_phase["pool_at_max"] if row["kind"] == "scorer"}
    again = {row["name"] for row in by_phase["pool_scaled_up_again"] if row["kind"] == "scorer"}
    assert len(again - first) >= scaling["max_replicas"] - scaling["min_replicas"]
    # Every replica that ever ran, whenever the sampler saw it, ran where it belongs.
    lifetimes = [life for life in result["lifetimes"] if life["kind"] == "scorer"]
    assert len(lifetimes) >= len(first | again)
    assert {life["node_group"] for life in lifetimes} == {groups["reward"].name}
    assert result["findings"]["groups"]["valid"] == result["findings"]["groups"]["groups_answered"] > 0
    assert run.returncode == 0, run.stderr[-3000:]
