"""The bridge against the real reward application on a local Ray cluster (scripted engine).

* verl's own ``RewardLoopWorker`` actors build the manager from an importlib config and get the
  rollouts of several groups in random order, each from a randomly chosen worker -- exactly how
  verl 0.9.1's agent loops stream rewards; every group is scored once, on one replica.
* A re-sent member on the real service is not counted twice.
* The whole-batch path through a handle, the member API over HTTP, and retries on real 503s.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import ray
from ray import serve

from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import GroupRequest, MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from grrm_client.adapters.verl.batch import compute_batch_rewards
from grrm_client import RewardClient
from grrm_client.adapters.verl.config import BridgeConfig
from grrm_client.adapters.verl.extra_info import row_components
from grrm_handles.send import to_replica

from .helpers import agent_loop_row, codeblock, padded_batch, quality_text, row_fields, verl_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "grrm_bridge"


def scripted_app(**replicas) -> AppConfig:
    settings = {"num_replicas": 2, "num_cpus": 0.25, "gpus_per_rank": 0, **replicas}
    return AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05)),
        replicas=ReplicaSettings(**settings),
        # The service's recipe scales the score: the bridge sets nothing of the reward.
        tenants={"default": {"recipe": {"parts": {"grrm": {"scale": 0.1}}}}},
        # Longer than verl's workers take to send the barrier test's 1050 waiting members: at 20 s, on a
        # loaded CI machine (~31 calls/s), the first ones timed out before the last arrived and no more
        # than 618 ever waited at once.
        assembly_timeout_s=90,
    )


@pytest.fixture(scope="module")
def app_url(ray_serve):
    serve.run(build_app(scripted_app()), name=APP, route_prefix=f"/{APP}")
    yield f"{ray_serve}/{APP}"
    serve.delete(APP)


def replica_names(app: str = APP) -> list[str]:
    """Replica ids of the app's scorer deployment (Serve names replica actors after them)."""
    prefix = f"SERVE_REPLICA::{app}#GRRMReplica#"
    return sorted(
        entry["name"][len(prefix):]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["name"].startswith(prefix)
    )


def replica_stats() -> dict[str, dict]:
    """The assembler counters of every replica of the app (the router honours target_replica)."""
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    names = replica_names()
    assert len(names) == 2, names
    return {name: to_replica(handle, name).info.remote().result(timeout_s=30)["assembler"] for name in names}


async def areplica_stats() -> dict[str, dict]:
    """:func:`replica_stats` from inside an event loop."""
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    names = replica_names()
    assert len(names) == 2, names
    return {name: (await to_replica(handle, name).info.remote())["assembler"] for name in names}


def total(stats: dict[str, dict], key: str) -> int:
    return sum(s[key] for s in stats.values())


def test_verl_reward_workers_stream_members_in_random_order(app_url, tiny_model_dir):
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    n, groups = 4, 6
    config = verl_config(
        n=n, model_path=str(tiny_model_dir), reward_kwargs={"app_name": APP}
    )
    workers = [ray.remote(RewardLoopWorker).options(num_cpus=0).remote(config, None) for _ in range(3)]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(42)
    rollouts, expected = [], []
    for g in range(groups):
        for j in range(n):
            q = rng.randrange(11)
            uid = f"stream-{g}"
            if (g, j) == (2, 1):
                rollouts.append((uid, g * n + j, "forgot the code block"))
                expected.append(None)
            else:
                rollouts.append((uid, g * n + j, codeblock(quality_text(g, j, q))))
                expected.append(q)
    before = replica_stats()
    order = list(range(len(rollouts)))
    rng.shuffle(order)
    refs = {}
    for i in order:  # each finished rollout goes to a random reward worker, as in verl's agent loop
        uid, priority, response = rollouts[i]
        refs[i] = rng.choice(workers).compute_score.remote(agent_loop_row(tokenizer, response, row_fields(uid, priority)))
    answers = dict(zip(refs, ray.get(list(refs.values()), timeout=120)))
    for i, q in enumerate(expected):
        info = answers[i]["reward_extra_info"]
        if q is None:
            assert answers[i]["reward_score"] == 0.0 and info["failure"] == "invalid_extraction"
        else:
            assert answers[i]["reward_score"] == pytest.approx(0.1 * q) and info["valid"] and info["raw_score"] == q
            assert row_components(info) == {"grrm": pytest.approx(0.1 * q)}  # the recipe's part, before weighting
    for g in range(groups):
        replicas = {answers[g * n + j]["reward_extra_info"]["replica"] for j in range(n) if expected[g * n + j] is not None}
        assert len(replicas) == 1, f"group {g} was scored on {replicas}"
    after = replica_stats()
    assert total(after, "groups_scored") - total(before, "groups_scored") == groups
    assert total(after, "invalid_members") - total(before, "invalid_members") == 1
    for worker in workers:
        ray.kill(worker)


