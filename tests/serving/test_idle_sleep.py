"""A replica whose engine sleeps while idle (replicas.autoscaling.idle: sleep) wakes it for the work.

Real Ray Serve with the project's autoscaling policy, real HTTP through the client every caller uses
(RewardClient), the scripted engine standing in for vLLM's sleep mode (CUDA only) with a wake-up of
WAKE_S. The replica goes idle, its engine sleeps and the replica reports it to the autoscaling
policy; a group sent to it then waits for the wake-up and is scored once, with a valid verdict; and
members assembling do not wake it (they are a forecast, not work) until their group is complete.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import GroupRequest, MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, AutoscalingSettings, ReplicaSettings
from deployments.replica_lane import SLEEP_CHECK_S
from grrm_client import ClientConfig, RewardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "idle_sleep"
WAKE_S = 1.5
SLEEP_AFTER_S = 3.0  # long enough that a check right after a group sees it awake on a busy machine


@pytest.fixture(scope="module")
def url(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.02, wake_s=WAKE_S)),
        replicas=ReplicaSettings(
            num_cpus=0.1, gpus_per_rank=0,
            autoscaling=AutoscalingSettings(min_replicas=1, max_replicas=1, metrics_interval_s=0.5,
                                            look_back_period_s=2, idle="sleep", wake_s=WAKE_S,
                                            sleep_after_s=SLEEP_AFTER_S)),
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def replica() -> serve.handle.DeploymentHandle:
    return serve.get_deployment_handle("GRRMReplica", app_name=APP)


def wait_until_asleep(timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        info = replica().info.remote().result(timeout_s=10)
        if info["engine_sleep"]["sleeping"]:
            return info
        assert time.monotonic() < deadline, f"the engine did not sleep within {timeout_s} s: {info['engine_sleep']}"
        time.sleep(0.25)


GROUP = dict(source="Der Hund schläft.", src_lang="de", trg_lang="en")
CANDIDATES = ["The dog sleeps. [q=9]", "The dog is sleeping. [q=8]", "Dog sleep. [q=3]"]


async def score_group(url: str, group_id: str):
    client = RewardClient(ClientConfig(transport="http", http_url=url, deadline_s=120))
    try:
        started = time.monotonic()
        outcome = await client.score_group(GroupRequest(group_id=group_id, candidates=CANDIDATES, **GROUP))
        return outcome, time.monotonic() - started
    finally:
        await client.aclose()


async def score_members(url: str, group_id: str, assembling_s: float):
    """The group's members a rollout at a time: all but the last, then the last ``assembling_s`` later."""
    client = RewardClient(ClientConfig(transport="http", http_url=url, deadline_s=120))
    members = [MemberRequest(group_id=group_id, group_size=len(CANDIDATES), index=index, candidate=candidate, **GROUP)
               for index, candidate in enumerate(CANDIDATES)]
    try:
        first = [asyncio.create_task(client.score_member(member)) for member in members[:-1]]
        await asyncio.sleep(assembling_s)
        last_sent = time.monotonic()
        answers = await asyncio.gather(*first, client.score_member(members[-1]))
        return answers, time.monotonic() - last_sent
    finally:
        await client.aclose()


def test_an_idle_replica_sleeps_reports_it_and_wakes_for_the_next_group(url):
    # A first group is scored (the replica may have slept already if it was idle sleep_after_s before
    # the group came: then the group woke it).
    outcome, _ = asyncio.run(score_group(url, "warm"))
    assert outcome.result is not None and outcome.result.valid, (outcome.failure, outcome.error)

    # Idle for sleep_after_s: the engine sleeps, and the replica says so to the autoscaling policy.
    asleep = wait_until_asleep()
    # Every wake-up so far was for work.
    slept, woken_before = asleep["engine_sleep"]["sleeps"], asleep["engine_sleep"]["woken_for_work"]
    assert slept == woken_before + 1 and asleep["groups_scored"] == 1, asleep["engine_sleep"]
    assert replica().record_autoscaling_stats.remote().result(timeout_s=10)["sleeping"] == 1.0

    # A group sent to the sleeping replica waits for the wake-up, then gets one valid verdict.
    outcome, _ = asyncio.run(score_group(url, "after-sleep"))
    assert outcome.result is not None and outcome.result.valid, (outcome.failure, outcome.error)
    assert outcome.result.scores is not None and len(outcome.result.scores) == len(CANDIDATES)
    assert outcome.attempts == 1  # it waited for the wake-up (counted below), not for a retry
    awake = replica().info.remote().result(timeout_s=10)
    assert awake["groups_scored"] == 2  # scored once
    assert awake["engine_sleep"]["woken_for_work"] == woken_before + 1 and not awake["engine_sleep"]["sleeping"]
    assert replica().record_autoscaling_stats.remote().result(timeout_s=10)["sleeping"] == 0.0

    # Asleep again; members assembling leave it asleep; their complete group wakes it and is scored once.
    wait_until_asleep()
    answers, _ = asyncio.run(score_members(url, "members", assembling_s=2.0 * SLEEP_CHECK_S))
    assert all(answer.result is not None and answer.result.valid for answer in answers), [
        (answer.failure, answer.error) for answer in answers]
    assert len({(answer.result.replica, tuple(answer.result.group_scores)) for answer in answers}) == 1  # one verdict
    woken = replica().info.remote().result(timeout_s=10)
    assert woken["groups_scored"] == 3
    # One wake-up for the complete group (its members, assembling, left the engine asleep: the last one
    # waited for the wake-up). It may have slept again since: it is idle.
    assert woken["engine_sleep"]["woken_for_work"] == woken_before + 2, woken["engine_sleep"]
    assert woken["engine_sleep"]["sleeps"] >= slept + 1, woken["engine_sleep"]
