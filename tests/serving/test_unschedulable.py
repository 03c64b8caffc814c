"""A deployment whose replicas can never be placed, on real Ray Serve over HTTP and handles: callers
get an error naming the missing resources at once instead of waiting for ever, and /healthz and
/v1/info say that no replica runs. The test cluster is CPU-only (conftest's serve_instance), so a
replica that asks for a GPU can never start."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from ray import serve
from ray.serve.exceptions import DeploymentUnavailableError

from cluster.engines import EngineConfig
from cluster.protocol.schema import GroupRequest
from deployments.app import build_app
from deployments.client import ScorerClient
from deployments.config import AppConfig, ReplicaSettings
from grrm_client import RewardClient
from grrm_handles.send import HandleSender
from grrm_client.adapters.verl.config import BridgeConfig
from grrm_handles.availability import DeploymentAvailability, ReplicasUnschedulableError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

APP = "needs-gpu"
GROUP = {"source": "Hello.", "candidates": ["Hallo.", "Guten Tag."], "src_lang": "en", "trg_lang": "de"}


@pytest.fixture(scope="module")
def gpu_app_url(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted"),
        # A pending replica is stopped at teardown: no need to wait Serve's 20 s default for it.
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=1, graceful_shutdown_timeout_s=1),
    )
    # Not serve.run: it waits for the application to run, which this one never does.
    serve.run_many([serve.RunTarget(target=build_app(config), name=APP, route_prefix=f"/{APP}")],
                   wait_for_applications_running=False)
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def post_until_answered(url: str, body: dict) -> httpx.Response:
    """The first answer other than the proxy's 404/503 for a route that is not up yet. A call left
    waiting instead of answered raises its 30 s client timeout."""
    deadline = time.monotonic() + 60
    while True:
        response = httpx.post(url, json=body, timeout=30)
        if response.headers.get("content-type", "").startswith("application/json") or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


def test_http_callers_get_503_naming_the_missing_gpu(gpu_app_url):
    response = post_until_answered(f"{gpu_app_url}/v1/score", {"groups": [GROUP]})  # answered, not left waiting
    assert response.status_code == 503, response.text
    body = response.json()
    assert "GRRMReplica" in body["error"] and '"GPU": 1.0' in body["error"], body
    assert body["detail"]["missing"] == {"GPU": 1.0} and body["detail"]["running"] == 0
    assert response.headers["Retry-After"]
    member = {"group_id": "g", "group_size": 2, "index": 0, "source": "Hello.", "candidate": "Hallo.",
              "src_lang": "en", "trg_lang": "de"}
    response = httpx.post(f"{gpu_app_url}/v1/score/member", json=member, timeout=30)
    assert response.status_code == 503 and '"GPU": 1.0' in response.json()["error"]


def test_health_and_info_say_no_replica_runs(gpu_app_url):
    post_until_answered(f"{gpu_app_url}/v1/score", {"groups": [GROUP]})  # the route is up
    health = httpx.get(f"{gpu_app_url}/healthz", timeout=30)
    assert health.status_code == 503 and health.json()["code"] == "unavailable"
    assert '"GPU": 1.0' in health.json()["error"]
    info = httpx.get(f"{gpu_app_url}/v1/info", timeout=30).json()
    assert info["replicas_running"] == 0 and info["replicas"].get("RUNNING", 0) == 0
    assert sum(info["replicas"].values()) == 1  # the one replica, still waiting for a node
    assert "GPU" in info["unschedulable"]


async def test_handle_callers_get_an_error_not_a_wait(gpu_app_url):
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    group = GroupRequest(**GROUP)
    with pytest.raises(ReplicasUnschedulableError, match='"GPU": 1.0') as raised:
        await asyncio.wait_for(ScorerClient(handle).group_result(group), 30)
    assert isinstance(raised.value, DeploymentUnavailableError)

    # The trainer bridge's handle transport: a retried "unavailable" that ends, with the reason.
    config = BridgeConfig(app_name=APP, max_attempts=2, backoff_s=0.1, deadline_s=60)
    outcome = await asyncio.wait_for(RewardClient(config, HandleSender(app=config)).score_group(group), 60)
    assert outcome.result is None and outcome.failure == "unavailable" and outcome.attempts == 2
    assert "ReplicasUnschedulableError" in outcome.error and '"GPU": 1.0' in outcome.error


async def test_a_call_already_waiting_fails_once_no_replica_can_start(gpu_app_url):
    """A call sent while the verdict was still "starting" (e.g. before Serve's own 30 s report on
    resources that exist but are taken) is given up as soon as the verdict changes."""
    from grrm_handles.availability import fetch_facts

    looks = []

    def first_starting(app, name):
        deployment, nodes = fetch_facts(app, name)
        looks.append(deployment)
        if len(looks) == 1:  # pretend a GPU node exists: the replica may still start
            nodes = nodes + [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}]
        return deployment, nodes

    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    client = ScorerClient(handle, availability=DeploymentAvailability(APP, "GRRMReplica", fetch=first_starting))
    with pytest.raises(ReplicasUnschedulableError, match='"GPU": 1.0'):  # not asyncio's TimeoutError
        await asyncio.wait_for(client.group_result(GroupRequest(**GROUP)), 30)
    assert len(looks) >= 2  # given up when the second look found no node to start on
