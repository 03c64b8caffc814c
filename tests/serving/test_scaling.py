"""The pool scales on engine work and announced demand, and its scaling strands no group.

Real Ray Serve with the project's autoscaling policy (replicas.autoscaling, policy engine_work), real
HTTP through the client every caller uses (RewardClient), scripted engine. Groups assemble member by
member while the replica set goes 1 -> 4 -> 1: the members of groups whose owner changed meet on
the new owner within seconds, far inside the assembly timeout, and every group is scored once. And
complete groups queued for one replica's engine when the pool grows move to the new replicas' engines.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from ray import serve

from bench.autoscale import replica_counts
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, AutoscalingSettings, ReplicaSettings, TenantDefaults, TenantsSettings
from deployments.declared import deploy_declared
from deployments.replica_list import replica_actor_names
from grrm_client import ClientConfig, RewardClient
from grrm_handles.send import to_replica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

APP = "scaling"
GROUPS, SIZE = 24, 4
# A member stranded by the scaling would wait this long, then count as an assembly timeout (asserted
# none); the seconds from the last member to the last reward are printed, a speed figure, not asserted.
ASSEMBLY_TIMEOUT_S = 120.0


def app_config(engine: ScriptedEngineOptions, **autoscaling) -> AppConfig:
    scaling = AutoscalingSettings(**{
        "min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 0, "metrics_interval_s": 0.5,
        "look_back_period_s": 2, "cold_start_s": 0, "demand_headroom": 1.0, "demand_grace_s": 0, **autoscaling})
    return AppConfig(
        engine=EngineConfig(kind="scripted", scripted=engine),
        replicas=ReplicaSettings(num_cpus=0.1, gpus_per_rank=0, autoscaling=scaling),
        # One tenant announces here: it may claim the whole pool (the default cap, half of it, is tested in
        # tests/test_demand_bounds.py).
        tenants=TenantsSettings(default=TenantDefaults(max_announced_replicas=scaling.max_replicas)),
        assembly_timeout_s=ASSEMBLY_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def url(serve_instance):
    config = app_config(ScriptedEngineOptions(per_prompt_s=0.02), downscale_delay_s=1, default_seconds_per_group=1.0)
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def running_replicas(app: str = APP) -> int:
    return replica_counts(serve, app)[1]


def held_replicas(app: str = APP) -> int:
    """Replicas asked for and not yet gone: starting, running or stopping."""
    return replica_counts(serve, app)[0]


def assemblers(app: str = APP) -> list[dict]:
    """Every running replica's assembler counters (one being stopped is not routed to: it is skipped)."""
    handle = serve.get_deployment_handle("GRRMReplica", app_name=app)
    calls = [to_replica(handle, name).info.remote() for name in replica_actor_names(app)]
    answers = []
    for call in calls:
        try:
            answers.append(call.result(timeout_s=10)["assembler"])
        except Exception:  # noqa: BLE001 - a replica going away: it holds nothing any more
            pass
    return answers


