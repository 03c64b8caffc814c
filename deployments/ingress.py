"""The HTTP API: a thin FastAPI layer over scorer replicas (OpenAPI at /docs).

Routes only: it fans a batch out into one replica call per group (so groups spread over replicas
and fail independently) and answers a member with its result. What comes before a route
(token, body size, limits) is ``deployments/http/guard.py``; the bodies are
``deployments/http/models.py``; every non-2xx answer of every route is one ``ErrorResponse``
(``deployments/http/errors.py``) whose ``code`` is a failure kind (``cluster/failures.py``) and whose
status is that kind's: 422 invalid or refused input, 413 over a limit, 401 unauthenticated, 403
forbidden, 409 conflicting member, 503 overloaded, shutting down, unavailable or moved
(Retry-After), 504 assembly timeout, 500 a bug. Bad input never yields a 500.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import ray
from fastapi import FastAPI, Path, Query, Request
from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.announced_demand import AnnouncedDemands, copy_delay_s, demand_of, seen_later
from cluster.autoscaling import Demand
from cluster.failures import kind_of
from cluster.protocol.headers import ATTEMPTS_LEFT_HEADER
from cluster.protocol.openrlhf import OpenRLHFRequest, OpenRLHFResponse
from cluster.protocol.calls import CallOutcome
from cluster.protocol.schema import (
    DEFAULT_TENANT,
    TENANT_PATTERN,
    DemandAccepted,
    DemandAnnouncement,
    MemberRequest,
    MemberResult,
)
from deployments.autoscaling_policy import demand_stats
from deployments.client import ScorerClient, answered
from deployments.config import AppConfig
from deployments.http.auth import caller_of, refuse_open_service, tenant_of
from deployments.http.errors import HTTPProblem, error_response, install_error_handlers, unanswered
from deployments.http.guard import RequestGuard, check_group_limits, check_text_limits, context_texts
from deployments.http.models import ErrorResponse, ScoreRequest, ScoreResponse
from deployments.http.openrlhf import openrlhf_rewards
from deployments.http.tenant_views import demand_view, tenants_view
from deployments.replica_list import replica_actor_names
from grrm_handles.availability import Availability
from grrm_handles.send import UNANSWERED_ERRORS

logger = logging.getLogger("ray.serve")
app = FastAPI(
    title="GRRM Cluster",
    version="0.1.0",
    description="Group reward scoring with GRRM (GQM prompts) for GRPO training of translation models.",
    # Every route: a bug's answer keeps the one error shape (deployments/http/errors.py).
    responses={500: {"model": ErrorResponse, "description": "`internal_error`: the service failed unexpectedly"}},
)
install_error_handlers(app)
# How long /healthz waits for the first look at the scorer deployment (Kubernetes probes time out at 2 s).
HEALTH_WAIT_S = 1.0
# How old the scorers' verdict may be when an announcement's copy is handed on (see _forward_demand).
COPY_VERDICT_MAX_AGE_S = 1.0
# How long a withdrawal to a pool that may empty waits for its copy to land before the ingress keeps it
# (see take_demand); past it the copy is dropped, the ingress's own record still counts.
WITHDRAWAL_COPY_WAIT_S = 5.0
app.add_middleware(RequestGuard)


def _http_host() -> str | None:
    """The host Serve's HTTP proxies bind (None outside Serve, or when the controller cannot be asked)."""
    if not ray.is_initialized():
        return None
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception:  # noqa: BLE001 - outside Serve (unit use) nothing is bound
        return None


def attempts_left(request: Request) -> int | None:
    """The sends the caller's attempt may take (its client's ``Grrm-Attempts-Left``; None: not said,
    the route's own policy bounds them)."""
    value = request.headers.get(ATTEMPTS_LEFT_HEADER)
    if value is None:
        return None
    try:
        return max(1, int(value))
    except ValueError:
        raise HTTPProblem("invalid_request", f"{ATTEMPTS_LEFT_HEADER}: an integer >= 1 (got {value[:20]!r})") from None


def unanswered_call(outcome: CallOutcome) -> Exception:
    """The answer to a call no replica answered: the handle's error as its problem (503), with the sends
    it took; anything else (a bug) goes to the internal-error handler as it is."""
    cause = outcome.cause
    if isinstance(cause, UNANSWERED_ERRORS):
        problem = unanswered(cause)
        problem.sends = max(1, outcome.attempts)
        return problem
    return cause if cause is not None else HTTPProblem("unavailable", f"{outcome.failure}: {outcome.error}")