async def test_a_resent_member_is_not_counted_twice_on_the_service(app_url):
    client = RewardClient(BridgeConfig(app_name=APP))
    members = [
        MemberRequest(group_id="resent", group_size=3, index=i, source="s", candidate=quality_text(9, i, q), src_lang="en", trg_lang="de")
        for i, q in enumerate([4, 7, 1])
    ]
    before = await areplica_stats()
    # Member 1 is sent twice while its group assembles (a retry racing the original) ...
    first = await asyncio.gather(*(client.score_member(m) for m in [members[1], *members, members[1]]))
    # ... and once more after the group was scored (a retry after a lost answer).
    late = await client.score_member(members[1])
    assert [o.result.score for o in first] == [7, 4, 7, 1, 7] and late.result.score == 7
    after = await areplica_stats()
    assert total(after, "groups_scored") - total(before, "groups_scored") == 1
    repeats = sum(total(after, k) - total(before, k) for k in ("duplicates", "cached_answers"))
    assert repeats == 3


async def test_whole_batch_through_a_handle(app_url, tokenizer):
    responses = [codeblock(quality_text(g, j, (g + 3 * j) % 11)) for g in range(3) for j in range(3)]
    fields = [row_fields(f"batch-{g}", 3 * g + j) for g in range(3) for j in range(3)]
    data = padded_batch(tokenizer, responses, fields)
    config = BridgeConfig(app_name=APP)
    result = await compute_batch_rewards(data, config, tokenizer)
    assert result.rewards == pytest.approx([0.1 * ((g + 3 * j) % 11) for g in range(3) for j in range(3)])
    assert result.metrics["grrm/component/grrm/mean"] == pytest.approx(sum(result.rewards) / 9)
    assert all(result.extra_info["valid"]) and all(result.extra_info["replica"])


async def test_members_over_http(app_url):
    config = BridgeConfig(transport="http", http_url=app_url, token_env=None)
    members = [
        MemberRequest(group_id=f"http-{g}", group_size=3, index=i, source="s", candidate=quality_text(g, i, (g * i) % 11), src_lang="en", trg_lang="de", invalid=(g, i) == (1, 2))
        for g in range(4)
        for i in range(3)
    ]
    random.Random(5).shuffle(members)
    clients = [RewardClient(config) for _ in range(3)]  # three "workers"
    outcomes = await asyncio.gather(*(clients[k % 3].score_member(m) for k, m in enumerate(members)))
    for member, outcome in zip(members, outcomes):
        g, i = int(member.group_id.split("-")[1]), member.index
        assert outcome.result is not None and outcome.result.valid
        assert outcome.result.score == (None if member.invalid else (g * i) % 11)
    for client in clients:
        await client.aclose()


async def test_http_retries_503_until_the_service_has_room(ray_serve):
    app = scripted_app(num_replicas=1, max_ongoing_requests=1, max_queued_requests=1)
    app.engine.scripted.per_prompt_s = 0.3
    app.http.retry_after_s = 0
    serve.run(build_app(app), name="bridge_small", route_prefix="/bridge_small")
    try:
        config = BridgeConfig(transport="http", http_url=f"{ray_serve}/bridge_small", token_env=None, max_attempts=30, backoff_s=0.1, max_backoff_s=0.3)
        client = RewardClient(config)
        groups = [
            GroupRequest(group_id=f"busy-{k}", source="s", candidates=[quality_text(k, 0, 2), quality_text(k, 1, 6)], src_lang="en", trg_lang="de")
            for k in range(6)
        ]
        outcomes = await asyncio.gather(*(client.score_group(g) for g in groups))
        assert [o.result.scores for o in outcomes] == [[2, 6]] * 6
        assert client.loop.retries > 0, "the burst never hit a 503"
        assert any(o.attempts > 1 for o in outcomes)
        await client.aclose()
    finally:
        serve.delete("bridge_small")


