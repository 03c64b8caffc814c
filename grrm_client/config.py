"""How a client reaches a GRRM reward service, and its retry policy: typed, validated once.

The trainer bridge's :class:`~grrm_client.adapters.verl.config.BridgeConfig` extends this with how a rollout
is read and rewarded; ``grrm score`` builds one from its command line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.planning.recorder import DEFAULT_MAX_STEPS, MIN_PHASE_GAP_S
from cluster.protocol.retry import RetryPolicy
from cluster.protocol.schema import DEFAULT_TENANT, DEFAULT_TOKEN_ENV, TENANT_PATTERN

Transport = Literal["handle", "http"]

# The retry policy's own defaults (cluster/retry.py declares them): ClientConfig takes each from here.
_RETRY = RetryPolicy()


class ClientConfig(BaseModel):
    """Transport and retries of one client."""

    model_config = ConfigDict(extra="forbid")

    transport: Transport = Field(
        "handle", description="`handle`: a Ray Serve handle on the same Ray cluster (no HTTP hop); `http`: the "
                              "HTTP API.")
    # README: "Sharing one pool".
    tenant: str = Field(
        DEFAULT_TENANT, pattern=TENANT_PATTERN,
        description="Who this client's requests are for (a run, a job): the service scopes group ids by it, "
                    "shares its engines fairly among tenants and meters each.")
    app_name: str = Field("grrm", description="Name of the Serve application, for the handle transport.")
    replica_deployment: str = Field("GRRMReplica", description="Name of the application's scorer deployment, for "
                                                               "the handle transport.")
    ingress_deployment: str = Field("GRRMIngress", description="Name of the application's HTTP ingress deployment, "
                                                               "which keeps demand announcements, for the handle "
                                                               "transport.")
    http_url: str = Field("http://127.0.0.1:8000", description="Base URL of the application (its route prefix "
                                                               "included), for the HTTP transport.")
    token_env: str | None = Field(DEFAULT_TOKEN_ENV, description="Environment variable holding the bearer token "
                                                                "(unset or empty: no Authorization header).")
    # README: "How long a member waits".
    deadline_s: float = Field(_RETRY.deadline_s, gt=0, description="Deadline of one logical request, every attempt "
                                                                   "included, in seconds. A member waits for its "
                                                                   "whole group (until the group's last rollout "
                                                                   "finishes, across the trainer's own pauses: a "
                                                                   "training phase in colocate_async, weight syncs), "
                                                                   "so this must exceed the spread of a group's "
                                                                   "finish times. It is also how long a rollout lost "
                                                                   "before its reward (its session failed) holds the "
                                                                   "rest of its group.")
    # The one retry loop: over HTTP the ingress re-routes a call whose replica died within the sends this
    # attempt may take, and says how many it took; they count here.
    max_attempts: int = Field(_RETRY.max_attempts, ge=1, description="Sends per logical request that failed, all "
                                                                     "layers together: a replica lost, no replica to "
                                                                     "answer (`unavailable`), a replica shutting "
                                                                     "down, connection errors are retried, and the "
                                                                     "HTTP ingress's re-routes after a replica died "
                                                                     "count too. Back pressure (`overloaded`) is not "
                                                                     "a failed attempt "
                                                                     "(retry_overloaded_until_deadline), nor is an "
                                                                     "assembly timeout: the member re-joins its group "
                                                                     "until deadline_s.")
    retry_overloaded_until_deadline: bool = Field(
        _RETRY.back_pressure_until_deadline,
        description="Retry an `overloaded` answer (Serve's queue full, a replica with too many groups assembling, "
                    "the tenant at max_groups_in_flight or max_waiting_members: the service is full now, not "
                    "failing) with backoff until deadline_s, spending none of max_attempts. False: it spends them "
                    "like any transient failure, so a member refused for a few seconds gets a default reward and its "
                    "group-mates wait for it until deadline_s; only for a caller that would rather fail fast than "
                    "wait.")
    backoff_s: float = Field(_RETRY.backoff_s, ge=0, description="Wait before the first retry, in seconds; it doubles "
                                                                 "with each further retry up to max_backoff_s (a "
                                                                 "longer Retry-After from the service wins). Back "
                                                                 "pressure has a count of its own, so an `overloaded` "
                                                                 "member is asked again every max_backoff_s at most. "
                                                                 "Also the pause before a member re-joins its "
                                                                 "incomplete group.")
    max_backoff_s: float = Field(
        _RETRY.max_backoff_s, ge=0,
        description="Longest wait between two attempts, in seconds (at least backoff_s).")
    # One notion for the demand announcements (grrm_client/demand.py) and the recorded trace: both find a
    # trainer's steps in when its rewards are asked for.
    phase_gap_s: float = Field(10.0, ge=MIN_PHASE_GAP_S,
                               description="A pause in reward requests at least this long, in seconds, ends a "
                                           "generation phase (the next request opens one): the trainer adapters' "
                                           "demand announcements and the recorded trace (trace_path) split steps "
                                           "there.")
    trace_path: str | None = Field(
        None, description="Write this client's run trace here, for `grrm plan --trace`: JSON (the format of "
                          "cluster/planning/trace.py: per step, when each group's members were first sent, Unix "
                          "seconds, and the group's engine tokens where the answer says), rewritten as each step "
                          "ends (the next one opens, or sends pause for phase_gap_s) and when the client closes. `{pid}` in it becomes the process "
                          "id, for runs whose rewards several processes send (each records its own sends). None: "
                          "nothing is recorded.")
    trace_max_steps: int = Field(DEFAULT_MAX_STEPS, ge=1, description="Steps the trace keeps at most (later ones are "
                                                                     "not recorded): the file stays bounded, about "
                                                                     "12 KB a step of 128 groups of 8.")

    @model_validator(mode="after")
    def _valid_policy(self) -> ClientConfig:
        self.retry_policy  # noqa: B018 - RetryPolicy checks its own bounds (backoff ordered, attempts >= 1)
        return self

    @property
    def retry_policy(self) -> RetryPolicy:
        """The one retry policy of this client's calls."""
        return RetryPolicy(max_attempts=self.max_attempts, deadline_s=self.deadline_s,
                           backoff_s=self.backoff_s, max_backoff_s=self.max_backoff_s,
                           back_pressure_until_deadline=self.retry_overloaded_until_deadline)
