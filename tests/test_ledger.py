"""The ledger's store (cluster/ledger.py) and where its copies go (cluster.routing.copy_holders)."""

from __future__ import annotations

from cluster.group_records import CompletedGroup, Verdict
from cluster.ledger import GroupLedger
from cluster.routing import copy_holders


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(score: int) -> CompletedGroup:
    verdict = Verdict(scores=(score,), valid=True, error=None, failure=None, replica="r", attempts=1)
    return CompletedGroup(group_size=1, src_lang="en", trg_lang="de", source_digest=b"s",
                          candidate_digests=(b"c",), verdict=verdict)


def test_copies_of_a_record_land_on_distinct_replicas_and_fall_back_to_the_others():
    replicas = ["b", "a", "c"]
    assert [copy_holders(replicas, copy)[0] for copy in range(3)] == ["a", "b", "c"]
    assert copy_holders(replicas, 1) == ["b", "c", "a"]
    assert copy_holders(replicas, 4) == copy_holders(replicas, 1)  # more copies than replicas wrap
    assert copy_holders(["a"], 1) == ["a"]  # one replica left: every copy goes there
    assert copy_holders(replicas, 0, exclude="a") == ["b", "c"]
    assert copy_holders(["a"], 0, exclude="a") == []


def test_a_peer_takes_only_what_was_written_since_it_last_asked():
    clock = Clock()
    source, peer = GroupLedger(ttl_s=100, clock=clock), GroupLedger(ttl_s=100, clock=Clock(5.0))
    source.put("g1", record(1))
    source.put("g2", record(2))
    cursor, changed = source.changes_since(0)
    assert cursor == 2 and {group_id for group_id, _, _ in changed} == {"g1", "g2"}
    assert peer.merge(changed) == 2 and peer.get("g2").verdict.scores == (2,)
    source.put("g3", record(3))
    cursor, changed = source.changes_since(cursor)
    assert [group_id for group_id, _, _ in changed] == ["g3"] and cursor == 3
    assert peer.merge(changed) == 1 and peer.merge(changed) == 0  # known groups are not taken twice
    assert peer.size() == 3


def test_merged_records_keep_their_remaining_time_on_the_peers_clock_and_can_be_passed_on():
    clock = Clock(1000.0)
    source = GroupLedger(ttl_s=100, clock=clock)
    source.put("old", record(1))
    clock.now += 60  # "old" has 40 s left
    source.put("new", record(2))
    peer_clock = Clock(7.0)  # another process's monotonic clock
    peer = GroupLedger(ttl_s=100, clock=peer_clock)
    peer.merge(source.changes_since(0)[1])
    peer_clock.now += 41
    assert peer.get("old") is None and peer.get("new") is not None
    # A replica that starts later takes the peer's merged records from it as well.
    late = GroupLedger(ttl_s=100, clock=Clock())
    assert late.merge(peer.changes_since(0)[1]) == 1 and late.get("new") is not None


def test_expired_or_evicted_records_are_not_passed_on():
    clock = Clock()
    ledger = GroupLedger(ttl_s=10, max_groups=2, clock=clock)
    for number in range(3):
        ledger.put(f"g{number}", record(number))
    assert ledger.get("g0") is None and ledger.size() == 2
    assert sorted(group_id for group_id, _, _ in ledger.changes_since(0)[1]) == ["g1", "g2"]
    clock.now += 11
    assert ledger.changes_since(0) == (3, [])
    assert GroupLedger(ttl_s=10).merge([("g", -1.0, record(0))]) == 0


class _Method:
    """A handle method: ``remote`` starts the call (a coroutine, awaited as a Serve response is)."""

    def __init__(self, call):
        self.remote = call


