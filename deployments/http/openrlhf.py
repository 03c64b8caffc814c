"""``POST /openrlhf/get_reward?n=8``: OpenRLHF's remote reward model, answered by the scorer replicas.

The mapping of OpenRLHF's payload onto members and of their answers onto its response is the
protocol's (:mod:`cluster.protocol.openrlhf`). Here: each member goes to the replicas as a member
of a keyed group (``add_open_member``: on the replica that owns the key, the samples of one prompt
form groups of ``n`` in arrival order), and every sample is answered within
``openrlhf.answer_within_s`` (below OpenRLHF's 180 s, after which it would send the sample again as a
new one), with its reward or the flagged default; the reason is logged once per ingress process. A
payload it cannot read is a 422 naming the field.
"""

from __future__ import annotations

import asyncio
import logging

from cluster.protocol.members import FailureLog
from cluster.protocol.openrlhf import OpenRLHFRequest, OpenRLHFResponse, PayloadError, read_payload, rewards_response
from cluster.protocol.schema import DEFAULT_TENANT, MemberRequest, MemberResult
from deployments.client import ScorerClient
from deployments.config import AppConfig
from deployments.http.errors import HTTPProblem

__all__ = ["openrlhf_rewards"]

logger = logging.getLogger("ray.serve")

# Failure reasons this ingress process has logged (each once).
_FAILURES = FailureLog()


async def openrlhf_rewards(body: OpenRLHFRequest, n: int, client: ScorerClient, config: AppConfig,
                           tenant: str = DEFAULT_TENANT) -> OpenRLHFResponse:
    """Every sample's reward (see the module docstring)."""
    settings = config.openrlhf
    try:
        members = read_payload(body, n, settings, config.limits.max_text_chars, tenant)
    except PayloadError as problem:
        raise HTTPProblem(problem.kind, str(problem)) from None
    answers = await asyncio.gather(*(_score(member, client, settings.answer_within_s) for member, _ in members))
    # Every part of the tenant's recipe is on every sample's extra_logs (OpenRLHF batches them by key).
    response, outcomes = rewards_response([completion for _, completion in members], answers, settings,
                                          parts=list(config.tenant(tenant).recipe.parts))
    for outcome in outcomes:
        if _FAILURES.first(outcome):  # OpenRLHF's per-sample logs take numbers only: counted in grrm_failed
            logger.warning("openrlhf: default reward %s for %s (logged once; counted in grrm_failed)",
                           settings.default_reward, outcome.failure)
    return response


async def _score(member: MemberRequest, client: ScorerClient, within_s: float) -> tuple[MemberResult | None, str | None]:
    """(the member's result, or None and why not): the client's loop within ``within_s``; never raises."""
    outcome = await client.open_member_call(member, within_s)
    return outcome.result, outcome.failure
