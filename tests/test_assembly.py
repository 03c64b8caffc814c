"""GroupAssembler: members arriving in any order become one scored group, answered per member."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from cluster.assembly import AssemblySettings, GroupAssembler
from cluster.assembly_observers import AssemblyObserver, RecentGroups
from cluster.completed_groups import CompletedGroups
from cluster.engines.base import EngineDeadError
from cluster.fair_share import FairGate
from cluster.protocol.schema import GroupRequest, GroupResult, MemberRequest


def expected_score(candidate: str) -> int:
    """The fake scorer's score for a candidate: deterministic, differs between candidates."""
    return sum(map(ord, candidate)) % 100


class FakeScorer:
    """A scorer stand-in that records its calls; optionally slow, failing or held."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None, result: GroupResult | None = None):
        self.calls: list[GroupRequest] = []
        self.delay_s = delay_s
        self.error = error
        self.result = result
        self.release: asyncio.Event | None = None  # when set, calls wait for it
        self.finished = 0

    async def score_group(self, group: GroupRequest) -> GroupResult:
        self.calls.append(group)
        if self.release is not None:
            await self.release.wait()
        await asyncio.sleep(self.delay_s)
        self.finished += 1
        if self.error is not None:
            raise self.error
        if self.result is not None:
            return self.result
        return GroupResult(
            group_id=group.group_id,
            scores=[expected_score(candidate) for candidate in group.candidates],
            valid=True,
            attempts=1,
            replica="replica-7",
        )


class ScoresBy:
    """A scorer that answers with an async function of the group."""

    def __init__(self, score: Callable[[GroupRequest], Awaitable[GroupResult]]):
        self.score = score

    async def score_group(self, group: GroupRequest) -> GroupResult:
        return await self.score(group)


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def member(group_id: str = "g1", index: int = 0, group_size: int = 4, **fields) -> MemberRequest:
    values = {
        "source": f"Source sentence of {group_id}.",
        "candidate": f"Translation {index} of {group_id}.",
        "src_lang": "en",
        "trg_lang": "de",
    }
    values.update(fields)
    return MemberRequest(group_id=group_id, group_size=group_size, index=index, **values)


def verdict_of(result) -> dict:
    """A member's answer without its own arrival time: what two answers of one group share
    (scores, failure, and the group's completion and scoring times)."""
    return result.model_dump(exclude={"timing": {"received_at"}})


async def settle() -> None:
    """Let every ready task run (submits register, scoring tasks start)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_shuffled_arrival_scores_each_group_once_in_index_order():
    scorer = FakeScorer(delay_s=0.01)
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    randomness = random.Random(1234)
    members = [member(f"group-{group}", index) for group in range(50) for index in range(4)]
    randomness.shuffle(members)

    async def arrive(request: MemberRequest, delay_s: float):
        await asyncio.sleep(delay_s)
        return await assembler.submit(request)

    results = await asyncio.gather(*(arrive(request, randomness.uniform(0, 0.05)) for request in members))

    assert len(scorer.calls) == 50
    assert len({call.group_id for call in scorer.calls}) == 50
    for call in scorer.calls:
        assert call.candidates == [f"Translation {index} of {call.group_id}." for index in range(4)]
        assert call.source == f"Source sentence of {call.group_id}."
        assert (call.src_lang, call.trg_lang) == ("en", "de")
    for request, result in zip(members, results, strict=True):
        assert (result.group_id, result.index) == (request.group_id, request.index)
        assert result.valid and result.failure is None and result.error is None
        assert result.score == expected_score(request.candidate)
        assert result.group_scores == [expected_score(f"Translation {i} of {request.group_id}.") for i in range(4)]
        assert result.replica == "replica-7" and result.attempts == 1
    stats = assembler.stats()
    assert stats["groups_scored"] == 50 and stats["members_received"] == 200
    assert stats["pending_groups"] == stats["scoring_groups"] == stats["members_waiting"] == 0


async def test_group_of_one_is_answered_at_once_without_scoring():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    result = await assembler.submit(member("solo", 0, group_size=1))
    assert not result.valid and result.score is None
    assert result.failure == "too_few_distinct"
    assert scorer.calls == [] and assembler.pending_groups() == 0


async def test_assembly_timeout_reports_how_many_members_arrived():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=0.2, replica="replica-3"))
    results = await asyncio.gather(*(assembler.submit(member("g1", index)) for index in (0, 1, 3)))
    for result in results:
        assert not result.valid and result.score is None and result.group_scores is None
        assert result.failure == "timeout"
        assert result.error == "group g1: assembly timed out after 0.2 s with 3 of 4 members (missing indices [2])"
        assert result.replica == "replica-3"
    assert scorer.calls == []
    assert assembler.pending_groups() == 0 and assembler.stats()["assembly_timeouts"] == 1

    # The partial group was dropped: the late member starts a new assembly.
    late = asyncio.create_task(assembler.submit(member("g1", 2)))
    await settle()
    assert assembler.pending_groups() == 1 and assembler.members_waiting() == 1
    rest = await asyncio.gather(*(assembler.submit(member("g1", index)) for index in (0, 1, 3)))
    assert (await late).valid and all(result.valid for result in rest)
    assert len(scorer.calls) == 1


async def test_assembly_deadline_runs_from_the_first_member_on_the_injected_clock():
    clock = FakeClock()
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=30.0), clock=clock)
    first = asyncio.create_task(assembler.submit(member("g1", 0, group_size=3)))
    await settle()
    clock.now += 20
    second = asyncio.create_task(assembler.submit(member("g1", 1, group_size=3)))
    await settle()
    assembler.expire_overdue()
    assert not first.done() and assembler.pending_groups() == 1

    clock.now += 10.5  # 30.5 s after the first member, 10.5 s after the second
    assembler.expire_overdue()
    for result in await asyncio.gather(first, second):
        assert result.failure == "timeout"
        assert result.error == "group g1: assembly timed out after 30.0 s with 2 of 3 members (missing indices [2])"
    assert assembler.pending_groups() == 0 and scorer.calls == []


async def test_the_clock_decides_when_the_loop_timer_fires_early():
    # The loop timer wakes the assembler; if the clock says the deadline has not come, it waits on.
    clock = FakeClock()
    assembler = GroupAssembler(FakeScorer(), AssemblySettings(assembly_timeout_s=0.05), clock=clock)
    waiting = asyncio.create_task(assembler.submit(member("g1", 0, group_size=2)))
    await asyncio.sleep(0.15)
    assert not waiting.done() and assembler.pending_groups() == 1
    clock.now += 0.05
    result = await asyncio.wait_for(waiting, timeout=1.0)
    assert result.failure == "timeout" and assembler.pending_groups() == 0


@pytest.mark.parametrize(
    ("field", "conflicting"),
    [
        ("source", {"source": "Another source."}),
        ("src_lang", {"src_lang": "fr"}),
        ("trg_lang", {"trg_lang": "ja"}),
        ("group_size", {"group_size": 3}),
    ],
)
async def test_a_member_that_disagrees_with_its_group_is_rejected(field, conflicting):
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    first = asyncio.create_task(assembler.submit(member("g1", 0)))
    await settle()

    rejected = await assembler.submit(member("g1", 1, **conflicting))
    assert not rejected.valid and rejected.score is None
    assert rejected.failure == "conflict"
    assert f"disagrees with the group on {field}" in rejected.error

    # It did not join: the group still waits for index 1 and completes normally.
    assert assembler.pending_groups() == 1 and not first.done()
    rest = await asyncio.gather(*(assembler.submit(member("g1", index)) for index in (1, 2, 3)))
    assert (await first).valid and all(result.valid for result in rest)
    assert len(scorer.calls) == 1 and assembler.stats()["conflicts"] == 1


async def test_a_retried_member_waits_on_the_same_outcome_and_is_counted_once():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    original = asyncio.create_task(assembler.submit(member("g1", 0)))
    retry = asyncio.create_task(assembler.submit(member("g1", 0)))
    await settle()
    assert assembler.members_waiting() == 2 and not original.done()

    rest = await asyncio.gather(*(assembler.submit(member("g1", index)) for index in (1, 2, 3)))
    assert verdict_of(await original) == verdict_of(await retry)
    assert (await original).score == expected_score("Translation 0 of g1.")
    assert all(result.valid for result in rest)
    assert len(scorer.calls) == 1
    assert scorer.calls[0].candidates == [f"Translation {index} of g1." for index in range(4)]
    assert assembler.stats()["duplicates"] == 1


async def test_a_retry_during_scoring_joins_the_scoring_in_flight():
    scorer = FakeScorer()
    scorer.release = asyncio.Event()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    tasks = [asyncio.create_task(assembler.submit(member("g1", index))) for index in range(4)]
    await settle()
    assert assembler.scoring_groups() == 1 and len(scorer.calls) == 1
    retry = asyncio.create_task(assembler.submit(member("g1", 2)))
    await settle()
    scorer.release.set()
    results = await asyncio.gather(*tasks)
    assert verdict_of(await retry) == verdict_of(results[2])
    assert len(scorer.calls) == 1 and assembler.stats()["duplicates"] == 1


async def test_same_index_with_a_different_candidate_is_rejected():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    first = asyncio.create_task(assembler.submit(member("g1", 2)))
    await settle()
    rejected = await assembler.submit(member("g1", 2, candidate="Something else."))
    assert rejected.failure == "conflict" and not rejected.valid
    assert "index 2 already has a different candidate" in rejected.error
    await asyncio.gather(*(assembler.submit(member("g1", index)) for index in (0, 1, 3)))
    assert (await first).score == expected_score("Translation 2 of g1.")
    assert scorer.calls[0].candidates[2] == "Translation 2 of g1."


async def test_a_member_of_a_scored_group_gets_the_cached_answer():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    results = await asyncio.gather(*(assembler.submit(member("g1", index)) for index in range(4)))

    again = await assembler.submit(member("g1", 3))
    assert verdict_of(again) == verdict_of(results[3])
    assert again.timing.received_at >= results[3].timing.scoring_ended_at
    assert len(scorer.calls) == 1 and assembler.pending_groups() == 0
    assert assembler.stats()["cached_answers"] == 1

    different = await assembler.submit(member("g1", 3, candidate="A new translation."))
    assert different.failure == "conflict" and "index 3 already has a different candidate" in different.error
    wrong_source = await assembler.submit(member("g1", 3, source="Another source."))
    assert wrong_source.failure == "conflict" and "source" in wrong_source.error
    wrong_size = await assembler.submit(member("g1", 3, group_size=5))
    assert wrong_size.failure == "conflict" and "group_size" in wrong_size.error
    assert len(scorer.calls) == 1


async def test_cached_answers_expire_after_their_ttl():
    clock = FakeClock()
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0),
                               completed=CompletedGroups(ttl_s=60.0, clock=clock), clock=clock)
    await asyncio.gather(*(assembler.submit(member("g1", index, group_size=2)) for index in range(2)))

    clock.now += 59
    assert (await assembler.submit(member("g1", 0, group_size=2))).valid
    assert assembler.stats()["completed_cached"] == 1

    clock.now += 2  # 61 s after the group was scored
    late = asyncio.create_task(assembler.submit(member("g1", 0, group_size=2)))
    await settle()
    assert assembler.stats()["completed_cached"] == 0
    assert assembler.pending_groups() == 1 and not late.done()  # a new assembly, not the old answer
    await assembler.close()
    assert (await late).failure == "shutting_down"
    assert len(scorer.calls) == 1


async def test_the_completed_cache_is_bounded():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0),
                               completed=CompletedGroups(max_groups=2))
    for group in ("a", "b", "c"):
        await asyncio.gather(*(assembler.submit(member(group, index, group_size=2)) for index in range(2)))
    assert assembler.stats()["completed_cached"] == 2
    # The oldest group was forgotten; the newest answers from the cache.
    assert (await assembler.submit(member("c", 1, group_size=2))).valid
    assert assembler.stats()["cached_answers"] == 1
    forgotten = asyncio.create_task(assembler.submit(member("a", 1, group_size=2)))
    await settle()
    assert assembler.pending_groups() == 1
    await assembler.close()
    assert (await forgotten).failure == "shutting_down"


async def test_when_score_group_raises_every_member_gets_the_error():
    scorer = FakeScorer(error=RuntimeError("CUDA out of memory"))
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    results = await asyncio.wait_for(
        asyncio.gather(*(assembler.submit(member("g1", index)) for index in range(4))), timeout=2.0
    )
    for result in results:
        assert not result.valid and result.score is None and result.group_scores is None
        assert result.failure == "engine_error"
        assert "RuntimeError: CUDA out of memory" in result.error
    assert assembler.stats()["scoring_failures"] == 1 and assembler.scoring_groups() == 0
    # The error is the group's answer: a retry gets it too, without a second scoring.
    assert (await assembler.submit(member("g1", 0))).failure == "engine_error"
    assert len(scorer.calls) == 1


async def test_a_group_whose_engine_died_is_neither_answered_nor_published_nor_cached():
    ledger = MemoryLedger()
    dying = _on_ledger(ledger, replica="r1", scorer=FakeScorer(error=EngineDeadError("engine core died")))
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(dying.submit(member("g1", index)) for index in range(4)), return_exceptions=True), timeout=2.0
    )
    # No verdict exists: every member is told so (its replica re-sends nothing itself), none is
    # answered engine_error, and nothing is left for a retry or another replica to adopt.
    assert all(isinstance(outcome, EngineDeadError) for outcome in outcomes), outcomes
    stats = dying.stats()
    assert stats["groups_abandoned"] == 1 and stats["scoring_failures"] == 0 and stats["completed_cached"] == 0
    assert dying.scoring_groups() == 0 and dying.members_waiting() == 0 and ledger.records == {}
    # Re-sent together to a live replica, the group is scored there once, as if never seen.
    live_scorer = FakeScorer()
    live = _on_ledger(ledger, replica="r2", scorer=live_scorer)
    answers = await asyncio.gather(*(live.submit(member("g1", index)) for index in range(4)))
    assert all(answer.valid for answer in answers) and len(live_scorer.calls) == 1
    assert ledger.records["g1"].verdict.scores == tuple(answers[0].group_scores)


async def test_an_invalid_group_result_reaches_every_member_without_a_score():
    failed = GroupResult(
        valid=False, failure="parse_failed", error="no parseable verdict in 3 attempts", attempts=3, replica="r1"
    )
    assembler = GroupAssembler(FakeScorer(result=failed), AssemblySettings(assembly_timeout_s=5.0))
    results = await asyncio.gather(*(assembler.submit(member("g1", index, group_size=3)) for index in range(3)))
    for result in results:
        assert not result.valid and result.score is None and result.group_scores is None
        assert result.failure == "parse_failed" and result.error == "no parseable verdict in 3 attempts"
        assert result.attempts == 3 and result.replica == "r1"


async def test_a_valid_result_with_the_wrong_number_of_scores_is_an_engine_error():
    malformed = GroupResult(valid=True, scores=[3, 1], attempts=1)
    assembler = GroupAssembler(FakeScorer(result=malformed), AssemblySettings(assembly_timeout_s=5.0))
    results = await asyncio.gather(*(assembler.submit(member("g1", index, group_size=3)) for index in range(3)))
    for result in results:
        assert not result.valid and result.score is None
        assert result.failure == "engine_error" and "2 scores for 3 candidates" in result.error


async def test_cancelled_callers_do_not_break_the_group_for_the_others():
    scorer = FakeScorer()
    scorer.release = asyncio.Event()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    early = asyncio.create_task(assembler.submit(member("g1", 0)))
    await settle()
    early.cancel()  # gone while the group is still collecting: its candidate stays in the group
    await settle()
    assert assembler.members_waiting() == 0 and assembler.pending_groups() == 1

    others = [asyncio.create_task(assembler.submit(member("g1", index))) for index in (1, 2, 3)]
    await settle()
    assert assembler.scoring_groups() == 1
    others[0].cancel()  # gone while the group is being scored: the scoring goes on
    await settle()
    scorer.release.set()
    results = await asyncio.gather(*others[1:])

    assert early.cancelled() and others[0].cancelled()
    assert all(result.valid for result in results)
    assert [result.score for result in results] == [expected_score(f"Translation {i} of g1.") for i in (2, 3)]
    assert len(scorer.calls) == 1 and scorer.finished == 1
    stats = assembler.stats()
    assert stats["cancelled_waiters"] == 2
    assert stats["members_waiting"] == stats["pending_groups"] == stats["scoring_groups"] == 0
    # The member whose caller went away can retry and gets the group's answer.
    retried = await assembler.submit(member("g1", 0))
    assert retried.valid and retried.score == expected_score("Translation 0 of g1.")
    # Nothing is left behind: no scoring task, no timer-held waiter.
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_scoring_survives_when_every_caller_goes_away():
    scorer = FakeScorer()
    scorer.release = asyncio.Event()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    callers = [asyncio.create_task(assembler.submit(member("g1", index, group_size=2))) for index in range(2)]
    await settle()
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    scorer.release.set()
    await settle()
    assert scorer.finished == 1 and assembler.scoring_groups() == 0 and assembler.members_waiting() == 0
    assert (await assembler.submit(member("g1", 1, group_size=2))).valid
    assert len(scorer.calls) == 1


async def test_too_many_assembling_groups_refuses_new_groups_only():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0, max_pending_groups=2))
    waiting = [asyncio.create_task(assembler.submit(member(group, 0, group_size=2))) for group in ("a", "b")]
    await settle()
    refused = await assembler.submit(member("c", 0, group_size=2))
    assert refused.failure == "overloaded" and "too many groups assembling" in refused.error
    assert assembler.stats()["rejected_overload"] == 1

    # Groups already assembling still take members, and finishing one makes room.
    finished = await assembler.submit(member("a", 1, group_size=2))
    assert finished.valid and (await waiting[0]).valid
    admitted = asyncio.create_task(assembler.submit(member("c", 0, group_size=2)))
    await settle()
    assert assembler.pending_groups() == 2 and not admitted.done()
    await assembler.close()
    assert (await admitted).failure == "shutting_down" and (await waiting[1]).failure == "shutting_down"


async def test_close_answers_every_waiting_member_and_refuses_new_ones():
    scorer = FakeScorer()
    scorer.release = asyncio.Event()  # never set: the scoring is still running at close
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    collecting = asyncio.create_task(assembler.submit(member("collecting", 0, group_size=2)))
    scoring = [asyncio.create_task(assembler.submit(member("scoring", index, group_size=2))) for index in range(2)]
    await settle()
    assert assembler.pending_groups() == 1 and assembler.scoring_groups() == 1

    await asyncio.wait_for(assembler.close(), timeout=1.0)
    for result in await asyncio.gather(collecting, *scoring):
        assert not result.valid and result.score is None
        assert result.failure == "shutting_down" and "shut down" in result.error
    after = await assembler.submit(member("new", 0, group_size=2))
    assert after.failure == "shutting_down" and "shutting down" in after.error
    assert assembler.stats()["members_waiting"] == assembler.pending_groups() == assembler.scoring_groups() == 0


async def test_missing_indices_are_shortened_in_large_groups():
    clock = FakeClock()
    assembler = GroupAssembler(FakeScorer(), AssemblySettings(assembly_timeout_s=1.0), clock=clock)
    waiting = asyncio.create_task(assembler.submit(member("big", 0, group_size=100)))
    await settle()
    clock.now += 2
    assembler.expire_overdue()
    result = await waiting
    assert "with 1 of 100 members" in result.error
    assert "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, ... 79 more]" in result.error


def test_settings_are_checked():
    with pytest.raises(ValueError, match="assembly_timeout_s"):
        GroupAssembler(FakeScorer(), AssemblySettings(assembly_timeout_s=0))
    with pytest.raises(ValueError, match="max_pending_groups"):
        GroupAssembler(FakeScorer(), AssemblySettings(assembly_timeout_s=1.0, max_pending_groups=0))


# ----------------------------------------------------------------------------- the ledger


class MemoryLedger:
    """An in-process ledger (the Serve one is deployments/ledger.py)."""

    def __init__(self, fail: bool = False, put_delay_s: float = 0.0, get_delay_s: float = 0.0):
        self.records = {}
        self.fail = fail
        self.put_delay_s = put_delay_s
        self.get_delay_s = get_delay_s

    async def put(self, group_id, record):
        if self.fail:
            raise ConnectionError("ledger down")
        await asyncio.sleep(self.put_delay_s)
        self.records[group_id] = record

    async def get(self, group_id):
        if self.fail:
            raise ConnectionError("ledger down")
        await asyncio.sleep(self.get_delay_s)
        return self.records.get(group_id)


def _member_of(group_id: str, index: int, size: int = 3, candidate: str | None = None) -> MemberRequest:
    return MemberRequest(group_id=group_id, group_size=size, index=index, source="Quelle", candidate=candidate or f"c{index}",
                         src_lang="de", trg_lang="en")


async def _scores_by_length(group: GroupRequest) -> GroupResult:
    return GroupResult(group_id=group.group_id, scores=[len(c) % 11 for c in group.candidates], valid=True, replica="r1",
                       attempts=1)


def _on_ledger(ledger, replica: str = "", assembly_timeout_s: float = 5, scorer=None, **completed) -> GroupAssembler:
    """The assembler of a replica that publishes its scored groups to ``ledger`` (and adopts others' from it)."""
    return GroupAssembler(scorer or ScoresBy(_scores_by_length),
                          AssemblySettings(assembly_timeout_s=assembly_timeout_s, replica=replica),
                          completed=CompletedGroups(ledger=ledger, **completed))


async def test_a_member_re_sent_after_its_replica_died_gets_the_published_answer():
    ledger = MemoryLedger()
    first_replica = _on_ledger(ledger, replica="r1")
    answers = await asyncio.gather(*(first_replica.submit(_member_of("g", i, candidate="x" * (i + 1))) for i in range(3)))
    assert "g" in ledger.records  # published before the members were answered
    # r1 "dies" before member 2's answer reached its caller; member 2 is re-sent to r2 alone.
    second_replica = _on_ledger(ledger, replica="r2")
    resent = await asyncio.wait_for(second_replica.submit(_member_of("g", 2, candidate="xxx")), timeout=2)
    assert resent.valid and resent.score == answers[2].score and resent.group_scores == answers[2].group_scores
    assert resent.replica == "r1"  # the replica that scored the group
    assert second_replica.stats()["ledger_adopted"] == 1 and second_replica.stats()["groups_scored"] == 0


async def test_a_whole_group_re_sent_before_the_ledger_answers_is_not_scored_again():
    """The race issue 48 found: r1 scored and published a group, then died; all its members are
    re-sent to r2 at once and complete the group there before r2's ledger lookup answers (a loaded
    ledger). r2 waits for the lookup and answers r1's verdict: every member holds one verdict's rewards."""
    ledger = MemoryLedger()
    first_replica = _on_ledger(ledger, replica="r1")
    answers = await asyncio.gather(*(first_replica.submit(_member_of("g", i, candidate="x" * (i + 1))) for i in range(3)))
    scored_again = []

    async def another_verdict(group: GroupRequest) -> GroupResult:
        scored_again.append(group.group_id)
        return GroupResult(group_id=group.group_id, scores=[10.0, 0.0, 5.0], valid=True, replica="r2", attempts=1)

    ledger.get_delay_s = 0.3
    second_replica = _on_ledger(ledger, replica="r2", scorer=ScoresBy(another_verdict))
    resent = await asyncio.wait_for(asyncio.gather(
        *(second_replica.submit(_member_of("g", i, candidate="x" * (i + 1))) for i in range(3))), timeout=2)
    assert scored_again == [] and second_replica.stats()["groups_scored"] == 0
    assert [verdict_of(answer) for answer in resent] == [verdict_of(answer) for answer in answers]
    assert {answer.replica for answer in resent} == {"r1"} and second_replica.stats()["ledger_adopted"] == 1


async def test_a_ledger_that_does_not_answer_delays_a_complete_group_by_its_timeout_only():
    stuck = MemoryLedger(get_delay_s=30)
    assembler = _on_ledger(stuck, ledger_timeout_s=0.2)
    started = asyncio.get_running_loop().time()
    answers = await asyncio.wait_for(asyncio.gather(*(assembler.submit(_member_of("g", i)) for i in range(3))), 2)
    assert all(answer.valid for answer in answers) and assembler.stats()["groups_scored"] == 1
    assert assembler.stats()["ledger_errors"] == 1 and asyncio.get_running_loop().time() - started >= 0.2


async def test_a_different_group_under_the_same_id_is_not_adopted():
    ledger = MemoryLedger()
    await asyncio.gather(*(_on_ledger(ledger).submit(
        _member_of("same-id", i)) for i in range(3)))
    other = _on_ledger(ledger, assembly_timeout_s=0.3)
    answer = await other.submit(_member_of("same-id", 0, candidate="a different text"))
    assert answer.failure == "timeout" and other.stats()["ledger_adopted"] == 0


async def test_a_failing_ledger_never_holds_answers_back():
    assembler = _on_ledger(MemoryLedger(fail=True))
    answers = await asyncio.gather(*(assembler.submit(_member_of("g", i)) for i in range(3)))
    assert all(a.valid for a in answers)
    assert assembler.stats()["ledger_errors"] >= 1


async def test_a_slow_ledger_write_answers_the_members_first_and_still_lands():
    # CI once lost 4 records this way: the write was cancelled at the timeout while a replica
    # was being replaced, so members re-sent later could not find what the others were told.
    ledger = MemoryLedger(put_delay_s=0.5)
    assembler = _on_ledger(ledger, ledger_timeout_s=0.1)
    answers = await asyncio.wait_for(asyncio.gather(*(assembler.submit(_member_of("g", i)) for i in range(3))), 0.4)
    assert all(a.valid for a in answers) and "g" not in ledger.records
    assert assembler.stats()["ledger_late_writes"] == 1
    await asyncio.sleep(0.6)
    assert ledger.records["g"].verdict.scores == tuple(answers[0].group_scores)
    assert assembler.stats()["ledger_errors"] == 0


async def test_closing_gives_a_late_ledger_write_a_short_grace_and_no_more():
    slow = MemoryLedger(put_delay_s=0.45)
    assembler = _on_ledger(slow, ledger_timeout_s=0.3)
    await asyncio.gather(*(assembler.submit(_member_of("g", i)) for i in range(3)))
    await assembler.close()  # the write needed 0.15 s more than its members waited: the grace covers it
    assert "g" in slow.records
    stuck = MemoryLedger(put_delay_s=30)
    assembler = _on_ledger(stuck, ledger_timeout_s=0.1)
    await asyncio.gather(*(assembler.submit(_member_of("g", i)) for i in range(3)))
    await asyncio.wait_for(assembler.close(), 2)  # a ledger that never answers cannot hold the shutdown
    assert "g" not in stuck.records


# ------------------------------------------------------------- members without a position


def keyed(group_id: str, member_id: str, candidate: str, group_size: int = 4, **fields) -> MemberRequest:
    """A member sent with a member_id instead of an index (verl's fully_async_policy rows)."""
    values = {"source": f"Source of {group_id}.", "src_lang": "en", "trg_lang": "de"}
    values.update(fields)
    return MemberRequest(group_id=group_id, group_size=group_size, member_id=member_id, candidate=candidate, **values)


TEXTS = {"m-a": "Der Hund schläft.", "m-b": "Der Hund ruht.", "m-c": "Ein Hund schläft.", "m-d": "Hund schlafen."}


async def test_members_without_positions_give_the_same_prompt_in_any_arrival_order():
    prompts = []
    for seed in range(6):
        scorer = FakeScorer(delay_s=0.001)
        assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
        order = list(TEXTS)
        random.Random(seed).shuffle(order)
        results = await asyncio.gather(*(assembler.submit(keyed("g", key, TEXTS[key])) for key in order))
        assert len(scorer.calls) == 1
        prompts.append(scorer.calls[0].candidates)
        for key, result in zip(order, results, strict=True):
            # Each member gets the score of its own text, at the position the replica gave it.
            assert result.valid and result.member_id == key
            assert result.score == expected_score(TEXTS[key])
            assert result.group_scores[result.index] == result.score
        assert sorted(result.index for result in results) == [0, 1, 2, 3]
    assert all(prompt == prompts[0] for prompt in prompts)
    assert sorted(prompts[0]) == sorted(TEXTS.values())


async def test_equal_texts_under_different_member_ids_are_two_members():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    texts = {"x1": "Gleich.", "x2": "Gleich.", "x3": "Anders."}
    results = await asyncio.gather(*(assembler.submit(keyed("g", k, t, group_size=3)) for k, t in texts.items()))
    assert [r.valid for r in results] == [True, True, True] and len(scorer.calls) == 1
    assert results[0].score == results[1].score == expected_score("Gleich.")


async def test_a_re_sent_member_id_is_recognised_by_id_and_text():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    first = asyncio.create_task(assembler.submit(keyed("g", "m-a", TEXTS["m-a"])))
    again = asyncio.create_task(assembler.submit(keyed("g", "m-a", TEXTS["m-a"])))
    await settle()
    changed = await assembler.submit(keyed("g", "m-a", "Etwas anderes."))
    assert changed.failure == "conflict" and "member_id 'm-a' already has a different candidate" in changed.error
    others = await asyncio.gather(*(assembler.submit(keyed("g", k, TEXTS[k])) for k in ("m-b", "m-c", "m-d")))
    assert verdict_of(await first) == verdict_of(await again) and all(r.valid for r in others)
    assert assembler.stats()["duplicates"] == 1 and len(scorer.calls) == 1
    # After scoring: a known id reads the kept answer, an unknown one is refused, not scored.
    cached = await assembler.submit(keyed("g", "m-c", TEXTS["m-c"]))
    assert verdict_of(cached) == verdict_of(others[1])
    stranger = await assembler.submit(keyed("g", "m-z", "Neu."))
    assert stranger.failure == "conflict" and "without member_id 'm-z'" in stranger.error
    assert len(scorer.calls) == 1


async def test_a_fifth_member_id_in_a_group_of_four_is_refused_while_it_is_scored():
    scorer = FakeScorer()
    scorer.release = asyncio.Event()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0))
    members = [asyncio.create_task(assembler.submit(keyed("g", k, t))) for k, t in TEXTS.items()]
    await settle()
    extra = await assembler.submit(keyed("g", "m-e", "Noch einer."))
    assert extra.failure == "conflict" and "all 4 members have arrived" in extra.error
    scorer.release.set()
    assert all(result.valid for result in await asyncio.gather(*members))


