"""Back pressure is waited out, real failures spend attempts: the retry policy (``cluster/protocol/retry.py``) decides
by the failure's kind (``FailureKind.back_pressure``), and RewardClient retries an ``overloaded`` answer with
capped exponential backoff until its deadline without spending ``max_attempts``. Without a cluster: a
scripted transport, httpx's MockTransport for the ingress's sends, a clock that only sleeping advances."""

from __future__ import annotations

import httpx
import pytest

from cluster.failures import KINDS
from cluster.protocol.retry import TRANSPORT_ERROR, RetryPolicy
from cluster.protocol.schema import MemberRequest, MemberResult
from deployments.client import ROUTE_POLICY, SERVICE_POLICY
from grrm_client import ClientConfig, HTTPTransport, RewardClient
from cluster.protocol.calls import RetryableError

from .test_bridge_client import FakeTime as Clock

MEMBER = MemberRequest(group_id="g", group_size=2, index=0, source="s", candidate="a", src_lang="en", trg_lang="de")
SCORED = MemberResult(group_id="g", index=0, score=6, valid=True, replica="r", attempts=1)


def refused(why: str = "tenant default: 9 of its members wait for group-mates") -> MemberResult:
    """A replica's answer to a member it does not admit now (its tenant's bound, its assembling limit)."""
    return MemberResult(group_id="g", index=0, valid=False, failure="overloaded", error=why, replica="r")


class Scripted:
    """A transport answering each send from a script: an answer, or an exception to raise."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.attempts_left: list[int] = []

    async def member(self, member, timeout_s, attempt=0, attempts_left=1):
        self.attempts_left.append(attempts_left)
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]  # the last one repeats
        if isinstance(step, BaseException):
            raise step
        return step

    group = member

    async def aclose(self) -> None:
        return None


def client_for(script: list, **config) -> tuple[RewardClient, Scripted, Clock]:
    transport, clock = Scripted(script), Clock()
    return RewardClient(ClientConfig(**config), transport, sleep=clock.sleep, clock=clock.clock), transport, clock


def test_only_overloaded_is_back_pressure_and_only_a_retrying_policy_waits_it_out():
    assert {code for code, kind in KINDS.items() if kind.back_pressure} == {"overloaded"}
    assert all(KINDS[code].retryable for code in KINDS if KINDS[code].back_pressure)
    policy = RetryPolicy()
    assert policy.waits_out("overloaded")
    for code in ("unavailable", "shutting_down", "timeout", "moved", "conflict", TRANSPORT_ERROR, None, "a_new_code"):
        assert not policy.waits_out(code), code
    assert not RetryPolicy(back_pressure_until_deadline=False).waits_out("overloaded")
    # The ingress's routes retry no transient failure: their caller waits out back pressure, not they.
    assert not ROUTE_POLICY.waits_out("overloaded") and not SERVICE_POLICY.waits_out("overloaded")
    assert ClientConfig().retry_policy.waits_out("overloaded")
    assert not ClientConfig(retry_overloaded_until_deadline=False).retry_policy.waits_out("overloaded")


async def test_an_overloaded_member_is_retried_with_capped_backoff_without_spending_attempts():
    client, transport, clock = client_for([refused()] * 9 + [SCORED], max_attempts=1)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 6 and outcome.failure is None
    assert (outcome.attempts, outcome.overloaded, client.loop.overloaded, client.loop.retries) == (10, 9, 9, 9)
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0]  # doubling, capped at max_backoff_s
    assert set(transport.attempts_left) == {1}  # the single attempt was never spent by a refusal


async def test_the_handle_transports_back_pressure_is_waited_out_alike():
    back_pressure = RetryableError("overloaded", "BackPressureError: queue full")  # what HandleSender raises
    client, _, clock = client_for([back_pressure] * 3 + [SCORED], max_attempts=1)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 6 and (outcome.attempts, outcome.overloaded) == (4, 3)
    assert clock.sleeps == [0.5, 1.0, 2.0]


async def test_back_pressure_that_never_ends_ends_at_the_deadline_not_after():
    client, _, clock = client_for([refused()], deadline_s=60.0, max_attempts=1)
    outcome = await client.score_member(MEMBER)
    assert outcome.failure == "deadline" and "tenant default" in outcome.error
    assert outcome.result is not None and outcome.result.failure == "overloaded"  # the last answer, flagged
    assert clock.now < 60.0 and outcome.overloaded == outcome.attempts == len(clock.sleeps) + 1
    assert clock.sleeps[-1] == 8.0


async def test_real_failures_still_spend_max_attempts_between_refusals():
    unavailable = RetryableError("unavailable", "no replica")
    client, transport, clock = client_for([unavailable, refused(), refused(), unavailable, SCORED], max_attempts=2)
    outcome = await client.score_member(MEMBER)
    assert outcome.failure == "unavailable" and (outcome.result is None or not outcome.result.valid)
    assert (outcome.attempts, outcome.overloaded) == (4, 2)
    assert transport.attempts_left == [2, 1, 1, 1]
    # Each kind backs off on its own count: 1st failure, 1st and 2nd refusal.
    assert clock.sleeps == [0.5, 0.5, 1.0]


async def test_the_old_treatment_spends_attempts_on_refusals():
    client, _, _ = client_for([refused()] * 3 + [SCORED], max_attempts=3, retry_overloaded_until_deadline=False)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.failure == "overloaded" and outcome.failure == "overloaded"
    assert outcome.attempts == outcome.overloaded == 3  # refusals still, each spending an attempt


async def test_a_retry_after_longer_than_the_backoff_wins():
    back_pressure = RetryableError("overloaded", "503", retry_after=3.0)
    client, _, clock = client_for([back_pressure, back_pressure, SCORED], max_attempts=1)
    assert (await client.score_member(MEMBER)).result.score == 6
    assert clock.sleeps == [3.0, 3.0]


async def test_over_http_only_the_ingress_re_routes_before_a_refusal_spend_attempts(monkeypatch):
    # The ingress re-routed once after a replica died (2 sends), then the new replica refused the member:
    # one of the 3 attempts is spent, and the next request says the caller may take 2 more sends.
    seen: list[httpx.Request] = []
    answers = [
        httpx.Response(503, json={"code": "overloaded", "error": "too many groups assembling", "detail": None},
                       headers={"Grrm-Sends": "2", "Retry-After": "0"}),
        httpx.Response(200, json=SCORED.model_dump()),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    config = ClientConfig(transport="http", http_url="http://grrm.test", token_env=None, max_attempts=3)
    clock = Clock()
    transport = HTTPTransport(config, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    client = RewardClient(config, transport, sleep=clock.sleep, clock=clock.clock)
    outcome = await client.score_member(MEMBER)
    assert outcome.result.score == 6 and (outcome.attempts, outcome.overloaded) == (3, 1)
    assert [request.headers["grrm-attempts-left"] for request in seen] == ["3", "2"]


@pytest.mark.parametrize("retry_transient", [True, False])
def test_retry_decisions_stay_with_the_kind_whatever_the_policy(retry_transient):
    policy = RetryPolicy(retry_transient=retry_transient)
    assert policy.retries("overloaded", replica_lost=False) == retry_transient
    assert policy.retries("overloaded", replica_lost=True)
    assert policy.waits_out("overloaded") == retry_transient
