"""RewardClient: retries, backoff, Retry-After, deadlines and idempotent re-sends, without a cluster.

HTTP runs against httpx's MockTransport (scripted status codes); the handle transport against a
fake handle that raises Ray Serve's own exceptions; idempotency against the real GroupAssembler
(``LocalTransport``). Sleeping is faked, so backoff delays are observed, not waited for.
"""

from __future__ import annotations

import asyncio
import json

import httpx
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from cluster.routing import RouteHint
from cluster.protocol.schema import GroupRequest, MemberRequest, MemberResult
from grrm_client import HTTPTransport, RewardClient
from grrm_handles.send import HandleSender
from grrm_client.adapters.verl.config import BridgeConfig

from .helpers import LocalTransport, quality_text

MEMBER = MemberRequest(group_id="g", group_size=2, index=0, source="s", candidate="a", src_lang="en", trg_lang="de")
GROUP = GroupRequest(group_id="g", source="s", candidates=["a [q=3]", "b [q=8]"], src_lang="en", trg_lang="de")


class FakeTime:
    """A clock that only sleeping advances."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def member_answer(index=0, score=7, **extra) -> dict:
    body = {"group_id": "g", "index": index, "score": score, "valid": True, "replica": "r1", "attempts": 1,
            "group_scores": [score, 2]}
    body.update(extra)
    return body


def error_body(code: str, error: str) -> dict:
    """The service's one error answer (deployments/http/models.py's ErrorResponse)."""
    return {"code": code, "error": error, "detail": None}


def http_client(statuses, config: BridgeConfig | None = None, seen: list | None = None):
    """A RewardClient over HTTP whose server answers with ``statuses`` in turn."""
    responses = list(statuses)

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        status, body, headers = responses.pop(0)
        if isinstance(body, Exception):
            raise body
        return httpx.Response(status, json=body, headers=headers or {})

    config = config or BridgeConfig(transport="http", http_url="http://grrm.test/app", token_env="GRRM_TEST_TOKEN")
    time = FakeTime()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return RewardClient(config, HTTPTransport(config, http=http), sleep=time.sleep, clock=time.clock), time


async def test_http_member_retries_503_honouring_retry_after(monkeypatch):
    monkeypatch.setenv("GRRM_TEST_TOKEN", "s3cret")
    seen = []
    overloaded = (503, error_body("overloaded", "overloaded: BackPressureError; retry later"), {"Retry-After": "3"})
    client, time = http_client([overloaded, overloaded, (200, member_answer(), None)], seen=seen)
    outcome = await client.score_member(MEMBER)
    assert outcome.result is not None and outcome.result.score == 7 and outcome.failure is None
    assert outcome.attempts == 3 and client.loop.retries == 2
    assert time.sleeps == [3.0, 3.0]  # Retry-After (3 s) beats the backoff (0.5 s, 1 s)
    assert all(r.url == "http://grrm.test/app/v1/score/member" for r in seen)
    assert all(r.headers["authorization"] == "Bearer s3cret" for r in seen)
    assert json.loads(seen[0].content) == json.loads(seen[2].content) == MEMBER.model_dump()


async def test_http_504_incomplete_group_is_rejoined_until_the_deadline_not_counted_as_an_attempt():
    timeout = (504, error_body("timeout", "assembly timed out: 1 of 2 members"), None)
    client, time = http_client([timeout, timeout, (200, member_answer(score=4), None)])
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 4 and outcome.failure is None
    assert (outcome.attempts, outcome.rejoins, client.loop.retries, client.loop.rejoins) == (1, 2, 0, 2)
    assert time.sleeps == [0.5, 0.5]  # a short pause, no backoff: the group may complete any moment

    # A group that never completes (a member that will never come): re-joined until deadline_s, then flagged.
    config = BridgeConfig(transport="http", http_url="http://grrm.test/app", deadline_s=3.0, max_attempts=2)
    client, time = http_client([timeout] * 20, config)
    outcome = await client.score_member(MEMBER)
    assert outcome.rejoins == 6 and outcome.attempts == 0 and time.now == 3.0
    assert outcome.failure == "deadline" and outcome.result.failure == "timeout"


async def test_http_refusals_are_not_retried_whatever_their_wording():
    # The failure kind decides (cluster/failures.py), never the message: "retry later" in a
    # conflict's text changes nothing.
    conflict = error_body("conflict", "index 0 differs; retry later")
    client, time = http_client([(409, conflict, None)])
    outcome = await client.score_member(MEMBER)
    assert outcome.attempts == 1 and outcome.result.failure == "conflict" and time.sleeps == []
    assert (outcome.result.group_id, outcome.result.index, outcome.result.valid) == ("g", 0, False)
    assert "index 0 differs" in outcome.result.error

    invalid = {"code": "invalid_request", "error": "src_lang: unknown language code"}
    client, _ = http_client([(422, invalid, None)])
    outcome = await client.score_member(MEMBER)
    assert outcome.result is None and outcome.failure == "invalid_request" and "src_lang" in outcome.error

    client, _ = http_client([(401, {"code": "unauthorized", "error": "authorization: missing or wrong bearer token"}, None)])
    assert (await client.score_group(GROUP)).failure == "unauthorized"
    # An answer without our code (something in between, e.g. a proxy) is read by its status.
    client, _ = http_client([(413, {"error": "too big"}, None)])
    assert (await client.score_group(GROUP)).failure == "too_large"


async def test_http_member_answers_are_read_by_status_and_code_never_by_their_keys():
    # A moved group is re-joined at once, like a timeout: not an attempt.
    client, _ = http_client([(503, error_body("moved", "another replica collects it"), {"Retry-After": "1"}),
                             (200, member_answer(score=6), None)])
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 6 and (outcome.attempts, outcome.rejoins) == (1, 1)
    # A 200 is the member's result, even a flagged one (no score, no retry).
    flagged = member_answer(score=None, valid=False, failure="parse_failed", error="no verdict", group_scores=None)
    client, time = http_client([(200, flagged, None)])
    outcome = await client.score_member(MEMBER)
    assert outcome.result.failure == "parse_failed" and outcome.failure is None and time.sleeps == []
    # A non-2xx body shaped like a result but with no code of ours is not taken for one: its status decides.
    lookalike = member_answer(score=None, valid=False, failure="conflict", error="?", group_scores=None)
    client, _ = http_client([(409, lookalike, None)])
    outcome = await client.score_member(MEMBER)
    assert outcome.result is None and outcome.failure == "http_409"


async def test_http_transient_refusals_and_connection_errors_are_retried():
    shutting_down = error_body("shutting_down", "the replica is stopping")
    overloaded = error_body("overloaded", "too many groups")
    client, _ = http_client([
        (503, shutting_down, None),
        (503, overloaded, None),
        (0, httpx.ConnectError("connection refused"), None),
        (502, {"error": "bad gateway"}, None),
        (503, {"code": "overloaded", "error": "queue full"}, None),
        (200, member_answer(score=9), None),
    ], BridgeConfig(transport="http", http_url="http://grrm.test/app", max_attempts=6))
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 9 and outcome.attempts == 6


async def test_http_gives_up_after_max_attempts_with_the_reason():
    config = BridgeConfig(transport="http", http_url="http://grrm.test", max_attempts=2)
    client, time = http_client([(503, {"error": "overloaded"}, None)] * 2, config=config)
    outcome = await client.score_group(GROUP)
    assert outcome.result is None and outcome.failure == "unavailable" and "503" in outcome.error
    assert outcome.attempts == 2 and time.sleeps == [0.5]


async def test_http_whole_group():
    result = {"group_id": "g", "scores": [3, 8], "valid": True, "attempts": 1, "replica": "r"}
    seen = []
    client, _ = http_client([(200, {"results": [result]}, None)], seen=seen)
    outcome = await client.score_group(GROUP)
    assert outcome.result.scores == [3, 8]
    assert seen[0].url.path == "/app/v1/score" and json.loads(seen[0].content) == {"groups": [GROUP.model_dump()]}


async def test_deadline_stops_retrying():
    config = BridgeConfig(transport="http", http_url="http://grrm.test", deadline_s=5, max_attempts=10)
    client, time = http_client([(503, {"error": "overloaded"}, {"Retry-After": "2"})] * 10, config=config)
    outcome = await client.score_member(MEMBER)
    assert outcome.failure == "deadline" and outcome.result is None
    assert sum(time.sleeps) < 5 and outcome.attempts == 3


async def test_deadline_cuts_a_hanging_request():
    cut = []

    async def hang(request, timeout_s, attempt=0, attempts_left=1):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cut.append(request)  # cut at the deadline, not waited out
            raise

    class Hanging:
        member = group = staticmethod(hang)

        async def aclose(self):
            return None

    client = RewardClient(BridgeConfig(deadline_s=0.2), Hanging())
    outcome = await client.score_member(MEMBER)
    assert outcome.failure == "deadline" and outcome.attempts == 1 and cut == [MEMBER]


class FakeHandle:
    """A handle whose ``add_member`` answers from a script; ``options(session_id=...)`` is a view
    sending under that routing hint, as Serve's handle is (``grrm_handles.send.routed``)."""

    def __init__(self, answers, attempt=0, attempts_seen=None):
        self.answers = answers
        self.attempt = attempt
        self.attempts_seen = [] if attempts_seen is None else attempts_seen
        self.add_member = self

    def options(self, session_id=""):
        return FakeHandle(self.answers, RouteHint.decode(session_id).attempt, self.attempts_seen)

    def remote(self, request):
        self.attempts_seen.append(self.attempt)
        answer = self.answers.pop(0)

        async def respond():
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return respond()


