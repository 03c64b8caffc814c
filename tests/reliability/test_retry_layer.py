"""One retry layer: through a real Serve app and the handle transport, every send of
a logical member is one of RewardClient's attempts (or a re-join of an incomplete group), and
attempts beyond the replicas' refusals never exceed ``max_attempts``, while replicas refuse members
as overloaded (back pressure: retried until the deadline, spending no attempt) and one replica is
killed mid-stream (retried, routed in ring order). Every member
still gets its group's verdict. The engine is scripted: the test is about the retry contract."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from ray import serve

from bench.chaos import inject
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import MemberRequest
from deployments.app import build_app
from deployments.config import AppConfig, ReplicaSettings
from grrm_client import RewardClient
from grrm_handles.send import HandleSender
from grrm_client.adapters.verl.config import BridgeConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP = "retries"
GROUPS = 16
MAX_ATTEMPTS = 8


class CountingHandle:
    """A Serve handle that counts the sends of each member (what reaches Serve's router)."""

    def __init__(self, handle, sends: Counter[tuple[str, int]] | None = None):
        self.handle = handle
        self.sends: Counter[tuple[str, int]] = Counter() if sends is None else sends

    def options(self, **options):
        """The handle under a routing hint (a re-send's attempt), its sends counted with these."""
        return CountingHandle(self.handle.options(**options), self.sends)

    @property
    def add_member(self):
        method = self.handle.add_member
        sends = self.sends

        class Counted:
            @staticmethod
            def remote(member):
                sends[(member.group_id, member.index)] += 1
                return method.remote(member)

        return Counted


def members_of(group: int, round_: int = 0) -> list[MemberRequest]:
    return [MemberRequest(group_id=f"r{round_}-{group}", group_size=4, index=k, source=f"Source {group}.",
                          candidate=f"Kandidat {group}-{k} [q={(group + 2 * k) % 11}]", src_lang="en", trg_lang="de")
            for k in range(4)]


def test_sends_per_member_are_attempts_or_rejoins_and_attempts_stay_within_max_attempts(serve_instance):
    # A round whose timing made no member retry (one CI run on a loaded machine: the killed replica
    # held nothing and no replica refused) proves nothing about retries: one more round, fresh groups.
    for round_ in range(2):
        retried = run_round(round_)
        if retried > 0:
            break
    assert retried > 0, "neither the overload nor the replica death made any member retry, in two rounds"


def run_round(round_: int) -> int:
    """Deploy, stream every member while a replica dies, check the retry contract; the members that retried."""
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.3, max_concurrent_prompts=1)),
        replicas=ReplicaSettings(num_replicas=2, num_cpus=0.5, gpus_per_rank=0, max_assembling_groups=2),
        assembly_timeout_s=10,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    handle = CountingHandle(serve.get_deployment_handle("GRRMReplica", app_name=APP))
    bridge = BridgeConfig(app_name=APP, max_attempts=MAX_ATTEMPTS, backoff_s=0.2, max_backoff_s=1.0, deadline_s=120)
    client = RewardClient(bridge, HandleSender(handle, app=bridge))

    async def send(member: MemberRequest, delay_s: float):
        await asyncio.sleep(delay_s)
        return member, await client.score_member(member)

    async def kill_a_replica() -> str:
        # The replica scoring a group when one first is (a kill at a fixed 1 s hit a replica that held
        # nothing in two rounds of one CI run, beside the other shard's trainings).
        record = await inject("replica_kill", handle.handle, APP, at_s=0.5, aim_s=60)
        return record["victim"]

    async def run():
        sends = [send(member, 0.15 * group + 0.05 * member.index)
                 for group in range(GROUPS) for member in members_of(group, round_)]
        killed = asyncio.ensure_future(kill_a_replica())
        outcomes = await asyncio.gather(*sends)
        return outcomes, await killed

    try:
        started = time.monotonic()
        outcomes, victim = asyncio.run(run())
        wall_s = time.monotonic() - started
    finally:
        serve.delete(APP)
    assert victim
    invalid = [(m.group_id, m.index, o.failure, o.error) for m, o in outcomes if o.result is None or not o.result.valid]
    assert not invalid, invalid
    for member, outcome in outcomes:
        # Nothing below RewardClient sent this member again on its own.
        assert handle.sends[(member.group_id, member.index)] == outcome.attempts + outcome.rejoins, (member, outcome)
        assert 1 <= outcome.attempts - outcome.overloaded <= MAX_ATTEMPTS
    retried = sum(outcome.attempts > 1 for _, outcome in outcomes)
    print(f"\nround {round_}: {len(outcomes)} members valid in {wall_s:.1f} s; {retried} retried, "
          f"max attempts {max(o.attempts for _, o in outcomes)}, client retries {client.loop.retries}, "
          f"rejoins {client.loop.rejoins}")
    return retried
