"""A replica that did not answer a probe is passed over for a while, not for good
(``deployments/hand_off.py``): in a fixed pool the replica set never changes, and a probe that timed
out under load would otherwise keep every group sent to the wrong replica split until its deadline."""

from __future__ import annotations

import asyncio

from cluster.announced_demand import AnnouncedDemands
from cluster.assembly import AssemblySettings, GroupAssembler
from deployments import hand_off
from deployments.hand_off import GONE_FOR_S, RingFollower


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Peers:
    """Answers probes once ``answering`` is set; counts them."""

    def __init__(self):
        self.answering = False
        self.probes = 0

    async def ask_replica(self, method: str, replica: str, *args, **kwargs):
        assert method == "takes_members"
        self.probes += 1
        if not self.answering:
            await asyncio.sleep(3600)
        return replica


async def test_a_silent_peer_is_passed_over_then_probed_again(monkeypatch):
    monkeypatch.setattr(hand_off, "PROBE_TIMEOUT_S", 0.05)
    clock, peers = Clock(), Peers()

    class Never:
        async def score_group(self, group):
            raise AssertionError("nothing is scored here")

    follower = RingFollower("a", 100, GroupAssembler(Never(), AssemblySettings(assembly_timeout_s=1)), set(),
                            AnnouncedDemands(), clock=clock)
    follower.peers = peers
    follower.on_replica_set(["a", "b"])
    key = next(f"g{i}" for i in range(1000) if follower.owner_elsewhere(f"g{i}") == "b")  # a group b owns
    assert await follower.reachable_owner(key) is None  # b is silent: the group stays here
    assert follower.owner_elsewhere(key) is None and peers.probes == 1
    peers.answering = True
    clock.now += GONE_FOR_S / 2
    assert await follower.reachable_owner(key) is None and peers.probes == 1  # still passed over, not asked
    clock.now += GONE_FOR_S
    assert await follower.reachable_owner(key) == "b" and peers.probes == 2  # asked again: it answers
    assert follower.owner_elsewhere(key) == "b"
