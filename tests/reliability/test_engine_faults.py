"""Engine faults on real Ray Serve: an engine that raises, returns garbage,
hangs or dies. Deadlines fire, callers get a clear error or a flagged failure, nothing waits
forever, and a replica whose engine died ends itself so that its work is scored on a live one.
The engine is scripted with injected failures: these tests are about how the service
handles a failing engine (tests/reliability/test_engine_death.py kills a real vLLM engine)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import ray
from ray import serve

from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from deployments.replica_list import replica_actor_names

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GROUP = {"source": "Hello there.", "candidates": ["Hallo.", "Servus."], "src_lang": "en", "trg_lang": "de"}


def faulty_app(name: str, serve_instance: str, **options) -> str:
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(**options)),
        scoring=ScoringConfig(retries=2, generation_timeout_s=1.0),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0,
                                 health_check_period_s=1.0, hang_timeout_s=3.0, health_check_timeout_s=5.0),
        assembly_timeout_s=10,
    )
    serve.run(build_app(config), name=name, route_prefix=f"/{name}")
    return f"{serve_instance}/{name}"


def score(url: str, timeout: float = 30) -> tuple[int, dict]:
    response = httpx.post(f"{url}/v1/score", json={"groups": [GROUP]}, timeout=timeout)
    return response.status_code, response.json()


def test_raising_engine_gives_a_flagged_failure(serve_instance):
    url = faulty_app("raises", serve_instance, error_rate=1.0)
    try:
        status, body = score(url)
        result = body["results"][0]
        assert status == 200 and not result["valid"] and result["scores"] is None
        assert result["failure"] == "engine_error" and "scripted" in result["error"]
    finally:
        serve.delete("raises")


def test_garbage_answers_are_retried_then_flagged(serve_instance):
    url = faulty_app("garbage", serve_instance, malformed_rate=1.0)
    try:
        status, body = score(url)
        result = body["results"][0]
        assert status == 200 and result["failure"] == "parse_failed" and result["attempts"] == 3
        assert result["scores"] is None
    finally:
        serve.delete("garbage")


def test_hanging_engine_hits_the_deadline_for_groups_and_members(serve_instance):
    url = faulty_app("hangs", serve_instance, hang_rate=1.0)
    try:
        status, body = score(url)  # three 1 s generation deadlines, then the flagged timeout (a hang: 30 s, raises)
        assert status == 200 and body["results"][0]["failure"] == "timeout"
        member = {"group_id": "h", "group_size": 1, "index": 0, "source": "s", "candidate": "c", "src_lang": "en", "trg_lang": "de"}
        # A group of one never reaches the engine; a group of two does, and times out.
        single = httpx.post(f"{url}/v1/score/member", json=member, timeout=30)
        assert single.status_code == 200 and single.json()["failure"] == "too_few_distinct"

        async def pair():
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(*(
                    http.post(f"{url}/v1/score/member", json={**member, "group_id": "h2", "group_size": 2,
                                                              "index": i, "candidate": f"c{i}"})
                    for i in range(2)
                ))

        answers = asyncio.run(pair())
        for answer in answers:
            assert answer.status_code == 504 and answer.json()["code"] == "timeout"
            assert "score" not in answer.json()  # an error body, not a result
    finally:
        serve.delete("hangs")


def live_replica(handle, timeout_s: float = 30) -> str:
    """The replica a handle reaches once its router has dropped a dead one.

    The driver's handle learns of a replica's death asynchronously (Serve's long poll), so a call
    made right after the death may still be routed to the dead actor and raise ActorDiedError.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return handle.info.remote().result(timeout_s=timeout_s)["replica"]
        except ray.exceptions.RayActorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_dead_engine_ends_its_replica_and_its_group_is_scored_on_the_new_one(serve_instance):
    url = faulty_app("dies", serve_instance, die_after_generations=1)
    handle = serve.get_deployment_handle("GRRMReplica", app_name="dies")
    try:
        first_replica = handle.info.remote().result(timeout_s=30)["replica"]
        status, body = score(url)
        assert status == 200 and body["results"][0]["valid"]  # served, then the engine died
        # The next group meets the dead engine: the replica ends itself at once, the call is
        # re-sent, and the group is scored on the replica Serve starts instead. The caller sees
        # a valid result, never engine_error (and never a made-up score).
        status, body = score(url, timeout=120)
        result = body["results"][0]
        assert status == 200 and result["valid"], result
        assert result["replica"] != first_replica
        # The first replica ended itself. (The one that scored the group may have ended too: every
        # replica's engine here dies after one generation, and on a loaded machine its next health
        # check can come before this look. So the check is on the first one, not on that.)
        assert first_replica not in replica_actor_names("dies")
    finally:
        serve.delete("dies")


# Serve's own health-check timeout in hang_app: far above what the replica's checks take (1 s apart, each
# waiting up to 2 s for the engine, 3 in a row to call it hung), so a group answered well before it was
# not rescued by Serve's check (a loaded machine adds seconds).
# Far past the stalled group's generation_timeout_s (60 s, retries 0): a group answered valid by a new
# replica was re-sent because the hang watch ended the first, not because Serve's own check did.
SERVE_CHECK_TIMEOUT_S = 600.0
HANG_TIMEOUT_S = 2.0
HANG_PROBES = 3


def hang_app(name: str, serve_instance: str, **options) -> tuple[str, object]:
    """One scripted replica whose engine is probed every second and counts as hung once HANG_PROBES checks
    in a row found no answer within HANG_TIMEOUT_S; Serve's own check would wait SERVE_CHECK_TIMEOUT_S."""
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(**options)),
        scoring=ScoringConfig(retries=0, generation_timeout_s=60.0),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0, health_check_period_s=1.0,
                                 hang_timeout_s=HANG_TIMEOUT_S, hang_probes=HANG_PROBES,
                                 health_check_timeout_s=SERVE_CHECK_TIMEOUT_S),
        assembly_timeout_s=60,
    )
    serve.run(build_app(config), name=name, route_prefix=f"/{name}")
    return f"{serve_instance}/{name}", serve.get_deployment_handle("GRRMReplica", app_name=name)


