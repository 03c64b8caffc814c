"""The engine lane (``cluster/engine_lane.py``) and per-tenant admission (``cluster/admission.py``): the
pure parts of a replica, tested without Ray or an engine."""

from __future__ import annotations

import asyncio

import pytest

from cluster.admission import GroupsInFlight
from cluster.engine_lane import EngineLane, estimated_tokens
from cluster.engines import EngineDeadError
from cluster.fair_share import FairGate
from cluster.protocol.schema import GroupRequest, GroupResult, Usage


def group(group_id: str, tenant: str = "default") -> GroupRequest:
    return GroupRequest(group_id=group_id, tenant=tenant, source="Hello there.", candidates=["Hallo.", "Servus."],
                        src_lang="en", trg_lang="de")


class Scorer:
    """Answers each group when released; dies when told to."""

    def __init__(self):
        self.release = asyncio.Event()
        self.dead = False
        self.scored: list[str] = []

    async def score_group(self, request: GroupRequest) -> GroupResult:
        await self.release.wait()
        if self.dead:
            raise EngineDeadError("scripted death")
        self.scored.append(request.group_id)
        return GroupResult(group_id=request.group_id, valid=True, scores=[3, 8], usage=Usage(prompt_tokens=90,
                                                                                             completion_tokens=10))


async def test_a_group_waits_at_the_gate_may_move_until_the_engine_takes_it_and_its_work_is_metered():
    scorer, seen = Scorer(), []
    lane = EngineLane(scorer, FairGate(1), on_scored=lambda g, r, waited: seen.append((g.group_id, r.valid)))
    first = asyncio.ensure_future(lane.assembled.score_group(group("a")))
    second = asyncio.ensure_future(lane.assembled.score_group(group("b")))
    await asyncio.sleep(0.01)
    assert lane.queued == {"b"} and lane.work.waiting == 1  # "a" is at the engine, "b" waits its turn
    scorer.release.set()
    assert [(await first).group_id, (await second).group_id] == ["a", "b"]
    assert lane.queued == set() and lane.work.waiting == 0 and lane.groups_scored == 2
    assert seen == [("a", True), ("b", True)]
    assert estimated_tokens(group("x")) == pytest.approx((12 + 6 + 7) / 4 + 64)


async def test_a_dead_engine_is_raised_for_the_replica_and_the_lane_takes_no_more_groups():
    scorer = Scorer()
    lane = EngineLane(scorer, FairGate(2))
    scorer.dead = True
    scorer.release.set()
    with pytest.raises(EngineDeadError, match="scripted death"):
        await lane.score(group("a"))
    assert isinstance(lane.lost, EngineDeadError) and lane.groups_scored == 0 and lane.work.waiting == 0
    scorer.dead = False
    with pytest.raises(EngineDeadError, match="lost"):
        await lane.score(group("b"))
    assert scorer.scored == []


def test_a_tenant_over_its_limit_gets_no_new_group_but_its_groups_take_their_members():
    limits = {"capped": 2}
    admission = GroupsInFlight(limits.get, "r1")
    assert admission.admit("capped", "g1") is None and admission.admit("capped", "g2") is None
    refusal = admission.admit("capped", "g3")
    assert refusal is not None and "capped" in refusal and "max_groups_in_flight 2" in refusal
    assert admission.admit("capped", "g1") is None  # a member of a group it has here joins
    assert all(admission.admit("free", f"g{i}") is None for i in range(50))  # no limit
    admission.settle("capped", "g1")
    assert admission.admit("capped", "g3") is None and admission.count("capped") == 2
    for name in ("g2", "g3"):
        admission.settle("capped", name)
    assert admission.tenants() == {"free"}  # a tenant is forgotten once it has nothing here