@serve.deployment
@serve.ingress(app)
class GRRMIngress:
    """HTTP entry point of one reward application."""

    def __init__(self, replicas: DeploymentHandle, config: AppConfig):
        # An API open to the network is a config's explicit choice (http.allow_unauthenticated), never an accident.
        self.http_host = _http_host()
        refuse_open_service(config, self.http_host)
        self.config = config
        self.client = ScorerClient(replicas)  # ROUTE_POLICY for callers that say their budget of sends
        app.state.config = config
        # Every announcement this ingress replica took, reported to the application's autoscaling policy
        # (deployments/autoscaling_policy.py): it hears of them while no scorer replica runs.
        self.demands = AnnouncedDemands()
        self._forwards: dict[str, asyncio.Task] = {}  # tenant -> its announcement's copy on its way
        self._copies_sending: set[asyncio.Task] = set()  # copies in a call to a scorer replica now
        self._keepers: set[asyncio.Task] = set()  # withdrawals kept once their copy landed
        try:
            self.name = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Serve (unit use) there is no replica context
            self.name = "ingress"

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses={413: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
    )
    async def score(self, body: ScoreRequest, request: Request) -> ScoreResponse:
        """Score whole groups; results come back in request order."""
        check_group_limits(body.groups, self.config)
        groups = [group.model_copy(update={"tenant": tenant_of(request.state, group.tenant, self.config)})
                  for group in body.groups]
        budget = attempts_left(request)
        outcomes = await asyncio.gather(*(self.client.group_call(group, budget) for group in groups))
        for outcome in outcomes:
            if outcome.result is None:
                raise unanswered_call(outcome) from None
        results = [answered(outcome) for outcome in outcomes]
        refused = [result for result in results if result.failure == "overloaded"]
        if refused and len(refused) == len(results):
            # Nothing was scored (a tenant over its limit of groups in flight): the request's answer is a 503.
            raise HTTPProblem("overloaded", refused[0].error or "overloaded")
        if not self.config.http.include_answers:
            results = [result.model_copy(update={"answer": None}) for result in results]
        return ScoreResponse(results=results)

    @app.post(
        "/v1/score/member",
        response_model=MemberResult,
        responses={
            409: {"model": ErrorResponse, "description": "`conflict`: the member disagrees with its group"},
            413: {"model": ErrorResponse, "description": "`too_large`: over a limit"},
            422: {"model": ErrorResponse,
                  "description": "`invalid_request`: the body does not validate; `rejected`: the group's input "
                                 "is refused"},
            503: {"model": ErrorResponse,
                  "description": "retry later (Retry-After): `unavailable` (no replica can answer), `overloaded`, "
                                 "`shutting_down`; or send the member again at once: `moved` (its group moved to "
                                 "another replica)"},
            504: {"model": ErrorResponse,
                  "description": "`timeout`: the group did not complete in time (send the member again to keep "
                                 "waiting)"},
        },
    )
    async def post_member(self, member: MemberRequest, request: Request) -> MemberResult:
        """Score one member of a group; answers once the whole group has been scored.

        A 200 is the member's result (with a ``failure`` whose kind answers 200, such as
        ``parse_failed``, it has no score); any other failure is an error body whose ``code`` is the
        member's ``failure`` and whose status is its kind's (``cluster/failures.py``)."""
        member = member.model_copy(update={"tenant": tenant_of(request.state, member.tenant, self.config)})
        check_text_limits({"source": member.source, "candidate": member.candidate, **context_texts(member)},
                          self.config)
        if member.group_size > self.config.limits.max_candidates_per_group:
            raise HTTPProblem(
                "too_large",
                f"group_size: {member.group_size} exceeds limits.max_candidates_per_group "
                f"({self.config.limits.max_candidates_per_group})",
            )
        outcome = await self.client.member_call(member, attempts_left(request))
        if outcome.result is None:
            raise unanswered_call(outcome) from None
        result = answered(outcome)
        kind = kind_of(result.failure)
        if kind is not None and kind.http_status != 200:
            # One error shape for every non-2xx answer: the member's failure is the body's code.
            raise HTTPProblem(result.failure, result.error or result.failure,
                              detail={"replica": result.replica} if result.replica else None, sends=result.sends)
        return result

    @app.post(
        "/openrlhf/get_reward",
        response_model=OpenRLHFResponse,
        responses={401: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
    )
    async def openrlhf_get_reward(
        self,
        body: OpenRLHFRequest,
        request: Request,
        n: int = Query(ge=1, description="Samples per prompt (OpenRLHF's n_samples_per_prompt): the group size."),
        tenant: str = Query(DEFAULT_TENANT, pattern=TENANT_PATTERN,
                            description="Who the run is on a shared service (a token bound to a tenant decides it)."),
    ) -> OpenRLHFResponse:
        """OpenRLHF's remote reward model (``--reward.remote_url .../openrlhf/get_reward?n=8``): its
        payload unchanged, the samples of one prompt scored as one group (``deployments/http/openrlhf.py``)."""
        if n > self.config.limits.max_candidates_per_group:
            raise HTTPProblem("too_large", f"n: {n} exceeds limits.max_candidates_per_group "
                                           f"({self.config.limits.max_candidates_per_group})")
        return await openrlhf_rewards(body, n, self.client, self.config, tenant_of(request.state, tenant, self.config))

    # No 503: the ingress keeps the announcement itself; its copy to a scorer replica goes in the background.
    @app.post("/v1/demand", response_model=DemandAccepted,
              responses={401: {"model": ErrorResponse}, 403: {"model": ErrorResponse},
                         422: {"model": ErrorResponse}})
    async def announce_demand(self, announcement: DemandAnnouncement, request: Request) -> DemandAccepted:
        """Announce the groups a run is about to send (a GRPO step's generation phase), so that the
        autoscaling policy has the replicas for them when they come. Advisory: nothing waits on it."""
        announcement = announcement.model_copy(
            update={"tenant": tenant_of(request.state, announcement.tenant, self.config)})
        return await self.take_demand(announcement)

    async def take_demand(self, announcement: DemandAnnouncement) -> DemandAccepted:
        """Keep an announcement (a tenant's latest counts) for the application's autoscaling policy,
        and hand a copy to a scorer replica in the background (its engine's sleep decisions use it,
        and a pool scaled by the scorer deployment's own policy reads it there) where one runs, when
        :func:`~cluster.announced_demand.copy_delay_s` says; a withdrawal to a pool that may empty is
        handed on first (up to :data:`WITHDRAWAL_COPY_WAIT_S`), then kept. The handle transport calls
        this directly; the HTTP route after deciding the tenant."""
        arrived = time.time()  # its place among the tenant's announcements, however long the copy takes
        scaling = self.config.replicas.autoscaling
        pool_may_empty = scaling is not None and scaling.min_replicas == 0
        delay_s = copy_delay_s(announcement, pool_may_empty=pool_may_empty)
        earlier = self._forwards.pop(announcement.tenant, None)
        if earlier is not None and earlier not in self._copies_sending:
            earlier.cancel()  # the tenant's later announcement replaces it
            earlier = None
        forward = asyncio.create_task(self._forward_demand(announcement, delay_s, after=earlier))
        self._forwards[announcement.tenant] = forward
        forward.add_done_callback(functools.partial(self._forwarded, announcement.tenant))
        demand = demand_of(announcement, arrived)
        if pool_may_empty and not announcement.groups:
            # A withdrawal empties such a pool once a report of it reaches the policy: its copy lands on a
            # running replica first. Kept first, the copy could reach the pool just emptied, wait there, and
            # start a replica at once (Serve reports a call queued at zero replicas to the controller at once).
            # Kept in the background: the caller's announcement has a few seconds (the client's
            # ANNOUNCE_TIMEOUT_S), which a copy on a loaded machine can take; stamped at arrival, a later
            # announcement of the tenant still wins.
            keeper = asyncio.create_task(self._keep_once_landed(forward, demand))
            self._keepers.add(keeper)
            keeper.add_done_callback(self._keepers.discard)
        else:
            self.demands.keep(demand)
        return DemandAccepted(replica=self.name, tenant=announcement.tenant, groups=announcement.groups)

    async def _keep_once_landed(self, forward: asyncio.Task, demand: Demand) -> None:
        """Keep ``demand`` once its copy ``forward`` landed, or after :data:`WITHDRAWAL_COPY_WAIT_S` (the copy
        then dropped)."""
        done, _ = await asyncio.wait({forward}, timeout=WITHDRAWAL_COPY_WAIT_S)
        if not done:
            forward.cancel()
        self.demands.keep(demand)

    def _forwarded(self, tenant: str, task: asyncio.Task) -> None:
        if self._forwards.get(tenant) is task:
            del self._forwards[tenant]

    async def _forward_demand(self, announcement: DemandAnnouncement, delay_s: float,
                              after: asyncio.Task | None = None) -> None:
        """Hand ``announcement`` to a scorer replica in ``delay_s``, once the tenant's earlier copy
        ``after`` (already in a call, so not cancelled) has arrived: a replica keeps the last copy it
        receives, and a cancelled call may still land, after a withdrawal sent behind it."""
        taken = time.monotonic()
        try:
            await asyncio.sleep(delay_s)
            if after is not None:
                await asyncio.wait([after])
            copy = seen_later(announcement, time.monotonic() - taken)
            # Never to a pool with no replica running: the call would wait there and start one at once,
            # where the application's policy starts replicas when the announced work needs them. A verdict
            # at most a second old: read anew for each of 500 tenants' announcements, the fetches queued
            # in the ingress's threads and /v1/info waited 7 s behind them.
            verdict = await self._scorer_verdict(max_age_s=COPY_VERDICT_MAX_AGE_S)
            if copy is not None and verdict is not None and verdict.running > 0:
                sending = asyncio.current_task()
                self._copies_sending.add(sending)
                try:
                    await self.client.announce_demand(copy)
                finally:
                    self._copies_sending.discard(sending)
        except Exception as error:  # noqa: BLE001 - advisory: the ingress's own copy still counts
            logger.warning("ingress %s: handing an announcement of %s to a scorer replica failed: %r",
                           self.name, announcement.tenant, error)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """The announcements this ingress replica took, for the application's autoscaling policy
        (Serve calls this where the ingress deployment has an autoscaling config: ``deployments/app.py``)."""
        now, grace_s = time.time(), self.config.replicas.demand_grace_s()
        return demand_stats(self.demands.current(now, grace_s), now, grace_s)

    @app.get("/v1/demand", responses={401: {"model": ErrorResponse}})
    async def demand(self, request: Request) -> dict[str, Any]:
        """The announcements this ingress keeps: a tenant's token sees its own; the shared and the
        operator's token see every tenant's (the largest ``tenants.list_top``, the rest summed)."""
        return demand_view(self.demands.current(time.time(), self.config.replicas.demand_grace_s()), time.time(),
                           caller_of(request.state), self.config.tenants.list_top)

    @app.delete("/v1/demand/{tenant}", response_model=DemandAccepted,
                responses={401: {"model": ErrorResponse}, 403: {"model": ErrorResponse},
                           422: {"model": ErrorResponse}})
    async def withdraw_demand(self, request: Request,
                              tenant: str = Path(pattern=TENANT_PATTERN, max_length=64)) -> DemandAccepted:
        """Withdraw ``tenant``'s announcement: the tenant's own token, the shared token for a tenant
        without one, or the operator's for any tenant."""
        tenant = tenant_of(request.state, tenant, self.config)
        return await self.take_demand(DemandAnnouncement(tenant=tenant, groups=0, lasts_s=1.0))

    @app.get("/v1/tenants", responses={503: {"model": ErrorResponse}})
    async def tenants(self, request: Request) -> dict[str, Any]:
        """Each active tenant's work on the scorer replicas now, and its share of the tokens the
        engines served in the last ``tenants.window_s`` seconds. A tenant's token sees its own row and
        the others' totals; the shared and the operator's token see every tenant (the busiest
        ``tenants.list_top``, the rest summed under ``other``)."""
        names = replica_actor_names(serve.get_replica_context().app_name, self.config.replica_deployment_name)
        per_replica = await asyncio.gather(
            *(self.client.ask_replica("tenants", name) for name in names), return_exceptions=True)
        totals: dict[str, dict[str, float]] = {}
        for answer in per_replica:
            if isinstance(answer, BaseException):
                continue  # a replica starting or going away: it holds nothing to report
            for tenant, work in answer.items():
                into = totals.setdefault(tenant, dict.fromkeys(work, 0))
                for key, value in work.items():
                    into[key] += value
        view = tenants_view(totals, caller_of(request.state), self.config.tenants.list_top)
        return {"window_s": self.config.tenants.window_s, "replicas": len(names), **view}

    async def _scorer_verdict(self, *, max_age_s: float | None) -> Availability | None:
        """The scorers' availability (None: unknown, or the client calls no Serve deployment): at most
        ``max_age_s`` old (0: read anew), or with None the latest, waiting only for the first (a probe
        must answer while the GCS is down)."""
        availability = self.client.availability
        if availability is None:
            return None
        if max_age_s is None:
            return await availability.settled(HEALTH_WAIT_S)
        return await availability.current(max_age_s=max_age_s)

    @app.get("/healthz", responses={503: {"model": ErrorResponse}})
    async def healthz(self):
        """Whether this application can score: 200 while a scorer replica runs, else 503 and why.

        The latest verdict, never a wait for a fresh one beyond the first (a probe answers while the GCS is down)."""
        verdict = await self._scorer_verdict(max_age_s=None)
        if verdict is not None and not verdict.ready:
            return error_response("unavailable", verdict.describe(), verdict.as_dict(), self.config.http.retry_after_s)
        return {"status": "ok"}

    @app.get("/v1/info")
    async def info(self) -> dict[str, Any]:
        """Model, engine, prompt type and scorer replicas of this application (by state; with none
        running, why: ``unschedulable`` names the missing resources), its limits, and the host its HTTP
        proxies bind (where the ingress judged whether an open API may start)."""
        verdict = await self._scorer_verdict(max_age_s=0)
        return {
            "model": self.config.engine.model,
            "engine": self.config.engine.kind,
            "prompt_type": self.config.scoring.prompt_type,
            **self.config.engine.parallelism(),
            "replicas": verdict.replica_states if verdict else {},
            "replicas_running": verdict.running if verdict else None,
            "unschedulable": verdict.unschedulable if verdict else None,
            "limits": self.config.limits.model_dump(),
            "http_host": self.http_host,
        }