async def test_a_group_mixing_indices_and_member_ids_is_refused():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=0.2))
    first = asyncio.create_task(assembler.submit(member("g", 0)))
    await settle()
    mixed = await assembler.submit(keyed("g", "m-a", "Text.", source="Source sentence of g."))
    assert mixed.failure == "conflict" and "how members are identified" in mixed.error
    assert (await first).failure == "timeout" and scorer.calls == []


async def test_a_scored_group_of_member_ids_is_adopted_from_the_ledger():
    ledger = MemoryLedger()
    first_replica = _on_ledger(ledger, replica="r1")
    answers = await asyncio.gather(*(first_replica.submit(keyed("g", k, t)) for k, t in TEXTS.items()))
    second_replica = _on_ledger(ledger, replica="r2")
    resent = await asyncio.wait_for(second_replica.submit(keyed("g", "m-c", TEXTS["m-c"])), timeout=2)
    assert verdict_of(resent) == verdict_of(answers[2]) and resent.replica == "r1"
    assert second_replica.stats()["ledger_adopted"] == 1
    # The same id with another text is a different group: not adopted.
    third_replica = _on_ledger(ledger, assembly_timeout_s=0.3)
    other = await third_replica.submit(keyed("g", "m-c", "Ganz anders."))
    assert other.failure == "timeout" and third_replica.stats()["ledger_adopted"] == 0


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({}, "index: required unless member_id is given"),
        ({"index": 0, "member_id": "m"}, "member_id: give either index or member_id, not both"),
        ({"member_id": ""}, "member_id"),
    ],
)
def test_a_member_names_its_position_or_its_id_exactly_once(fields, problem):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=problem):
        MemberRequest(group_id="g", group_size=2, source="s", candidate="c", src_lang="en", trg_lang="de", **fields)


