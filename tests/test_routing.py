"""Routing decisions (pure policy): consistent hashing, bounded load, stickiness, least work."""

from __future__ import annotations

from collections import Counter

import pytest

from cluster.routing import NO_HINT, HashRing, RouteHint, RoutingPolicy, route_key, stable_hash
from cluster.protocol.schema import DemandAnnouncement, GroupRequest, MemberRequest

REPLICAS = ["r1", "r2", "r3"]


def policy(**kwargs) -> RoutingPolicy:
    routing = RoutingPolicy(**kwargs)
    routing.update_replicas(REPLICAS)
    return routing


def test_stable_hash_is_the_same_in_every_process():
    # Independent of PYTHONHASHSEED: blake2b of the UTF-8 bytes.
    import hashlib

    assert stable_hash("g") == int.from_bytes(hashlib.blake2b(b"g", digest_size=8).digest(), "big")


def test_ring_walk_visits_every_replica_once_starting_at_the_owner():
    ring = HashRing(REPLICAS, virtual_nodes=50)
    for key in ("a", "b", "c", "group-17"):
        order = ring.walk(key)
        assert sorted(order) == REPLICAS
    assert HashRing([], virtual_nodes=5).walk("x") == []


def test_two_routers_agree_on_every_group_without_load():
    first, second = policy(), policy()
    for i in range(500):
        assert first.rank_for_group(f"g{i}", {})[0] == second.rank_for_group(f"g{i}", {})[0]


def test_groups_spread_evenly_over_replicas():
    routing = policy()
    counts = Counter(routing.rank_for_group(f"g{i}", {})[0] for i in range(3000))
    assert set(counts) == set(REPLICAS)
    assert max(counts.values()) / min(counts.values()) < 1.5


def test_adding_a_replica_moves_only_about_a_quarter_of_groups():
    before = policy()
    owners = {f"g{i}": before.ring.walk(f"g{i}")[0] for i in range(2000)}
    after = RoutingPolicy()
    after.update_replicas(REPLICAS + ["r4"])
    moved = sum(after.ring.walk(g)[0] != owner for g, owner in owners.items())
    assert 0.15 < moved / len(owners) < 0.35
    # Groups that moved, moved to the new replica only.
    assert all(after.ring.walk(g)[0] in (owner, "r4") for g, owner in owners.items())


def test_overloaded_owner_hands_new_groups_to_the_next_replica_on_the_ring():
    routing = policy(load_factor=1.25, headroom=4)
    order = routing.ring.walk("hot-group")
    loads = {order[0]: 100.0, order[1]: 0.0, order[2]: 0.0}
    assert routing.rank_for_group("hot-group", loads)[0] == order[1]


def test_owner_keeps_a_group_when_only_slightly_busier():
    routing = policy(load_factor=1.25, headroom=8)
    order = routing.ring.walk("warm-group")
    assert routing.rank_for_group("warm-group", {order[0]: 6.0})[0] == order[0]


def test_assigned_groups_follow_their_replica_even_when_it_becomes_overloaded():
    routing = policy(headroom=0)
    owner = routing.rank_for_group("g-sticky", {})[0]
    overloaded = {owner: 1000.0}
    assert routing.rank_for_group("g-sticky", overloaded)[0] == owner


def test_unbounded_ranking_ignores_loads_and_sticky_assignments():
    # Members and retries: every router must agree, whatever loads it sees and remembers.
    routing = policy(headroom=0)
    order = routing.ring.walk("g-split")
    assert routing.rank_for_group("g-split", {order[0]: 1000.0})[0] == order[1]  # sticky now
    assert routing.rank_for_group("g-split", {order[0]: 1000.0}, bounded=False)[0] == order[0]
    fresh = policy(headroom=0)
    assert fresh.rank_for_group("g-split", {order[0]: 1000.0}, bounded=False)[0] == order[0]


def test_dead_replica_loses_its_groups_and_they_move_on():
    routing = policy()
    owner = routing.rank_for_group("g-dies", {})[0]
    survivors = [r for r in REPLICAS if r != owner]
    routing.update_replicas(survivors)
    assert routing.assigned_replica("g-dies") is None
    assert routing.rank_for_group("g-dies", {})[0] in survivors


def test_assignments_expire_and_are_bounded():
    now = [0.0]
    routing = policy(assignment_ttl_s=10, max_assignments=5, clock=lambda: now[0])
    routing.rank_for_group("g0", {})
    assert routing.assigned_replica("g0") is not None
    now[0] = 11
    assert routing.assigned_replica("g0") is None
    for i in range(20):
        routing.rank_for_group(f"h{i}", {})
    assert len(routing._assignments) == 5


def test_least_loaded_counts_work_not_requests():
    routing = policy()
    assert routing.rank_least_loaded({"r1": 12.0, "r2": 3.0, "r3": 7.0})[0] == "r2"
    ties = Counter(routing.rank_least_loaded({}, tie_break_key=f"req{i}")[0] for i in range(300))
    assert set(ties) == set(REPLICAS)


def test_a_route_hint_survives_its_session_id_and_garbage_reads_as_none():
    hint = RouteHint(attempt=3, target_replica="abc:def", handed_off=2)  # a colon in an id is kept
    assert RouteHint.decode(hint.encode()) == hint
    assert NO_HINT.encode() == ""  # no hint: the handle keeps Serve's default session id
    for session_id in (None, "", "a user's own session", "grrm-route:", "grrm-route:x:1:r", "grrm-route:1"):
        assert RouteHint.decode(session_id) == NO_HINT


def test_route_key_reads_members_groups_and_hints():
    member = MemberRequest(group_id="g", group_size=4, index=1, source="s", candidate="c", src_lang="en", trg_lang="de")
    group = GroupRequest(group_id="g2", source="s", candidates=["a", "b", "c"], src_lang="en", trg_lang="de")
    resent = RouteHint.decode(RouteHint(attempt=2).encode())  # as the router reads the session id
    key = route_key((member,), {}, resent)
    assert (key.group_id, key.work, key.member, key.attempt) == ("g", 1.0, True, 2)
    # A keyword named like a hint is the request's business, not the router's.
    assert route_key((member,), {"attempt": 2}).attempt == 0
    key = route_key((group,), {})
    assert (key.group_id, key.work, key.member) == ("g2", 3.0, False)
    addressed = route_key((member,), {}, RouteHint.decode(RouteHint(target_replica="r9").encode()))
    assert addressed.target_replica == "r9" and not addressed.member
    assert route_key((), {}).group_id is None
    # A tenant's demand announcements all go to its ring owner, where the next replaces the last.
    key = route_key((DemandAnnouncement(tenant="run-7", groups=64, lasts_s=30),), {})
    assert (key.group_id, key.member, key.work) == ("demand:run-7", True, 0.0)


@pytest.mark.parametrize("bad", [{"load_factor": 0.5}, {"headroom": -1}, {"virtual_nodes": 0}])
def test_invalid_policy_settings_are_refused(bad):
    with pytest.raises(ValueError):
        RoutingPolicy(**bad)
