"""One retry layer over HTTP: the sends of one logical member request that reach the replicas, all
layers together, stay within the client's ``max_attempts`` while every replica that takes its group
dies. The ingress re-routes a call whose replica died within the caller's attempt (the client says
how many sends it may take, the answer how many it took), and nothing else below the client retries.

Real Serve, real HTTP, the product's client. The engine is scripted to hang every generation, so a
group stays at its replica's engine until the test kills that replica: each kill is one send that
reached a replica (both members of the group travel together, in ring order). Before the one
layer, one logical request could reach the replicas ``max_attempts`` times the ingress's own 4."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from ray import serve

from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from deployments.replica_list import replica_actor_names
from grrm_client import ClientConfig, RewardClient
from grrm_handles.send import to_replica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

APP = "sendcount"
MAX_ATTEMPTS = 3


async def holder(handle, timeout_s: float = 2.0) -> str | None:
    """The replica whose engine holds a group now (None: none does yet)."""
    for replica, actor in replica_actor_names(APP).items():
        try:
            rows = await asyncio.wait_for(to_replica(handle, replica).tenants.remote(), timeout_s)
        except Exception:  # noqa: BLE001 - a replica starting or just killed answers nothing
            continue
        if any(row["at_engine"] for row in rows.values()):
            return actor
    return None


def test_sends_of_one_http_member_request_stay_within_max_attempts_under_replica_loss(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(hang_rate=1.0)),
        scoring=ScoringConfig(retries=0, generation_timeout_s=600),
        replicas=ReplicaSettings(num_replicas=2, num_cpus=0.25, gpus_per_rank=0),
        assembly_timeout_s=60,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    client = RewardClient(ClientConfig(transport="http", http_url=f"{serve_instance}/{APP}", max_attempts=MAX_ATTEMPTS,
                                       backoff_s=0.1, max_backoff_s=0.2, deadline_s=300))
    members = [MemberRequest(group_id="counted", group_size=2, index=k, source="Hello there.",
                             candidate=["Hallo.", "Servus."][k], src_lang="en", trg_lang="de") for k in range(2)]

    async def run() -> tuple[list, list[str]]:
        calls = [asyncio.ensure_future(client.score_member(member)) for member in members]
        killed: list[str] = []
        deadline = time.monotonic() + 300
        while not all(call.done() for call in calls) and time.monotonic() < deadline:
            actor = await holder(handle)
            if actor is not None:
                ray.kill(ray.get_actor(actor, namespace="serve"), no_restart=True)
                killed.append(actor)
                # Until the replica is gone from the routers' view it may still be listed: not twice.
                while actor in replica_actor_names(APP).values() and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
            await asyncio.sleep(0.2)
        return await asyncio.gather(*calls), killed

    try:
        outcomes, killed = asyncio.run(run())
    finally:
        asyncio.run(client.aclose())
        serve.delete(APP)
    for outcome in outcomes:
        # Every send met a dying replica: the request ends unanswered, after exactly its attempts.
        assert outcome.result is None and outcome.failure == "unavailable", outcome
        assert outcome.attempts == MAX_ATTEMPTS, outcome
    # The sends that reached a replica (each killed the replica holding the group), all layers together.
    assert len(killed) == MAX_ATTEMPTS, killed