# ------------------------------------------------------------------------------- timing


async def test_every_answer_carries_when_its_group_completed_and_was_scored():
    wall = FakeClock()
    scorer = FakeScorer()
    recent = RecentGroups()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=5.0), observers=(recent,), wall_clock=wall)
    first = asyncio.create_task(assembler.submit(member("g", 0, group_size=2, sent_at=990.0)))
    await settle()
    wall.now = 1003.0
    second = await assembler.submit(member("g", 1, group_size=2, sent_at=1001.0))
    first = await first
    assert first.timing.received_at == 1000.0 and second.timing.received_at == 1003.0
    for answer in (first, second):
        assert answer.timing.complete_at == 1003.0
        assert answer.timing.complete_at <= answer.timing.scoring_started_at <= answer.timing.scoring_ended_at
    [trace] = recent.since()
    assert (trace.group_id, trace.group_size, trace.first_sent_at) == ("g", 2, 990.0)
    assert (trace.first_received_at, trace.complete_at, trace.valid) == (1000.0, 1003.0, True)
    assert recent.since(trace.scoring_ended_at + 1) == []
    timed_out = await GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=0.05)).submit(member("h", 0))
    assert timed_out.timing.received_at > 0 and timed_out.timing.scoring_started_at is None


async def test_a_group_handed_off_answers_its_waiting_members_moved_at_once_and_scoring_groups_stay():
    class HandOffs(AssemblyObserver):
        """An observer of hand-offs (a replica's counts them as a metric)."""

        def __init__(self):
            self.seen: list[tuple[str, str]] = []

        def group_handed_off(self, group_id: str, owner: str) -> None:
            self.seen.append((group_id, owner))

    scorer, hand_offs = FakeScorer(), HandOffs()
    scorer.release = asyncio.Event()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=300.0, replica="old-owner"),
                               observers=(hand_offs,))
    moving = [asyncio.create_task(assembler.submit(member("moves", index), "moves")) for index in (0, 2)]
    staying = [asyncio.create_task(assembler.submit(member("stays", index), "stays")) for index in (0, 1)]
    scoring = [asyncio.create_task(assembler.submit(member("scoring", index, group_size=2), "scoring"))
               for index in (0, 1)]
    unkeyed = asyncio.create_task(assembler.submit(member("open#1", 0)))  # no route key: never handed off
    await settle()
    assert assembler.scoring_groups() == 1 and assembler.pending_groups() == 3

    released = assembler.hand_off(lambda key: "new-owner" if key in ("moves", "scoring") else None)
    assert assembler.hand_off(lambda key: "new-owner") == 1  # "stays" now; the unkeyed group stays regardless
    assert released == 1  # "scoring" is complete: it stays and is scored here
    for result in await asyncio.gather(*moving):
        assert result.failure == "moved" and not result.valid and result.score is None
        assert "replica new-owner now collects its members (2 of 4 were here)" in result.error
    assert [result.failure for result in await asyncio.gather(*staying)] == ["moved", "moved"]
    assert not assembler.holds("moves") and not assembler.holds("stays") and assembler.holds("open#1")
    assert assembler.stats()["groups_handed_off"] == 2 and assembler.stats()["assembly_timeouts"] == 0
    assert hand_offs.seen == [("moves", "new-owner"), ("stays", "new-owner")]

    scorer.release.set()
    assert all(result.valid for result in await asyncio.gather(*scoring))
    rest = await asyncio.gather(*(assembler.submit(member("open#1", index)) for index in (1, 2, 3)))
    assert all(result.valid for result in [*rest, await unkeyed])
    assert [call.group_id for call in scorer.calls] == ["scoring", "open#1"]