def _wait_at_the_barrier(rollouts_per_worker_limit: int, workers: int, reward_kwargs: dict, tiny_model_dir):
    """verl's RewardLoopWorker actors (Ray's default concurrency: 1000 calls each) receive the first
    3 members of 350 groups of 4 (1050 members that wait for their group, more than one worker's
    slots), then, once the service holds as many waiting members as the workers can run, the last
    member of every group. Returns every answer."""
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    n, groups = 4, 350
    config = verl_config(n=n, model_path=str(tiny_model_dir), reward_kwargs={"app_name": APP, **reward_kwargs})
    config.data.train_batch_size = groups
    config.reward.num_workers = workers
    pool = [ray.remote(RewardLoopWorker).options(num_cpus=0).remote(config, None) for _ in range(workers)]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(7)

    def send(g: int, j: int):
        row = agent_loop_row(tokenizer, codeblock(quality_text(g, j, (g + j) % 11)), row_fields(f"barrier-{workers}-{g}", g * n + j))
        return rng.choice(pool).compute_score.remote(row)

    refs = [send(g, j) for g in range(groups) for j in range(n - 1)]
    handle = serve.get_deployment_handle("GRRMReplica", app_name=APP)
    # The ramp is timed from the first member that waits, not from the sends: verl's workers start first
    # (import verl, build the manager), which took 7 s here and can take minutes on a loaded CI machine
    # (stop 54's CI: 962 members waited at the 120 s mark counted from the sends).
    waiting, first_waited, give_up = 0, None, time.monotonic() + 420
    while waiting < min(len(refs), rollouts_per_worker_limit * workers) - 5 and time.monotonic() < give_up:
        time.sleep(0.5)
        waiting = sum(to_replica(handle, name).info.remote().result(timeout_s=30)["assembler"]["members_waiting"]
                      for name in replica_names())
        if waiting and first_waited is None:
            first_waited = time.monotonic()
            give_up = min(give_up, first_waited + 120)
    refs += [send(g, n - 1) for g in range(groups)]
    answers = ray.get(refs, timeout=300)
    for worker in pool:
        ray.kill(worker)
    return waiting, answers


@pytest.mark.timeout(1500)
def test_more_waiting_members_than_one_reward_worker_holds_complete_on_the_workers_the_check_asks_for(
    app_url, tiny_model_dir
):
    """verl's reward workers hold at most 1000 calls each, and a member waiting for its group holds
    one. The manager's start-time check (grrm_client/adapters/verl/capacity.py) accepts 2 workers for 1400
    rollouts in flight: then 1050 members wait at once and every group completes, none fails.
    On 1 worker (the check overruled), members queue behind members that wait for them: groups
    never complete and end at the deadline. That stall is what the check prevents."""
    from verl.trainer.ppo.reward import load_reward_manager

    before = replica_stats()
    waiting, answers = _wait_at_the_barrier(1000, 2, {"deadline_s": 120}, tiny_model_dir)
    assert waiting > 1000  # more members waited at once than one worker can hold
    infos = [answer["reward_extra_info"] for answer in answers]
    assert all(info["valid"] for info in infos), {info["failure"] for info in infos}
    assert max(info["worker_in_flight"] for info in infos) <= 1000
    after = replica_stats()  # each group scored once (members that out-waited the assembly timeout re-joined)
    assert total(after, "groups_scored") - total(before, "groups_scored") == 350

    one_worker = verl_config(n=4, reward_kwargs={"app_name": APP})
    one_worker.data.train_batch_size, one_worker.reward.num_workers = 350, 1
    with pytest.raises(ValueError, match=r"reward.num_workers=1: .* Set reward.num_workers=2"):
        load_reward_manager(one_worker, None)
    # The deadline outlasts the worker's ramp to its 1000 slots: at 15 s, on a loaded 2-core CI machine,
    # the first calls met it while the worker had started only 615 (~40 calls/s), so none ever waited
    # beside 999 others. At 60 s the stall still ends every call at its deadline.
    waiting, answers = _wait_at_the_barrier(
        1000, 1, {"deadline_s": 60, "reward_worker_concurrency": 100_000}, tiny_model_dir
    )
    infos = [answer["reward_extra_info"] for answer in answers]
    assert max(info["worker_in_flight"] for info in infos) == 1000  # Ray ran no more calls than its slots
    stalled = [info for info in infos if not info["valid"]]
    assert stalled and {info["failure"] for info in stalled} <= {"timeout", "deadline"}
