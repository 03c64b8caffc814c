"""Many runs on one pool, through the real HTTP API and the client: group ids scoped by tenant, tokens
bound to tenants, fair share of a replica's engine (by tenant, weight and priority class), a per-tenant
limit of groups in flight, GET /v1/tenants and per-tenant metrics.

Engine: scripted, one generation at a time at a fixed time per group, so that complete groups wait for
the engine and the order they are served in is the feature under test (the replica's fair gate)."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest
import ray
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import GroupRequest
from deployments.app import build_app
from deployments.config import AppConfig, HTTPSettings, ReplicaSettings, TenantSettings
from grrm_client import ClientConfig, RewardClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "tenants"
SERVICE_S = 0.2  # scripted engine time per group, one at a time
SHARED_TOKEN = "shared-7d1c"
ALICE_TOKEN = "alice-93be"


def group(tag: str, index: int, *, tenant: str | None = None, good: int = 8, bad: int = 2) -> dict:
    body = {"group_id": f"{tag}{index}", "source": f"Sentence {tag} {index}.",
            "candidates": [f"good {tag}{index} [q={good}]", f"bad {tag}{index} [q={bad}]"],
            "src_lang": "en", "trg_lang": "de"}
    if tenant is not None:
        body["tenant"] = tenant
    return body


def member(group_id: str, index: int, candidate: str, *, tenant: str | None = None, source: str = "Shared.") -> dict:
    body = {"group_id": group_id, "group_size": 2, "index": index, "source": source, "candidate": candidate,
            "src_lang": "en", "trg_lang": "de"}
    if tenant is not None:
        body["tenant"] = tenant
    return body


SHARED = {"Authorization": f"Bearer {SHARED_TOKEN}"}
ALICE = {"Authorization": f"Bearer {ALICE_TOKEN}"}


@pytest.fixture(scope="module")
def url(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=SERVICE_S,
                                                                            max_concurrent_prompts=1)),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0, max_ongoing_requests=400),
        http=HTTPSettings(
            auth_token_env="GRRM_TEST_SHARED_TOKEN",
            env_vars={"GRRM_TEST_SHARED_TOKEN": SHARED_TOKEN, "GRRM_TEST_ALICE_TOKEN": ALICE_TOKEN},
            tenants=[
                TenantSettings(name="alice", token_env="GRRM_TEST_ALICE_TOKEN"),
                TenantSettings(name="capped", max_groups_in_flight=2),
                TenantSettings(name="eval", priority=-1),
                TenantSettings(name="heavy", weight=2.0),
            ],
        ),
        assembly_timeout_s=20,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def recent(since: float) -> list[dict]:
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    return handle.recent_groups.remote(since).result(timeout_s=30)


async def post_groups(http: httpx.AsyncClient, url: str, bodies: list[dict], headers: dict) -> list[httpx.Response]:
    """Each group in a request of its own, all at once, as many callers would send them."""
    return await asyncio.gather(*(http.post(f"{url}/v1/score", json={"groups": [body]}, headers=headers)
                                  for body in bodies))


async def post_members(http: httpx.AsyncClient, url: str, bodies: list[dict], headers: dict) -> list[httpx.Response]:
    """Each group's candidates as members, each in a request of its own, all at once (as the trainer
    bridge sends rollouts)."""
    def members(body: dict) -> list[dict]:
        return [{"group_id": body["group_id"], "group_size": len(body["candidates"]), "index": index,
                 "source": body["source"], "candidate": candidate, "src_lang": body["src_lang"],
                 "trg_lang": body["trg_lang"], "tenant": body.get("tenant", "default")}
                for index, candidate in enumerate(body["candidates"])]

    return await asyncio.gather(*(http.post(f"{url}/v1/score/member", json=one, headers=headers)
                                  for body in bodies for one in members(body)))


async def tenants_once_in_flight(http: httpx.AsyncClient, url: str, tenants: tuple[str, ...], groups: int,
                                 within_s: float = 30.0) -> httpx.Response:
    """The ``/v1/tenants`` answer once ``tenants`` together hold ``groups`` groups in flight (polled: on a
    loaded machine they arrive over seconds), or the last one after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        answer = await http.get(f"{url}/v1/tenants", headers=SHARED)
        now = answer.json()["tenants"]
        if (sum(now.get(tenant, {}).get("groups_in_flight", 0) for tenant in tenants) >= groups
                or time.monotonic() > deadline):
            return answer
        await asyncio.sleep(0.02)