async def test_a_complete_group_still_waiting_for_the_engine_is_handed_off_and_the_one_at_the_engine_stays():
    # The replica's path: complete groups wait at a one-slot gate; the queued ones are those not yet let through.
    scorer = FakeScorer()
    scorer.release = asyncio.Event()
    gate: FairGate[GroupResult] = FairGate(1)
    queued: set[str] = set()

    async def score_at_gate(group: GroupRequest) -> GroupResult:
        queued.add(group.group_id)

        async def at_the_engine() -> GroupResult:
            queued.discard(group.group_id)
            return await scorer.score_group(group)

        try:
            return (await gate.run(group.tenant, 1.0, at_the_engine, lambda result: 1.0))[0]
        finally:
            queued.discard(group.group_id)

    assembler = GroupAssembler(ScoresBy(score_at_gate), AssemblySettings(assembly_timeout_s=300.0, replica="old-owner"))
    at_engine = [asyncio.create_task(assembler.submit(member("first", index, group_size=2), "first"))
                 for index in (0, 1)]
    await settle()
    waiting = [asyncio.create_task(assembler.submit(member("second", index, group_size=2), "second"))
               for index in (0, 1)]
    await settle()
    assert assembler.scoring_groups() == 2 and queued == {"second"}

    assert assembler.hand_off(lambda key: "new-owner", queued) == 1
    for result in await asyncio.gather(*waiting):
        assert result.failure == "moved" and not result.valid
        assert "replica new-owner now collects its members (complete here, waiting for the engine)" in result.error
    await settle()
    assert not assembler.holds("second") and queued == set()
    scorer.release.set()
    assert all(result.valid for result in await asyncio.gather(*at_engine))
    # Its slot went back to the gate: the group, sent again (as its new owner gets it), is scored at once.
    again = await asyncio.gather(*(assembler.submit(member("second", index, group_size=2)) for index in (0, 1)))
    assert all(result.valid for result in again)
    assert [call.group_id for call in scorer.calls] == ["first", "second"]  # the engine saw each group once
    stats = assembler.stats()
    assert (stats["groups_scored"], stats["groups_handed_off"]) == (2, 1)