def test_a_hung_engine_is_found_within_the_hang_timeout_and_its_group_scored_elsewhere(serve_instance):
    url, handle = hang_app("stalls", serve_instance, stall_after_generations=1)
    try:
        first_replica = handle.info.remote().result(timeout_s=30)["replica"]
        status, body = score(url)
        assert status == 200 and body["results"][0]["valid"]  # served, then the engine hung
        # The next group hangs in the engine; the health checks find the hang within period +
        # hang_probes x hang_timeout (1 + 3 x 2 s), the replica ends, and the group is re-sent to the new one.
        started = time.monotonic()
        status, body = score(url, timeout=120)
        result = body["results"][0]
        assert status == 200 and result["valid"] and result["replica"] != first_replica, result
        # Found in ~7 s, then the new replica starts (a scripted engine: about a second). Unwatched, the
        # generation would time out first (60 s) and the group come back invalid.
        print(f"hung engine: group answered by a new replica after {time.monotonic() - started:.1f} s")
    finally:
        serve.delete("stalls")


def test_one_late_probe_under_load_does_not_cost_the_replica(serve_instance):
    # After the first generation, one health probe answers only after 1.5 x hang_timeout_s: the check
    # that started it misses it, a later one finds its answer, well inside hang_probes checks.
    url, handle = hang_app("late", serve_instance, per_prompt_s=0.2, slow_probes_after_generations=1,
                           slow_probe_s=1.5 * HANG_TIMEOUT_S)
    groups = [{**GROUP, "candidates": [f"Hallo {i}.", f"Servus {i}."]} for i in range(8)]
    try:
        first_replica = handle.info.remote().result(timeout_s=30)["replica"]
        # Groups are scored throughout (the load) until the replica has seen the late probe missed
        # and then answered; every group is scored on the first replica.
        deadline = time.monotonic() + 120
        while True:
            response = httpx.post(f"{url}/v1/score", json={"groups": groups}, timeout=60)
            assert response.status_code == 200
            results = response.json()["results"]
            assert all(r["valid"] and r["replica"] == first_replica for r in results), results
            probes = handle.info.remote().result(timeout_s=30)["health_probes"]
            if probes["recovered_total"] >= 1:
                break
            assert time.monotonic() < deadline, f"the late probe was never missed and answered: {probes}"
        assert probes["missed_total"] >= 1 and probes["consecutive_misses"] == 0, probes
        assert live_replica(handle) == first_replica  # never replaced
    finally:
        serve.delete("late")


def test_a_long_generation_is_not_a_hang(serve_instance):
    url, handle = hang_app("slow", serve_instance, per_prompt_s=8.0)
    try:
        first_replica = handle.info.remote().result(timeout_s=30)["replica"]
        status, body = score(url, timeout=60)  # one generation of 8 s: past 3 checks of 2 s
        result = body["results"][0]
        assert status == 200 and result["valid"] and result["replica"] == first_replica
        assert live_replica(handle) == first_replica  # never replaced
    finally:
        serve.delete("slow")