async def test_handle_transport_retries_back_pressure():
    answer = MemberResult(group_id="g", index=0, score=5, valid=True, replica="r", attempts=1)
    handle = FakeHandle([BackPressureError(num_queued_requests=3, max_queued_requests=2), answer])
    time = FakeTime()
    config = BridgeConfig()
    client = RewardClient(config, HandleSender(handle, app=config), sleep=time.sleep, clock=time.clock)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 5 and outcome.attempts == 2 and time.sleeps == [0.5]
    assert handle.add_member.attempts_seen == [0, 0]  # overload retries keep bounded-load routing


async def test_sends_per_logical_request_are_bounded_by_max_attempts_alone():
    # One retry layer: the handle transport sends once per attempt; a dead replica is retried by
    # RewardClient, the next send routed in ring order (attempt 1, 2, ...), never re-sent below it.
    time = FakeTime()
    config = BridgeConfig(max_attempts=3)
    handle = FakeHandle([RayActorError()] * 10)
    client = RewardClient(config, HandleSender(handle, app=config), sleep=time.sleep, clock=time.clock)
    outcome = await client.score_member(MEMBER)
    assert outcome.result is None and outcome.failure == "unavailable" and outcome.attempts == 3
    assert handle.add_member.attempts_seen == [0, 1, 2] and time.sleeps == [0.5, 1.0]
    answer = MemberResult(group_id="g", index=0, score=4, valid=True, replica="r", attempts=1)
    handle = FakeHandle([RayActorError(), BackPressureError(num_queued_requests=3, max_queued_requests=2), answer])
    client = RewardClient(config, HandleSender(handle, app=config), sleep=time.sleep, clock=time.clock)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 4 and outcome.attempts == 3
    assert handle.add_member.attempts_seen == [0, 1, 1]  # overload does not count as a lost replica
    # The same kind as the HTTP ingress answers for Serve's back pressure (grrm_handles.send.unanswered_code):
    # waited out, spending none of max_attempts; where the config spends them, the failure after them.
    pressure = [BackPressureError(num_queued_requests=3, max_queued_requests=2)] * 3
    handle = FakeHandle([*pressure, answer])
    client = RewardClient(config, HandleSender(handle, app=config), sleep=time.sleep, clock=time.clock)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 4 and (outcome.attempts, outcome.overloaded) == (4, 3)
    spends = BridgeConfig(max_attempts=3, retry_overloaded_until_deadline=False)
    client = RewardClient(spends, HandleSender(FakeHandle(list(pressure)), app=spends), sleep=time.sleep,
                          clock=time.clock)
    assert (await client.score_member(MEMBER)).failure == "overloaded"