# -- one tenant's members waiting for group-mates are bounded ---------------------------------------

def tenants_member(tenant: str, group: str, index: int, group_size: int = 8) -> MemberRequest:
    return member(f"{tenant}/{group}", index, group_size, tenant=tenant)


async def test_a_tenant_whose_groups_never_complete_is_refused_at_its_limit_and_only_it():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=30.0, waiting_limit=lambda tenant: 4))
    # beta: one member of each of 10 groups of 8 (a trainer with the wrong group_size); they never complete.
    waits = [asyncio.create_task(assembler.submit(tenants_member("beta", f"b{i}", 0))) for i in range(4)]
    await settle()
    refused = await assembler.submit(tenants_member("beta", "b4", 0))
    assert refused.failure == "overloaded" and "tenant beta: 4 of its members wait" in refused.error
    assert "max_waiting_members 4" in refused.error
    # Members of beta's groups already collecting still join, up to 1.5x the limit (an honest run at its
    # limit completes what it started); then they too wait.
    joined = [asyncio.create_task(assembler.submit(tenants_member("beta", "b0", k))) for k in (1, 2)]
    await settle()
    assert assembler.stats()["members_waiting"] == 6
    assert (await assembler.submit(tenants_member("beta", "b1", 1))).failure == "overloaded"
    # Another tenant is not refused: its groups start and complete.
    alpha = await asyncio.gather(*(assembler.submit(tenants_member("alpha", "a0", k, group_size=2)) for k in (0, 1)))
    assert [answer.valid for answer in alpha] == [True, True]
    assert assembler.stats()["rejected_tenant_waiting"] == 2
    for task in [*waits, *joined]:
        task.cancel()
    await asyncio.gather(*waits, *joined, return_exceptions=True)
    # Cancelled waiters of groups still collecting no longer count: beta may start groups again.
    started = asyncio.create_task(assembler.submit(tenants_member("beta", "b9", 0, group_size=2)))
    await settle()
    assert not started.done()  # admitted: it waits for its group-mate
    assert (await assembler.submit(tenants_member("beta", "b9", 1, group_size=2))).valid and (await started).valid


