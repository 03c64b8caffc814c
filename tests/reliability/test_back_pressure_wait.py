"""A member refused as back pressure is waited out through the client every caller uses, against a real
replica that refuses: ``RewardClient`` with ``max_attempts: 1`` (one send for a real failure) retries an
``overloaded`` answer with backoff until the replica admits it, over the handle and over HTTP (where the
ingress answers 503 with Retry-After and retries nothing itself). The replica's tenant may have one group in
flight (``max_groups_in_flight: 1``): a second group is refused until the first one, held open by its missing
member, is scored. Scripted engine: the test is about admission and the retry contract."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, HTTPSettings, ReplicaSettings, TenantDefaults, TenantsSettings
from grrm_client import ClientConfig, RewardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "back-pressure"
TENANT = "patient"


def members(group: str) -> list[MemberRequest]:
    return [MemberRequest(tenant=TENANT, group_id=group, group_size=2, index=k, source=f"Source {group}.",
                          candidate=f"Kandidat {group}-{k} [q={3 + 4 * k}]", src_lang="en", trg_lang="de")
            for k in range(2)]


async def until(condition, what: str, timeout_s: float = 60.0) -> None:
    """Wait for an event (polled), failing with ``what`` if it never comes."""
    async def poll():
        while not await condition():
            await asyncio.sleep(0.1)

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except asyncio.TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


@pytest.fixture(scope="module")
def app_url(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05)),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0),
        tenants=TenantsSettings(default=TenantDefaults(max_groups_in_flight=1)),
        http=HTTPSettings(auth_token_env=None),
        assembly_timeout_s=120,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    try:
        yield f"{serve_instance}/{APP}"
    finally:
        serve.delete(APP)


@pytest.mark.parametrize("transport", ["handle", "http"])
def test_a_refused_member_waits_for_room_without_spending_its_one_attempt(app_url, transport):
    replica = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    client = RewardClient(ClientConfig(transport=transport, app_name=APP, http_url=app_url, token_env=None,
                                       tenant=TENANT, max_attempts=1, backoff_s=0.05, max_backoff_s=0.2,
                                       deadline_s=120))
    first, second = members(f"{transport}-first"), members(f"{transport}-second")

    async def in_flight() -> int:
        return (await replica.tenants.remote()).get(TENANT, {}).get("groups_in_flight", 0)

    async def scenario():
        held = asyncio.create_task(client.score_member(first[0]))  # its group waits for its second member
        await until(lambda: _equals(in_flight(), 1), "the first group in flight on the replica")
        refused = [asyncio.create_task(client.score_member(member)) for member in second]

        async def both_refused() -> bool:
            return client.loop.overloaded >= 2

        await until(both_refused, "the second group's members refused as overloaded")
        assert not any(task.done() for task in refused)  # refused, and still waiting for room: not given up
        completing = await client.score_member(first[1])  # the first group completes: room for the second
        return [await held, completing], await asyncio.gather(*refused)

    try:
        (held, completing), refused = asyncio.run(scenario())
    finally:
        asyncio.run(client.aclose())
    for outcome in (held, completing, *refused):
        assert outcome.result is not None and outcome.result.valid, (outcome.failure, outcome.error)
    assert [outcome.result.score for outcome in refused] == [3, 7]
    for outcome in refused:
        # Every send but the one that was answered was a refusal; none spent the single attempt.
        assert outcome.overloaded >= 1 and outcome.attempts == outcome.overloaded + 1
    assert held.overloaded == completing.overloaded == 0


async def _equals(value, expected) -> bool:
    return (await value) == expected
