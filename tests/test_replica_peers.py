"""A scorer replica's probe of a peer before it hands that peer a group, without Ray: the
replica's peer handle is replaced by stand-ins (the class is used directly, as in
tests/test_replica_construction.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import deployments.replica as replica_module
from deployments.replica import GRRMReplica

# Replicas made bare here are collected by the garbage collector, which cannot await Serve's async
# destructor (as in tests/test_replica_construction.py).
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'GRRMReplica.__del__' was never awaited")


class StandInSender:
    """What ``_peers()`` returns: the first one made knows no peer (its calls never leave, as through
    a router holding a stale replica set); later ones answer, unless ``answers`` is False."""

    made: list[StandInSender] = []
    answers = True

    def __init__(self, handle) -> None:
        self.stale = not StandInSender.made
        StandInSender.made.append(self)

    async def _call(self, replica: str) -> dict:
        if self.stale or not StandInSender.answers:
            await asyncio.Event().wait()
        return {"replica": replica}

    def ask_replica(self, method: str, replica: str, *args, **kwargs):
        assert method == "info"
        return self._call(replica)


def bare_replica(monkeypatch) -> GRRMReplica:
    StandInSender.made = []
    context = SimpleNamespace(deployment="GRRMReplica", app_name="app")
    monkeypatch.setattr(replica_module.serve, "get_replica_context", lambda: context)
    monkeypatch.setattr(replica_module, "fresh_handle", lambda deployment, app_name: object())
    monkeypatch.setattr(replica_module, "HandleSender", StandInSender)
    monkeypatch.setattr(replica_module, "PROBE_TIMEOUT_S", 0.05)
    replica = GRRMReplica.__new__(GRRMReplica)
    replica.name, replica._peer_client, replica._gone = "a", None, set()
    return replica


async def test_a_probe_through_a_stale_peer_handle_asks_again_through_a_new_one(monkeypatch):
    replica = bare_replica(monkeypatch)
    StandInSender.answers = True
    # The peer is there: a stale router must not make it look gone (its groups would stay here while
    # the routers send their members to it: split groups, met only after the assembly timeout).
    assert await replica._probe("b") is True
    assert replica._gone == set() and len(StandInSender.made) == 2


async def test_a_peer_silent_through_a_new_handle_too_is_gone(monkeypatch):
    replica = bare_replica(monkeypatch)
    StandInSender.answers = False
    assert await replica._probe("b") is False
    assert replica._gone == {"b"} and len(StandInSender.made) == 2


def test_a_fresh_handle_has_a_router_of_its_own_unlike_serves_cached_handle(monkeypatch):
    """serve.get_deployment_handle hands back the process's cached handle (and its router, the one
    that went stale); a probe's or a ledger sync's retry must not ask through that again."""
    from ray.serve.handle import DeploymentHandle

    from grrm_client.handles import fresh_handle

    made = []

    def counted(self, *args, **kwargs):  # ready_handle sets the router up through options()
        made.append(self)
        return self

    monkeypatch.setattr(DeploymentHandle, "options", counted)
    first, second = fresh_handle("GRRMReplica", "app"), fresh_handle("GRRMReplica", "app")
    assert first is not second and made == [first, second]
