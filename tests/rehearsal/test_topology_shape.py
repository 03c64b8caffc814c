"""The topology rehearsal's pure parts (no Ray): the cluster it starts is the one the render declares, the
application it deploys is the rendered one with only the engine swapped, and each placement rule it checks
names what broke it. The rehearsal itself runs in test_topology.py."""

from __future__ import annotations

import copy

from bench.topology import (
    MAX_NODES,
    judge,
    rehearsal_application,
    render_topology,
    report_section,
    summarize,
)
from k8s.render.options import RenderOptions
from k8s.render.placement import node_shapes

OPTIONS = RenderOptions(replicas_per_worker=8)


def test_the_rehearsal_cluster_declares_what_the_render_writes():
    rendered = render_topology(OPTIONS.replicas_per_worker)
    shapes = node_shapes(OPTIONS)
    assert [group.name for group in rendered.groups] == list(shapes)  # the head, then the worker groups in order
    for group in rendered.groups:
        shape = shapes[group.name]
        assert (group.num_cpus, group.num_gpus, group.resources) == (shape.num_cpus, shape.num_gpus, shape.resources)
    roles = {group.role: group for group in rendered.groups}
    assert set(roles) == {"head", "reward", "services", "policy"}
    # One 8-GPU reward node (replicas_per_worker=8), as many services nodes as services pods, one trainer node.
    assert roles["reward"].nodes == 1 and roles["reward"].num_gpus == OPTIONS.replicas_per_worker
    assert roles["services"].nodes == OPTIONS.service_pods
    assert roles["policy"].nodes == OPTIONS.policy_nodes and roles["policy"].num_gpus == OPTIONS.policy_gpus_per_node
    assert sum(group.nodes for group in rendered.groups) <= MAX_NODES
    # verl's size comes from the rendered RayJob's entrypoint.
    assert (rendered.trainer_gpus_per_node, rendered.trainer_nodes) == (OPTIONS.policy_gpus_per_node,
                                                                        OPTIONS.policy_nodes)


def test_only_the_engine_is_swapped():
    rendered = render_topology(OPTIONS.replicas_per_worker)
    original = rendered.application()
    rehearsed = rehearsal_application(rendered)
    assert rehearsed["args"]["engine"]["kind"] == "scripted"
    assert {**rehearsed, "args": {**rehearsed["args"], "engine": None}} == \
        {**original, "args": {**original["args"], "engine": None}}
    # Each replica still asks Ray for its GPU and for the reward pods' resource.
    assert rehearsed["args"]["replicas"]["gpus_per_rank"] > 0
    assert rehearsed["args"]["replicas"]["resources"]
    old = rehearsal_application(rendered, old_placement=True)
    assert old["args"]["replicas"]["resources"] == {}
    expected = copy.deepcopy(rehearsed)
    expected["args"]["replicas"]["resources"] = {}
    assert old == expected


def row(kind, name, role, group=None, node="n1", gpus=(), state="ALIVE"):
    return {"run": "rendered", "phase": "p", "t_s": 1.0, "kind": kind, "name": name, "role": role,
            "node_group": group or role, "node": node, "gpus": list(gpus), "state": state}


def test_each_placement_rule_names_what_broke_it():
    rows = judge([
        row("scorer", "R#a", "reward", gpus=[0]),
        row("scorer", "R#b", "reward", gpus=[1]),
        row("scorer", "R#c", "reward", gpus=[1]),                    # the GPU R#b holds
        row("scorer", "R#d", "policy", node="n2", gpus=[0]),         # a policy GPU
        row("ingress", "I#a", "services"),
        row("ledger", "L#a", "reward"),
        row("task_runner", "verl_task_runner", "policy"),
        row("trainer_pg", "global_pool:0", "policy", state="CREATED"),
        row("trainer_pg", "global_pool:1", "reward", state="CREATED"),
        row("trainer_pg", "global_pool:2", "", state="PENDING"),     # not placed: no rule broken by where it is
        row("other_on_head", "stray", "head"),
    ])
    broken = {r["name"]: r["broken"] for r in rows if r["broken"]}
    assert set(broken) == {"R#c", "R#d", "L#a", "global_pool:1", "stray"}
    assert "GPU 1 held by R#b" in broken["R#c"]
    assert "off the reward nodes" in broken["R#d"]
    assert "off the services nodes" in broken["L#a"]
    assert "placement group off the policy node" in broken["global_pool:1"]
    assert "on the head" in broken["stray"]
    summary = summarize(rows)
    assert summary["scorers"] == 4 and summary["scorers_on"] == {"reward": 3, "policy": 1}
    assert summary["violations"] == 5


def test_the_report_tables_each_phase():
    rows = judge([row("scorer", "R#a", "reward", gpus=[0]), row("ingress", "I#a", "services")])
    text = report_section(rows + [{**r, "phase": "q"} for r in rows])
    assert text.startswith("## ")
    assert "python -m bench.topology" in text
    assert sum(line.startswith("| rendered |") for line in text.splitlines()) == 2