async def test_a_replica_whose_peer_handle_knows_no_peer_asks_through_a_new_handle(monkeypatch):
    """A Serve router can keep a stale replica set (a ledger replica's knew only itself for 2 minutes
    on a loaded machine, and its replacement was never filled): after a round without an answer the
    replica asks its peers through a new handle, whose router reads the set afresh."""
    import asyncio
    from types import SimpleNamespace

    from deployments import ledger as serve_ledger

    peer = GroupLedger(ttl_s=100)
    peer.put("g1", record(1))
    peer.put("g2", record(2))

    async def never(**_):  # the stale router has no replica to send to: the call waits
        await asyncio.Event().wait()

    async def name(**_):
        return "a"

    async def changes_since(since, **_):
        return peer.changes_since(since)

    handles = []

    def fresh_handle(deployment, app_name):
        stale = not handles
        handles.append(SimpleNamespace(name=_Method(never if stale else name), changes_since=_Method(changes_since)))
        return handles[-1]

    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="b"), deployment="GRRMLedger", app_name="app")
    monkeypatch.setattr(serve_ledger.serve, "get_replica_context", lambda: context)
    monkeypatch.setattr(serve_ledger, "fresh_handle", fresh_handle)
    monkeypatch.setattr(serve_ledger, "PEER_CALL_TIMEOUT_S", 0.05)
    replica = serve_ledger.LedgerReplica.__new__(serve_ledger.LedgerReplica)
    await replica.__init__(ttl_s=100, copies=2, sync_period_s=0.01)
    try:
        for _ in range(200):
            if replica.synced_from_peers:
                break
            await asyncio.sleep(0.01)
        assert replica.synced_from_peers == 2 and replica.size() == 2
        assert len(handles) == 2  # the stale handle was dropped once, the new one kept
    finally:
        replica._sync.cancel()


class _Replica:
    """What Ray's request router reads of a running replica (the parts a routing decision uses)."""

    def __init__(self, name: str):
        from ray.serve._private.common import DeploymentID, ReplicaID

        self.replica_id = ReplicaID(name, DeploymentID(name="GRRMLedger", app_name="ledger-test"))
        self.node_id, self.availability_zone, self.multiplexed_model_ids = None, None, set()

    def push_proxy_handle(self, handle) -> None:
        pass

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def test_a_peer_call_whose_router_knows_no_peer_yet_waits_without_holding_the_routers_event_loop():
    """Stop 41's node-fault failure: a ledger replica's router that knew only its own replica (its
    peer's start not yet broadcast) routed a peer-sync call. Ray's routing loop asks ``choose_replicas``
    again at once, without awaiting, unless the request says to back off: the router's event loop
    spun, the broadcast naming the peer never ran on it, and the replica starved its other calls
    (scorers' writes) for minutes. Here the peer's broadcast comes through that loop, as Serve's does."""
    import asyncio
    import threading

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve._private.request_router.common import PendingRequest

    from deployments.ledger import LedgerCopyRouter

    own, peer = _Replica("own"), _Replica("peer")
    router = LedgerCopyRouter(deployment_id=DeploymentID(name="GRRMLedger", app_name="ledger-test"),
                              handle_source=DeploymentHandleSource.REPLICA)
    router.initialize_state()
    loop = asyncio.new_event_loop()

    async def broadcast(replicas: list[_Replica]) -> None:  # as Serve's long poll does, on the router's loop
        router.update_replicas(replicas)

    loop.run_until_complete(broadcast([own]))  # the peer's start not broadcast yet

    async def peer_call() -> PendingRequest:  # its future belongs to the router's loop
        return PendingRequest(args=[], kwargs={"copy": 0, "exclude": "own"},
                              metadata=RequestMetadata(request_id="r", internal_request_id="r"))

    pending = loop.run_until_complete(peer_call())
    placed: list[str] = []

    async def route() -> None:
        async for replicas in router._choose_replicas_with_backoff(pending):
            placed.extend(replica.replica_id.unique_id for replica in replicas)
            return

    thread = threading.Thread(target=loop.run_until_complete, args=(route(),), daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(broadcast([own, peer]), loop)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the router's event loop never ran the broadcast that names the peer"
        assert placed == ["peer"]
        assert pending.routing_context.should_backoff
    finally:
        if thread.is_alive():  # the spinning loop sees the peer without its broadcast, and ends
            router._replicas_list = [own, peer]
            thread.join(timeout=10)
        loop.close()