async def test_unexpected_errors_become_a_flagged_failure():
    handle = FakeHandle([ZeroDivisionError("boom")])
    config = BridgeConfig()
    outcome = await RewardClient(config, HandleSender(handle, app=config)).score_member(MEMBER)
    assert outcome.result is None and outcome.failure == "transport_error" and "boom" in outcome.error


async def test_a_retried_member_is_not_counted_twice():
    """The answer to a member is lost after the replica took it; the retry reaches the same
    assembler, which recognises the member (same index, same text): the group is scored once."""
    transport = LocalTransport(drop_first_answers=1)
    time = FakeTime()
    client = RewardClient(BridgeConfig(), transport, sleep=time.sleep, clock=time.clock)
    members = [
        MemberRequest(group_id="g7", group_size=3, index=i, source="s", candidate=quality_text(7, i, q), src_lang="en", trg_lang="de")
        for i, q in enumerate([2, 9, 5])
    ]
    outcomes = await asyncio.gather(*(client.score_member(m) for m in members))
    assert [o.result.score for o in outcomes] == [2, 9, 5]
    assert sorted(o.attempts for o in outcomes) == [1, 1, 2]
    stats = transport.assembler.stats()
    assert stats["groups_scored"] == 1 and stats["members_received"] == 4
    assert stats["duplicates"] + stats["cached_answers"] == 1
    # A late retry of an already-scored member reads the cached verdict: still one scoring.
    again = await client.score_member(members[1])
    assert again.result.score == 9 and transport.assembler.stats()["groups_scored"] == 1