def tenants_now(url: str) -> dict[str, dict]:
    answer = httpx.get(f"{url}/v1/tenants", headers=SHARED, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["tenants"]


def test_another_tenants_member_under_the_same_group_id_never_joins_the_group(url):
    async def scenario():
        async with httpx.AsyncClient(timeout=60) as http:
            # bob sends a poisoned member 0 of "g-shared" first, as if to claim alice's group.
            poison = asyncio.create_task(http.post(
                f"{url}/v1/score/member", headers=SHARED,
                json=member("g-shared", 0, "poison [q=0]", tenant="bob", source="Poison.")))
            await asyncio.sleep(0.5)
            # alice (by her token, no tenant in the body) sends both members under the same id.
            answers = await asyncio.gather(
                http.post(f"{url}/v1/score/member", headers=ALICE, json=member("g-shared", 0, "good [q=9]")),
                http.post(f"{url}/v1/score/member", headers=ALICE, json=member("g-shared", 1, "bad [q=1]")),
            )
            # bob's member completes only with bob's own member 1: alice's did not join it.
            bobs_other = await http.post(f"{url}/v1/score/member", headers=SHARED,
                                         json=member("g-shared", 1, "other [q=5]", tenant="bob", source="Poison."))
            return answers, await poison, bobs_other

    started = time.time()
    answers, poison, bobs_other = asyncio.run(scenario())
    assert [answer.status_code for answer in answers] == [200, 200]
    results = [answer.json() for answer in answers]
    assert [result["valid"] for result in results] == [True, True]
    assert [result["score"] for result in results] == [pytest.approx(9), pytest.approx(1)]
    assert poison.status_code == 200 and bobs_other.status_code == 200
    assert [poison.json()["score"], bobs_other.json()["score"]] == [pytest.approx(0), pytest.approx(5)]
    # Two groups, each of its own tenant, under the one id the callers used.
    traces = [trace for trace in recent(started) if trace["group_id"] == "g-shared"]
    assert sorted(trace["tenant"] for trace in traces) == ["alice", "bob"]


def test_a_token_decides_its_tenant_and_a_body_cannot_claim_another(url):
    async def scenario():
        async with httpx.AsyncClient(timeout=60) as http:
            return {
                "alice claims zed": await http.post(f"{url}/v1/score", headers=ALICE,
                                                    json={"groups": [group("t", 1, tenant="zed")]}),
                "shared claims alice": await http.post(f"{url}/v1/score", headers=SHARED,
                                                       json={"groups": [group("t", 2, tenant="alice")]}),
                "no token": await http.post(f"{url}/v1/score", json={"groups": [group("t", 3)]}),
                "wrong token": await http.post(f"{url}/v1/score", headers={"Authorization": "Bearer nope"},
                                               json={"groups": [group("t", 4)]}),
                "bad name": await http.post(f"{url}/v1/score", headers=SHARED,
                                            json={"groups": [group("t", 5, tenant="no spaces!")]}),
                "alice": await http.post(f"{url}/v1/score", headers=ALICE, json={"groups": [group("t", 6)]}),
                "alice by name": await http.post(f"{url}/v1/score", headers=ALICE,
                                                 json={"groups": [group("t", 7, tenant="alice")]}),
            }

    alice_before = tenants_now(url).get("alice", {}).get("recent_groups", 0)
    answers = asyncio.run(scenario())
    for case in ("alice claims zed", "shared claims alice"):
        assert answers[case].status_code == 403, case
        assert answers[case].json()["code"] == "forbidden"
        assert "tenant" in answers[case].json()["error"]
    assert answers["no token"].status_code == 401 and answers["wrong token"].status_code == 401
    assert answers["bad name"].status_code == 422
    assert "tenant" in str(answers["bad name"].json()["detail"])
    assert answers["alice"].status_code == 200 and answers["alice by name"].status_code == 200
    # Both of alice's were counted as hers; nothing refused was scored.
    tenants = tenants_now(url)
    assert tenants["alice"]["recent_groups"] == alice_before + 2
    assert "zed" not in tenants


def served_order(since: float, tenants: set[str]) -> list[str]:
    """The tenants of the groups scored since ``since``, in the order the engine took them (one at a time:
    the order it finished them)."""
    traces = [trace for trace in recent(since) if trace["tenant"] in tenants]
    return [trace["tenant"] for trace in sorted(traces, key=lambda trace: trace["scoring_ended_at"])]


def run_flood_and_small(url: str, flood: str, small: str, *, flood_groups: int = 24, small_groups: int = 3):
    async def scenario():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as http:
            flooding = asyncio.create_task(post_members(
                http, url, [group(f"{flood}-", i, tenant=flood) for i in range(flood_groups)], SHARED))
            await asyncio.sleep(4 * SERVICE_S)  # the flood holds the engine and its queue
            answers = await post_members(http, url, [group(f"{small}-after-{flood}-", i, tenant=small)
                                                     for i in range(small_groups)], SHARED)
            return answers, await flooding

    started = time.time()
    small_answers, flood_answers = asyncio.run(scenario())
    assert all(answer.status_code == 200 and answer.json()["valid"] for answer in small_answers + flood_answers)
    return served_order(started, {flood, small})


def test_a_small_run_is_served_beside_a_flood_not_behind_it(url):
    order = run_flood_and_small(url, "sweep", "bob")
    # First come, first served would take all 24 of the sweep's groups first (about 20 were still waiting
    # when bob's came). Fair share alternates: at most one sweep group between two of bob's (equal costs).
    last_small = max(position for position, tenant in enumerate(order) if tenant == "bob")
    first_small = order.index("bob")
    assert order[first_small:last_small + 1].count("sweep") <= 2, order
    assert order[last_small + 1:].count("sweep") >= 10, order  # bob's came while most of the sweep waited


def test_a_lower_priority_class_waits_for_a_higher_one(url):
    order = run_flood_and_small(url, "eval", "bob")
    first_small = order.index("bob")
    assert order[first_small:first_small + 3] == ["bob"] * 3, order  # evaluation goes below training
    assert order[first_small + 3:].count("eval") >= 10, order  # ahead of the evaluation's waiting groups


def test_weights_share_the_engine_between_backlogged_tenants(url):
    async def scenario():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as http:
            answers = await post_members(http, url, [group(f"{tenant}-w", i, tenant=tenant)
                                                     for i in range(12) for tenant in ("carol", "heavy")], SHARED)
            assert all(answer.status_code == 200 for answer in answers)

    started = time.time()
    asyncio.run(scenario())
    order = served_order(started, {"carol", "heavy"})
    # While both are backlogged (the first 12 served), heavy (weight 2) gets two of every three.
    assert 7 <= order[:12].count("heavy") <= 9, order


def test_a_tenant_over_its_limit_gets_503_and_the_others_do_not(url):
    async def scenario():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as http:
            capped = asyncio.create_task(post_groups(
                http, url, [group("capped-", i, tenant="capped") for i in range(6)], SHARED))
            others = asyncio.create_task(post_groups(
                http, url, [group("dave-", i, tenant="dave") for i in range(6)], SHARED))
            capped, others = await capped, await others
            # While the capped tenant holds its 2 groups (members waiting for their mates hold them: no race
            # with the engine finishing), a member of a third group is refused too; the held ones then complete.
            held = [asyncio.create_task(http.post(f"{url}/v1/score/member", headers=SHARED,
                                                  json=member(f"capped-h{i}", 0, "x [q=3]", tenant="capped")))
                    for i in range(2)]
            await tenants_once_in_flight(http, url, ("capped",), 2)
            member_answer = await http.post(f"{url}/v1/score/member", headers=SHARED,
                                            json=member("capped-m", 0, "x [q=3]", tenant="capped"))
            mates = [await http.post(f"{url}/v1/score/member", headers=SHARED,
                                     json=member(f"capped-h{i}", 1, "y [q=5]", tenant="capped")) for i in range(2)]
            return capped, others, member_answer, [await answer for answer in held] + mates

    capped, others, member_answer, completed = asyncio.run(scenario())
    statuses = sorted(answer.status_code for answer in capped)
    assert statuses.count(200) >= 2 and statuses.count(503) >= 2, statuses
    for answer in capped:
        if answer.status_code == 503:
            assert answer.json()["code"] == "overloaded" and "capped" in answer.json()["error"]
            assert "retry-after" in answer.headers
    assert [answer.status_code for answer in others] == [200] * 6
    assert member_answer.status_code == 503 and member_answer.json()["code"] == "overloaded"
    assert [answer.status_code for answer in completed] == [200] * 4, [answer.text for answer in completed]

    # The client retries the refusals: every one of the capped tenant's groups is scored in the end.
    async def through_the_client():
        client = RewardClient(ClientConfig(transport="http", http_url=url, token_env="GRRM_TEST_SHARED_TOKEN",
                                           tenant="capped", max_attempts=40, backoff_s=0.1, max_backoff_s=0.5,
                                           deadline_s=120))
        try:
            return await asyncio.gather(*(client.score_group(GroupRequest.model_validate(group("cc-", i)))
                                          for i in range(6)))
        finally:
            await client.aclose()

    os.environ["GRRM_TEST_SHARED_TOKEN"] = SHARED_TOKEN
    try:
        outcomes = asyncio.run(through_the_client())
    finally:
        del os.environ["GRRM_TEST_SHARED_TOKEN"]
    assert all(outcome.result is not None and outcome.result.valid for outcome in outcomes)
    assert sum(outcome.attempts for outcome in outcomes) > 6  # some were refused and retried


def test_tenants_endpoint_and_metrics_count_each_tenant(url):
    async def scenario():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as http:
            sending = asyncio.create_task(post_groups(
                http, url, [group(f"{tenant}-v", i, tenant=tenant) for i in range(6) for tenant in ("erin", "frank")],
                SHARED))
            during = await tenants_once_in_flight(http, url, ("erin", "frank"), 6)
            await sending
            after = await http.get(f"{url}/v1/tenants", headers=SHARED)
            unauthorized = await http.get(f"{url}/v1/tenants")
            return during, after, unauthorized

    during, after, unauthorized = asyncio.run(scenario())
    assert unauthorized.status_code == 401
    assert during.status_code == 200 and after.status_code == 200
    now = during.json()["tenants"]
    assert now["erin"]["groups_in_flight"] + now["frank"]["groups_in_flight"] >= 6
    assert now["erin"]["waiting_for_engine"] + now["frank"]["waiting_for_engine"] >= 4
    shares = after.json()["tenants"]
    assert shares["erin"]["recent_groups"] == 6 and shares["frank"]["recent_groups"] == 6
    assert shares["erin"]["groups_in_flight"] == 0
    assert sum(work["recent_share"] for work in shares.values()) == pytest.approx(1.0)
    assert shares["erin"]["recent_share"] == pytest.approx(shares["frank"]["recent_share"], rel=0.2)

    # Prometheus: the groups and tokens of each tenant under its label (Ray exports every few seconds,
    # so an export may hold part of the count: wait for the whole of it).
    port = ray._private.worker.global_worker.node.metrics_export_port
    deadline = time.monotonic() + 60

    def all_six(lines: list[str]) -> bool:
        return any(line.startswith("ray_grrm_tenant_groups") and line.rstrip().endswith(" 6.0") for line in lines)

    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        lines = [line for line in text.splitlines() if 'tenant="erin"' in line]
        if all_six(lines) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all_six(lines), lines
    assert any(line.startswith("ray_grrm_tenant_prompt_tokens") for line in lines), lines
    assert any(line.startswith("ray_grrm_tenant_queue_wait_s_bucket") for line in lines), lines
    # The capped tenant's refusals (an earlier test) are its failures of kind "overloaded".
    assert any(line.startswith("ray_grrm_tenant_failures") and 'tenant="capped"' in line
               and 'failure="overloaded"' in line for line in text.splitlines())


def test_tenants_endpoint_asks_every_replica(serve_instance):
    """Over several replicas: each is asked under a request id of its own (one HTTP request's fan-out
    shares its id, and Serve would fulfil the calls as one and leave the rest waiting)."""
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05)),
        replicas=ReplicaSettings(num_replicas=3, num_cpus=0.25, gpus_per_rank=0),
        http=HTTPSettings(auth_token_env=None),
    )
    serve.run(build_app(config), name="tenants-three", route_prefix="/tenants-three")
    url = f"{serve_instance}/tenants-three"
    try:
        async def scenario():
            async with httpx.AsyncClient(timeout=60) as http:
                answers = await post_groups(http, url, [group("spread-", i, tenant="gina") for i in range(12)], {})
                assert all(answer.status_code == 200 for answer in answers)
                return await http.get(f"{url}/v1/tenants", timeout=20)

        answer = asyncio.run(scenario())
        assert answer.status_code == 200
        assert answer.json()["replicas"] == 3
        assert answer.json()["tenants"]["gina"]["recent_groups"] == 12  # summed over the three
    finally:
        serve.delete("tenants-three")
