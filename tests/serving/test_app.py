"""The reward application on real Ray Serve: HTTP and handle APIs, member assembly across
replicas, the group-aware router, bad input and overload. The engine is the scripted one:
these tests are about serving and routing (tests/serving/test_vllm_app.py runs real vLLM)."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import GroupRequest, MemberRequest
from deployments.app import build_app
from deployments.client import ScorerClient
from deployments.config import AppConfig, LimitSettings, ReplicaSettings
from grrm_handles.send import to_replica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def scripted_app(**replica_settings) -> AppConfig:
    replicas = {"num_replicas": 2, "num_cpus": 0.5, "gpus_per_rank": 0, **replica_settings}
    return AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05)),
        replicas=ReplicaSettings(**replicas),
        limits=LimitSettings(max_groups_per_request=8, max_candidates_per_group=8, max_text_chars=2000),
        assembly_timeout_s=5,
    )


@pytest.fixture(scope="module")
def app_url(serve_instance):
    serve.run(build_app(scripted_app()), name="grrm", route_prefix="/grrm")
    yield f"{serve_instance}/grrm"
    serve.delete("grrm")


def demo_group(i: int, n: int = 4) -> dict:
    return {
        "group_id": f"g{i}",
        "source": f"Source sentence number {i}.",
        "candidates": [f"candidate {i}-{k} [q={(i + 3 * k) % 11}]" for k in range(n)],
        "src_lang": "en",
        "trg_lang": "de",
    }


def expected_scores(group: dict) -> list[int]:
    return [int(c.rsplit("[q=", 1)[1].rstrip("]")) for c in group["candidates"]]


def test_whole_groups_over_http_in_request_order(app_url):
    groups = [demo_group(i) for i in range(5)]
    response = httpx.post(f"{app_url}/v1/score", json={"groups": groups}, timeout=60)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["group_id"] for r in results] == [g["group_id"] for g in groups]
    for group, result in zip(groups, results):
        assert result["valid"] and result["error"] is None
        assert result["scores"] == expected_scores(group)
        assert result["replica"] and result["attempts"] == 1
        assert result["usage"]["prompt_tokens"] > 0
        assert result["answer"] is None  # raw answers only with http.include_answers


def test_members_sent_shuffled_from_concurrent_clients_meet_on_one_replica(app_url):
    groups = [demo_group(100 + i) for i in range(16)]
    members = [
        {
            "group_id": g["group_id"], "group_size": len(g["candidates"]), "index": k, "source": g["source"],
            "candidate": c, "src_lang": "en", "trg_lang": "de",
        }
        for g in groups
        for k, c in enumerate(g["candidates"])
    ]
    random.Random(7).shuffle(members)

    async def client(batch):
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*(http.post(f"{app_url}/v1/score/member", json=m) for m in batch))

    async def run_all():
        batches = [members[i::4] for i in range(4)]
        return [r for rs in await asyncio.gather(*(client(b) for b in batches)) for r in rs]

    responses = asyncio.run(run_all())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    by_group: dict[str, list[dict]] = {}
    for response in responses:
        body = response.json()
        by_group.setdefault(body["group_id"], []).append(body)
    for group in groups:
        answers = by_group[group["group_id"]]
        assert sorted(a["index"] for a in answers) == [0, 1, 2, 3]
        assert len({a["replica"] for a in answers}) == 1, "members of one group met on different replicas"
        assert all(a["valid"] for a in answers)
        assert {a["index"]: a["score"] for a in answers} == dict(enumerate(expected_scores(group)))
    # Each group was scored exactly once: the replicas' assemblers scored 16 groups in total.
    handle = serve.get_deployment_handle("GRRMReplica", app_name="grrm")
    replicas = {a["replica"] for answers in by_group.values() for a in answers}
    scored = [to_replica(handle, name).info.remote().result(timeout_s=30) for name in replicas]
    assert sorted(info["replica"] for info in scored) == sorted(replicas)
    assert sum(info["assembler"]["groups_scored"] for info in scored) == 16
    # The group-aware router spread groups over both replicas.
    assert len({a["replica"] for answers in by_group.values() for a in answers}) == 2


def test_handle_api_scores_groups_and_members(app_url):
    client = ScorerClient(serve.get_deployment_handle("GRRMReplica", app_name="grrm"))
    group = demo_group(300)

    async def run():
        whole = await client.group_result(GroupRequest(**group))
        members = await asyncio.gather(*(
            client.member_result(MemberRequest(
                group_id="h300", group_size=4, index=k, source=group["source"], candidate=c,
                src_lang="en", trg_lang="de",
            ))
            for k, c in enumerate(group["candidates"])
        ))
        return whole, members

    whole, members = asyncio.run(run())
    assert whole.valid and whole.scores == expected_scores(group)
    assert [m.score for m in members] == expected_scores(group)


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [
        ({"groups": [{"source": "s", "candidates": ["only one"], "src_lang": "en", "trg_lang": "de"}]}, 422, "candidates"),
        ({"groups": [{"source": "s", "candidates": ["a", "b"], "src_lang": "xx", "trg_lang": "de"}]}, 422, "src_lang"),
        ({"groups": [{"source": 5, "candidates": ["a", "b"], "src_lang": "en", "trg_lang": "de"}]}, 422, "source"),
        ({"groups": [{"source": "s", "candidates": ["a", "b"], "src_lang": "en", "trg_lang": "de", "x": 1}]}, 422, "x"),
        ({"groups": []}, 422, "groups"),
        ({"groups": [demo_group(i) for i in range(9)]}, 413, "max_groups_per_request"),
        ({"groups": [demo_group(1, n=9)]}, 413, "max_candidates_per_group"),
        ({"groups": [{**demo_group(1), "source": "x" * 2001}]}, 413, "max_text_chars"),
    ],
)
def test_bad_group_requests_get_the_documented_4xx(app_url, body, status, names):
    response = httpx.post(f"{app_url}/v1/score", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert names in response.json()["error"]


def test_bad_and_conflicting_members(app_url):
    base = {"group_id": "c1", "group_size": 2, "index": 0, "source": "s", "candidate": "a", "src_lang": "en", "trg_lang": "de"}
    bad = httpx.post(f"{app_url}/v1/score/member", json={**base, "index": 2}, timeout=30)
    assert bad.status_code == 422 and "index" in bad.json()["error"]
    negative = httpx.post(f"{app_url}/v1/score/member", json={**base, "group_size": -1}, timeout=30)
    assert negative.status_code == 422 and "group_size" in negative.json()["error"]

    async def run():
        async with httpx.AsyncClient(timeout=30) as http:
            first = asyncio.create_task(http.post(f"{app_url}/v1/score/member", json=base))
            await asyncio.sleep(0.5)
            conflicting = await http.post(f"{app_url}/v1/score/member", json={**base, "index": 1, "source": "other"})
            completing = await http.post(f"{app_url}/v1/score/member", json={**base, "index": 1, "candidate": "b"})
            return await first, conflicting, completing

    first, conflicting, completing = asyncio.run(run())
    assert conflicting.status_code == 409 and "source" in conflicting.json()["error"]
    assert conflicting.json()["code"] == "conflict" and set(conflicting.json()) == {"code", "error", "detail"}
    assert first.status_code == 200 and completing.status_code == 200
    assert first.json()["replica"] == completing.json()["replica"]


def test_incomplete_group_times_out_with_504(app_url):
    member = {"group_id": "lonely", "group_size": 3, "index": 0, "source": "s", "candidate": "a", "src_lang": "en", "trg_lang": "de"}
    response = httpx.post(f"{app_url}/v1/score/member", json=member, timeout=30)
    assert response.status_code == 504
    body = response.json()
    assert body["code"] == "timeout" and "1 of 3" in body["error"] and body["detail"]["replica"]
    assert set(body) == {"code", "error", "detail"}  # the one error body, never a result as well


def test_info_and_health(app_url):
    assert httpx.get(f"{app_url}/healthz", timeout=10).json() == {"status": "ok"}
    info = httpx.get(f"{app_url}/v1/info", timeout=10).json()
    assert info["engine"] == "scripted" and info["prompt_type"] == "ranking_score"
    assert info["replicas"].get("RUNNING") == 2


def test_saturated_deployment_answers_503_with_retry_after(serve_instance):
    config = scripted_app(num_replicas=1, max_ongoing_requests=1, max_queued_requests=1)
    config.engine.scripted.per_prompt_s = 1.0
    serve.run(build_app(config), name="small", route_prefix="/small")
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=60) as http:
                return await asyncio.gather(*(
                    http.post(f"{serve_instance}/small/v1/score", json={"groups": [demo_group(i)]}) for i in range(8)
                ))

        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert 503 in codes and 200 in codes, codes
        rejected = next(r for r in responses if r.status_code == 503)
        assert rejected.headers.get("retry-after") == "1"
        assert rejected.json()["code"] == "overloaded"
    finally:
        serve.delete("small")


def test_an_overloaded_assembler_answers_503_with_retry_after_and_the_group_completes_later(serve_instance):
    # One group assembling at a time: a member of a second group is refused as overload (retry
    # later), not as a conflict; once the first group is scored the second one is taken.
    config = scripted_app(num_replicas=1, max_assembling_groups=1)
    serve.run(build_app(config), name="assembling", route_prefix="/assembling")
    url = f"{serve_instance}/assembling/v1/score/member"

    def member(group: str, index: int) -> dict:
        return {"group_id": group, "group_size": 2, "index": index, "source": f"s {group}",
                "candidate": f"c{index}", "src_lang": "en", "trg_lang": "de"}

    async def run():
        async with httpx.AsyncClient(timeout=30) as http:
            waiting = asyncio.create_task(http.post(url, json=member("first", 0)))
            await asyncio.sleep(0.5)
            refused = await http.post(url, json=member("second", 0))
            completing = await http.post(url, json=member("first", 1))
            later = await asyncio.gather(http.post(url, json=member("second", 0)), http.post(url, json=member("second", 1)))
            return await waiting, refused, completing, later

    try:
        waiting, refused, completing, later = asyncio.run(run())
    finally:
        serve.delete("assembling")
    assert refused.status_code == 503 and refused.headers.get("retry-after") == "1", refused.text
    assert refused.json()["code"] == "overloaded"
    assert waiting.status_code == completing.status_code == 200
    assert [answer.status_code for answer in later] == [200, 200] and all(a.json()["valid"] for a in later)


def test_members_of_a_group_survive_the_death_of_their_replica(serve_instance):
    import ray

    config = scripted_app(num_replicas=2)
    serve.run(build_app(config), name="dying", route_prefix="/dying")
    client = ScorerClient(serve.get_deployment_handle("GRRMReplica", app_name="dying"))
    group = demo_group(500)
    members = [
        MemberRequest(group_id="g500", group_size=4, index=k, source=group["source"], candidate=c, src_lang="en", trg_lang="de")
        for k, c in enumerate(group["candidates"])
    ]

    async def run():
        waiting = [asyncio.create_task(client.member_result(m)) for m in members[:3]]
        owner = await _replica_with_waiting_members("dying", 3)
        actor_name = next(n for n in _actor_names() if n.endswith(owner["replica"]) and "dying" in n)
        ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)
        last = await client.member_result(members[3])
        return owner["replica"], await asyncio.gather(*waiting), last

    try:
        dead, answers, last = asyncio.run(run())
        answers = [*answers, last]
        assert all(a.valid for a in answers), [a.error for a in answers]
        assert [a.score for a in answers] == expected_scores(group)
        assert len({a.replica for a in answers}) == 1 and answers[0].replica != dead
        assert client.replica_failures >= 3  # the three waiting members were re-sent
    finally:
        serve.delete("dying")


def _actor_names() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == "serve"]


def _replica_names(app_name: str) -> list[str]:
    return [n.rsplit("#", 1)[-1] for n in _actor_names() if f"{app_name}#GRRMReplica" in n]


async def _replica_with_waiting_members(app_name: str, count: int, timeout_s: float = 30.0) -> dict:
    """The info of the replica where ``count`` members wait (polls: routing takes a moment)."""
    handle = serve.get_deployment_handle("GRRMReplica", app_name=app_name)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for name in _replica_names(app_name):
            info = await to_replica(handle, name).info.remote()
            if info["assembler"]["members_waiting"] == count:
                return info
        await asyncio.sleep(0.2)
    raise AssertionError(f"no replica of {app_name} has {count} members waiting")