def wait_until(condition, what: str, timeout_s: float = 90.0, every_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


def members(tag: str, group: int) -> list[MemberRequest]:
    return [MemberRequest(group_id=f"{tag}{group}", group_size=SIZE, index=index, source=f"Sentence {tag}{group}.",
                          candidate=f"candidate {index} [q={index + 1}]", src_lang="en", trg_lang="de")
            for index in range(SIZE)]


async def assemble_across(url: str, tag: str, change, replicas_after: int) -> tuple[list, float, dict]:
    """Send all but the last member of every group, change the replica set while they wait, then
    send the last members; returns the answers, the seconds from the last member to the last
    answer, and the client's counters."""
    client = RewardClient(ClientConfig(transport="http", http_url=url, deadline_s=300))
    try:
        first = [asyncio.create_task(client.score_member(one))
                 for group in range(GROUPS) for one in members(tag, group)[:-1]]
        await asyncio.to_thread(wait_until, lambda: sum(a["pending_groups"] for a in assemblers()) == GROUPS,
                                f"{GROUPS} groups assembling")
        await change(client)
        await asyncio.to_thread(wait_until, lambda: running_replicas() == replicas_after,
                                f"{replicas_after} running replicas")
        last = [asyncio.create_task(client.score_member(members(tag, group)[-1])) for group in range(GROUPS)]
        sent_last = time.monotonic()
        answers = await asyncio.gather(*first, *last)
        return answers, time.monotonic() - sent_last, {"rejoins": client.loop.rejoins, "retries": client.loop.retries}
    finally:
        await client.aclose()


def check_scored_once(answers: list, tag: str, groups: int = GROUPS) -> dict[str, set]:
    assert all(call.result is not None and call.result.valid for call in answers), [
        (call.failure, call.error) for call in answers if call.result is None or not call.result.valid][:3]
    by_group: dict[str, set] = {}
    for call in answers:
        by_group.setdefault(call.result.group_id, set()).add((call.result.replica, tuple(call.result.group_scores)))
    assert sorted(by_group) == sorted(f"{tag}{group}" for group in range(groups))
    # One verdict per group: every member was scored in the same group prompt on the same replica.
    assert all(len(verdicts) == 1 for verdicts in by_group.values()), by_group
    return by_group


def test_groups_assembling_across_a_scale_up_and_a_scale_down_meet_at_once_and_are_scored_once(url, capsys):
    assert running_replicas() == 1
    handed_off_before = 0

    async def announce_a_burst(client: RewardClient) -> None:
        # Members that only wait are no load: with 72 waiting, the pool stays at one replica.
        await asyncio.sleep(2)
        assert running_replicas() == 1
        # Its groups all come in the phase's last tenth (its profile), 9 minutes away: no replica yet
        # (evenly, 100 000 groups in 600 s would be max_replicas now).
        assert await client.announce_demand(groups=100_000, lasts_s=600, profile=[0.0] * 9 + [1.0])
        await asyncio.sleep(2)
        assert running_replicas() == 1
        # A trainer announces a step far above one replica's rate: the policy scales to max_replicas.
        assert await client.announce_demand(groups=100_000, lasts_s=600)

    answers, last_wait_s, counters = asyncio.run(assemble_across(url, "up", announce_a_burst, replicas_after=4))
    check_scored_once(answers, "up")
    with capsys.disabled():
        print(f"\nscale 1 -> 4: last reward {last_wait_s:.1f} s after the last member")
    handed_off = sum(a.get("groups_handed_off", 0) for a in assemblers())
    assert handed_off > handed_off_before  # some groups' owner changed and they moved, not timed out
    assert sum(a["assembly_timeouts"] for a in assemblers()) == 0

    async def withdraw(client: RewardClient) -> None:
        assert await client.announce_demand(groups=0, lasts_s=1)

    answers, last_wait_s, _ = asyncio.run(assemble_across(url, "down", withdraw, replicas_after=1))
    check_scored_once(answers, "down")
    with capsys.disabled():
        print(f"scale 4 -> 1: last reward {last_wait_s:.1f} s after the last member")
    # The one replica left (the router sends an untargeted call to a running replica only).
    survivor = serve.get_deployment_handle("GRRMReplica", app_name=APP).info.remote().result(timeout_s=30)
    assert survivor["assembler"]["assembly_timeouts"] == 0
    # Each replica measured its own cold start (what the policy takes where longer than configured).
    assert survivor["cold_start_s"] > 0, survivor["cold_start_s"]


QUEUED_APP, QUEUED_GROUPS = "scaling_queued", 40


def test_complete_groups_queued_for_one_engine_move_to_the_replicas_the_pool_adds(serve_instance):
    # One group at the engine at a time, 1 s each: 40 complete groups are 40 s of queue on one replica,
    # which the policy answers with 4 replicas (target_backlog_s 4) within seconds. No announcement. The
    # queue outlasts a replica's start: with 20 s of it, the 3 added replicas were still starting (22 s
    # each beside the other shard's trainings) when the first had scored every group (a full run here).
    config = app_config(ScriptedEngineOptions(per_prompt_s=1.0, max_concurrent_prompts=1),
                        downscale_delay_s=600, target_backlog_s=4, default_seconds_per_group=1.0)
    serve.run(build_app(config), name=QUEUED_APP, route_prefix=f"/{QUEUED_APP}")
    try:
        assert running_replicas(QUEUED_APP) == 1
        [first_replica] = replica_actor_names(QUEUED_APP)

        async def score_all() -> list:
            client = RewardClient(ClientConfig(transport="http", http_url=f"{serve_instance}/{QUEUED_APP}",
                                               deadline_s=300))
            try:
                waiting = [asyncio.create_task(client.score_member(one)) for group in range(QUEUED_GROUPS)
                           for one in members("q", group)[:-1]]
                await asyncio.to_thread(
                    wait_until, lambda: sum(a["pending_groups"] for a in assemblers(QUEUED_APP)) == QUEUED_GROUPS,
                    f"{QUEUED_GROUPS} groups assembling")
                # Every group completes on the one replica there is, and queues for its engine.
                last = [asyncio.create_task(client.score_member(members("q", group)[-1]))
                        for group in range(QUEUED_GROUPS)]
                return await asyncio.gather(*waiting, *last)
            finally:
                await client.aclose()

        answers = asyncio.run(score_all())
        by_group = check_scored_once(answers, "q", QUEUED_GROUPS)
        scored_on = {replica for verdicts in by_group.values() for replica, _ in verdicts}
        # Groups complete on the first replica were scored by the engines of replicas added after.
        assert scored_on - {first_replica}, (first_replica, scored_on)
        assert running_replicas(QUEUED_APP) > 1
        counters = assemblers(QUEUED_APP)
        assert sum(a.get("groups_handed_off", 0) for a in counters) > 0
        assert sum(a["assembly_timeouts"] for a in counters) == 0
        # Each group reached an engine once: what was handed off was taken back from the queue, not scored twice.
        assert sum(a["groups_scored"] for a in counters) == QUEUED_GROUPS
    finally:
        serve.delete(QUEUED_APP)


ZERO_APP = "scaling_zero"


def test_a_pool_with_min_replicas_zero_starts_for_work_keeps_its_replica_for_waiting_members_and_empties(
        serve_instance, capsys):
    config = app_config(ScriptedEngineOptions(per_prompt_s=0.05), min_replicas=0, max_replicas=2,
                        downscale_delay_s=1, default_seconds_per_group=1.0)
    serve.run(build_app(config), name=ZERO_APP, route_prefix=f"/{ZERO_APP}")
    try:
        assert running_replicas(ZERO_APP) == 0

        async def score(tag: str, before_last=None) -> tuple[list, float]:
            """A group's first members, then (after ``before_last()``) its last; the answers and the
            seconds from the first member to the last answer."""
            client = RewardClient(ClientConfig(transport="http", http_url=f"{serve_instance}/{ZERO_APP}",
                                               deadline_s=120))
            try:
                started = time.monotonic()
                group = members(tag, 0)
                first = [asyncio.create_task(client.score_member(one)) for one in group[:-1]]
                if before_last is not None:
                    await before_last()
                answers = await asyncio.gather(*first, client.score_member(group[-1]))
                return answers, time.monotonic() - started
            finally:
                await client.aclose()

        # Work at an empty pool waits at the callers' handles; the policy counts it and starts a replica.
        answers, from_zero_s = asyncio.run(score("z"))
        check_scored_once(answers, "z", groups=1)
        # Idle, nothing announced: the pool empties again after the downscale delay.
        wait_until(lambda: running_replicas(ZERO_APP) == 0, "the pool back at zero", timeout_s=60)

        held_by: list[str] = []

        async def hold_past_the_downscale_delay() -> None:
            # Members waiting for their last group-mate hold the one replica they wait on, far past the
            # downscale delay (1 s); the group is scored there when the last comes.
            await asyncio.to_thread(wait_until, lambda: running_replicas(ZERO_APP) == 1, "a replica for the members")
            held_by.extend(replica_actor_names(ZERO_APP))
            await asyncio.sleep(8.0)
            assert running_replicas(ZERO_APP) == 1 and list(replica_actor_names(ZERO_APP)) == held_by

        answers, _ = asyncio.run(score("w", hold_past_the_downscale_delay))
        assert {replica for verdicts in check_scored_once(answers, "w", groups=1).values()
                for replica, _ in verdicts} == set(held_by)
        with capsys.disabled():
            print(f"\nmin_replicas 0: first group scored {from_zero_s:.1f} s after its first member "
                  "(a replica started)")
    finally:
        serve.delete(ZERO_APP)


DECLARED_APP = "scaling_declared"
# The announced phase starts this far ahead and lasts LASTS_S; its first group is expected 3 s in (20 groups
# evenly in 60 s), and the policy starts a replica a cold start before that: first the configured one (14 s),
# then the one it measured at that first start. Lead and phase outlast a replica's start on a loaded machine:
# with 20 s ahead and a 10 s phase, both replicas were still starting (more than 25 s beside the other
# shard's trainings; an ingress took 33 s) when the phase ended and the policy let them go (a full run here).
STARTS_IN_S, LASTS_S, COLD_START_S = 45.0, 60.0, 14.0
NEEDED_FROM_S = STARTS_IN_S + LASTS_S / 20


def test_an_empty_pool_deployed_as_grrm_yaml_starts_ahead_of_work_announced_over_either_transport(
        serve_instance, capsys):
    """Deployed as `serve run deployments/grrm.yaml` deploys (Serve's application-level policy), a scorer
    pool at 0 replicas hears of a trainer's announcement through the ingress, which always runs: no scorer
    replica starts when it is announced, one does by when the announced phase needs it, and a withdrawal
    empties the pool again. The same over HTTP and over the handle transport (verl's bridge)."""
    config = app_config(ScriptedEngineOptions(per_prompt_s=0.05), min_replicas=0, max_replicas=2,
                        downscale_delay_s=1, default_seconds_per_group=1.0, cold_start_s=COLD_START_S,
                        target_backlog_s=5)
    deploy_declared(config, DECLARED_APP, f"/{DECLARED_APP}")
    asked_after_s: dict[str, float] = {}
    serving_after_s: dict[str, float] = {}
    try:
        for transport in ("http", "handle"):
            assert running_replicas(DECLARED_APP) == 0

            async def announce_then_score(transport: str = transport) -> list:
                client = RewardClient(ClientConfig(transport=transport, http_url=f"{serve_instance}/{DECLARED_APP}",
                                                   app_name=DECLARED_APP, deadline_s=120, tenant=f"run-{transport}"))
                try:
                    # 20 groups in LASTS_S at 1 s each: 1 replica, STARTS_IN_S from now.
                    assert await client.announce_demand(groups=20, lasts_s=LASTS_S, starts_in_s=STARTS_IN_S)
                    announced = time.monotonic()
                    # Not at the announcement (a call waiting at the empty pool would start one at once) ...
                    await asyncio.sleep(4)
                    assert running_replicas(DECLARED_APP) == 0
                    # ... but for the announced phase, with not one member sent.
                    await asyncio.to_thread(wait_until, lambda: held_replicas(DECLARED_APP) >= 1,
                                            "a replica asked for the announced phase", STARTS_IN_S + LASTS_S, 0.1)
                    asked_after_s[transport] = time.monotonic() - announced
                    await asyncio.to_thread(wait_until, lambda: running_replicas(DECLARED_APP) >= 1,
                                            "a replica for the announced phase", STARTS_IN_S + LASTS_S, 0.1)
                    serving_after_s[transport] = time.monotonic() - announced
                    answers = await asyncio.gather(*(client.score_member(one) for one in members(transport, 0)))
                    assert await client.announce_demand(groups=0, lasts_s=1)  # withdrawn: nothing comes
                    return answers
                finally:
                    await client.aclose()

            check_scored_once(asyncio.run(announce_then_score()), transport, groups=1)
            wait_until(lambda: held_replicas(DECLARED_APP) == 0, "the pool back at zero", timeout_s=60)
        measured_s = serving_after_s["http"] - asked_after_s["http"]  # the first start, as the policy timed it
        with capsys.disabled():
            print("\nscale ahead from zero: a replica asked for / serving "
                  + ", ".join(f"{asked_after_s[transport]:.1f} / {serving_after_s[transport]:.1f} s ({transport})"
                              for transport in serving_after_s)
                  + f" after the announcement, its first group expected at {NEEDED_FROM_S:.1f} s (cold start "
                  f"configured {COLD_START_S:.0f} s, then measured {measured_s:.1f} s)")
        # The first start was planned with the configured cold start, the second with the one the first measured
        # (its start took seconds here, however long: the second is asked for that long before the need).
        assert abs(asked_after_s["http"] - (NEEDED_FROM_S - COLD_START_S)) < 2.5, asked_after_s
        assert abs(asked_after_s["handle"] - (NEEDED_FROM_S - measured_s)) < 2.5, (asked_after_s, measured_s)
        # Either way the replica serves within the announced phase, with not one member sent before.
        assert all(seconds <= STARTS_IN_S + LASTS_S for seconds in serving_after_s.values()), serving_after_s
    finally:
        serve.delete(DECLARED_APP)


TRANSIT_APP = "scaling_transit"


def test_members_in_transit_to_their_replica_start_no_replica(serve_instance, capsys):
    """Issue 48's measurement: members of 200 groups of 4, 3 of each sent at once, so no group is
    scorable. They queue for a moment in the handle (Serve's total_queued_requests) while the routers
    place them; counted as 600 groups' work, the pool went 1 -> 4. With the one replica's slots mostly
    free they are no engine work: the pool stays at 1 (a downscale delay of 600 s would keep any replica
    it asked for in sight)."""
    config = app_config(ScriptedEngineOptions(per_prompt_s=0.02), downscale_delay_s=600,
                        default_seconds_per_group=1.0)
    serve.run(build_app(config), name=TRANSIT_APP, route_prefix=f"/{TRANSIT_APP}")
    try:
        assert held_replicas(TRANSIT_APP) == 1

        async def send_and_watch() -> tuple[int, int]:
            client = RewardClient(ClientConfig(transport="handle", app_name=TRANSIT_APP, deadline_s=300))
            held = [held_replicas(TRANSIT_APP)]
            sending = [asyncio.create_task(client.score_member(one)) for group in range(200)
                       for one in members("t", group)[:-1]]
            try:
                waiting = 0
                for _ in range(60):  # 15 s: past every member's arrival, with the policy deciding twice a second
                    await asyncio.sleep(0.25)
                    held.append(await asyncio.to_thread(held_replicas, TRANSIT_APP))
                waiting = sum(a["members_waiting"] for a in await asyncio.to_thread(assemblers, TRANSIT_APP))
                return max(held), waiting
            finally:
                for task in sending:
                    task.cancel()
                await asyncio.gather(*sending, return_exceptions=True)
                await client.aclose()

        most_held, waiting = asyncio.run(send_and_watch())
        with capsys.disabled():
            print(f"\n600 members in transit: at most {most_held} replica(s) held, {waiting} members waiting")
        assert waiting == 600  # every member reached the replica, and waits there for its group-mate
        assert most_held == 1
    finally:
        serve.delete(TRANSIT_APP)