async def test_the_ingress_sends_count_as_attempts_and_each_attempt_says_how_many_it_may_take():
    # One retry layer over HTTP: the ingress re-routes a call whose replica died within the sends the
    # attempt may take (Grrm-Attempts-Left), and its answer says how many it took (Grrm-Sends, `sends`).
    seen = []
    lost = (503, error_body("unavailable", "unavailable: the scorer replicas went away"), {"Grrm-Sends": "2"})
    config = BridgeConfig(transport="http", http_url="http://grrm.test/app", max_attempts=4)
    client, _ = http_client([lost, (200, member_answer(sends=2), None)], config, seen=seen)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 7 and outcome.attempts == 4  # 2 sends, then 2 more: max_attempts, all layers
    assert [request.headers["grrm-attempts-left"] for request in seen] == ["4", "2"]
    client, _ = http_client([lost, lost, lost], config)
    outcome = await client.score_member(MEMBER)
    assert outcome.result is None and outcome.failure == "unavailable" and outcome.attempts == 4


async def test_the_serve_side_policy_re_routes_lost_replicas_only_and_leaves_re_joins_to_its_caller():
    from cluster.protocol.retry import RetryPolicy

    time = FakeTime()
    config = BridgeConfig(max_attempts=3)
    routes = RetryPolicy(max_attempts=3, retry_transient=False, max_rejoins=0)
    timeout = MemberResult(group_id="g", index=0, failure="timeout", error="assembly timed out")
    handle = FakeHandle([RayActorError(), timeout])
    client = RewardClient(config, HandleSender(handle, app=config), sleep=time.sleep, clock=time.clock,
                          policy=routes)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.failure == "timeout" and (outcome.attempts, outcome.rejoins) == (2, 0)
    assert handle.add_member.attempts_seen == [0, 1]  # the lost replica re-routed, in ring order
    overloaded = BackPressureError(num_queued_requests=3, max_queued_requests=2)
    handle = FakeHandle([overloaded, MEMBER])
    client = RewardClient(config, HandleSender(handle, app=config), sleep=time.sleep, clock=time.clock,
                          policy=routes)
    outcome = await client.score_member(MEMBER)
    assert outcome.failure == "overloaded" and outcome.attempts == 1 and outcome.cause is overloaded
    assert len(handle.add_member.attempts_seen) == 1  # the caller retries overload, not this layer
