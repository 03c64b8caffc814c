"""The ledger of scored groups survives the loss of any one of its replicas.

Real Serve, the app with 2 ledger replicas: every scored group is on both; one ledger replica is
killed and the records are still found; its replacement copies its peer's records when it
starts, so the other original can die next and nothing is lost either. Then a scorer replica that
never saw a group adopts it from the surviving ledger. The engine is scripted: the test is about
the ledger, not the model.
"""

from __future__ import annotations

import time

import pytest
import ray
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.routing import RouteHint
from cluster.protocol.schema import MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings, ServiceSettings
from grrm_handles.send import routed, to_replica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP = "ledgers"
GROUPS = 6


def members_of(group: int) -> list[MemberRequest]:
    return [MemberRequest(group_id=f"l-{group}", group_size=3, index=k, source=f"Source {group}.",
                          candidate=f"Kandidat {group}-{k} [q={(group + 3 * k) % 7}]", src_lang="en", trg_lang="de")
            for k in range(3)]


def ledger_infos(ledger) -> dict[str, dict]:
    """Each ledger replica's info, by name (copy k reaches the k-th replica in name order)."""
    infos = [ledger.info.remote(copy=copy).result(timeout_s=30) for copy in range(2)]
    return {info["replica"]: info for info in infos}


def kill_replica(deployment: str, name: str) -> None:
    actor = next(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                 if entry["name"].endswith(f"{APP}#{deployment}#{name}"))
    ray.kill(ray.get_actor(actor, namespace="serve"), no_restart=True)


# How long a peer sync or a replacement may take. Seconds alone on this machine; beside the other
# shard's trainings a sync took over 30 s (and with two busy loops on 2 cores Serve took 50 s to
# replace a replica).
SYNC_WITHIN_S = 120
REPLACED_WITHIN_S = 180


def eventually(read, holds, timeout_s: float = SYNC_WITHIN_S):
    """Read until ``holds(value)``; the last value otherwise fails the test."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if holds(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {value}")
        time.sleep(0.5)


def wait_for_two_ledgers(ledger, without: set[str], timeout_s: float = REPLACED_WITHIN_S) -> dict[str, dict]:
    """Wait until two live ledger replicas answer, none of them in ``without``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            infos = ledger_infos(ledger)
        except Exception:  # noqa: BLE001 - the handle still routes to the dead replica
            time.sleep(0.5)
            continue
        if len(infos) == 2 and not set(infos) & without:
            return infos
        time.sleep(0.5)
    raise AssertionError(f"no two live ledger replicas within {timeout_s} s")


def test_scored_groups_outlive_any_one_ledger_replica(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05)),
        replicas=ReplicaSettings(num_replicas=2, num_cpus=0.25, gpus_per_rank=0),
        ledger=ServiceSettings(num_replicas=2),
        assembly_timeout_s=10,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    replicas = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    ledger = serve.get_deployment_handle("GRRMLedger", app_name=APP)
    scored = {}
    for group in range(GROUPS):
        answers = [replicas.add_member.remote(member) for member in members_of(group)]
        scored[f"l-{group}"] = [answer.result(timeout_s=60).group_scores for answer in answers][0]

    # Every group on both replicas (written to both, or repaired by their peer sync within seconds).
    originals = eventually(lambda: ledger_infos(ledger), lambda infos: len(infos) == 2 and all(
        info["groups"] == GROUPS for info in infos.values()))

    # Lose one ledger replica: the other still has every record; its replacement copies them.
    first, second = sorted(originals)
    kill_replica("GRRMLedger", first)
    wait_for_two_ledgers(ledger, without={first})
    after_first = eventually(lambda: ledger_infos(ledger), lambda infos: all(
        info["groups"] == GROUPS for info in infos.values()))
    replacement = next(name for name in after_first if name != second)
    assert after_first[replacement]["synced_from_peers"] == GROUPS, after_first

    # Lose the other original too: the replacement alone answers for every group.
    kill_replica("GRRMLedger", second)
    wait_for_two_ledgers(ledger, without={first, second})
    eventually(lambda: ledger_infos(ledger), lambda infos: all(info["groups"] == GROUPS for info in infos.values()))
    for group_id, scores in scored.items():
        records = [ledger.get.remote(group_id, copy=copy).result(timeout_s=30) for copy in range(2)]
        assert all(record is not None for record in records), group_id
        assert all(list(record.verdict.scores) == scores for record in records), group_id

    # The scorer that scored a group dies; a re-sent member reaches a scorer that never saw the
    # group, which answers it from the ledger (both original ledger replicas are gone by now).
    group_id = "l-0"
    holders = [name for name, info in scorer_infos(replicas).items()
               if any(trace["group_id"] == group_id
                      for trace in to_replica(replicas, name).recent_groups.remote().result(timeout_s=30))]
    assert len(holders) == 1, holders
    kill_replica("GRRMReplica", holders[0])
    answer = None
    for attempt in range(1, 20):  # the handle learns of the death, then routes in ring order
        try:
            answer = routed(replicas, RouteHint(attempt=attempt)).add_member.remote(members_of(0)[1]).result(timeout_s=30)
            break
        except ray.exceptions.RayActorError:
            time.sleep(0.5)
    assert answer is not None and answer.failure is None, answer
    assert answer.group_scores == scored[group_id]
    survivors = scorer_infos(replicas)
    assert holders[0] not in survivors
    # The answer names the replica that scored the group; a survivor adopted it from the ledger.
    assert answer.replica == holders[0]
    assert sum(info["assembler"]["ledger_adopted"] for info in survivors.values()) == 1, survivors
    serve.delete(APP)


def scorer_infos(replicas) -> dict[str, dict]:
    """Each live scorer replica's info, by name (its Serve replica id)."""
    prefix = f"{APP}#GRRMReplica#"
    names = [entry["name"].split(prefix)[1] for entry in ray.util.list_named_actors(all_namespaces=True)
             if prefix in entry["name"]]
    return {name: to_replica(replicas, name).info.remote().result(timeout_s=30) for name in names}