async def test_a_member_that_completes_its_group_is_never_refused():
    scorer = FakeScorer()
    assembler = GroupAssembler(scorer, AssemblySettings(assembly_timeout_s=30.0, waiting_limit=lambda tenant: 2))
    # Three members of a group of 4 (joins beyond the limit up to 1.5x = 3), then the last one completes it.
    waits = [asyncio.create_task(assembler.submit(tenants_member("run", "g", k, group_size=4))) for k in range(3)]
    await settle()
    assert (await assembler.submit(tenants_member("run", "h", 0, group_size=4))).failure == "overloaded"
    last = await assembler.submit(tenants_member("run", "g", 3, group_size=4))
    assert last.valid and all([(await task).valid for task in waits])
    # Its members no longer wait for group-mates: the tenant starts new groups again.
    assert assembler._collecting_waiters == {}  # noqa: SLF001 - the per-tenant state is freed, not left at 0


async def test_a_timed_out_group_frees_its_tenants_waiting_count():
    clock = FakeClock()
    assembler = GroupAssembler(FakeScorer(), AssemblySettings(assembly_timeout_s=5.0, waiting_limit=lambda tenant: 1),
                               clock=clock)
    waiting = asyncio.create_task(assembler.submit(tenants_member("beta", "b0", 0)))
    await settle()
    assert (await assembler.submit(tenants_member("beta", "b1", 0))).failure == "overloaded"
    clock.now += 6
    assembler.expire_overdue()
    assert (await waiting).failure == "timeout"
    second = asyncio.create_task(assembler.submit(tenants_member("beta", "b1", 0)))
    await settle()
    assert not second.done()  # admitted again
    second.cancel()
