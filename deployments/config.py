"""The typed configuration of one reward application (what ``serve run`` ``args:`` hold).

Validated once when the application is built: a wrong key or value is a clear error at
start, not a crash later. Everything below this layer receives these objects, not dicts.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cluster.admission import waiting_members_bound
from cluster.autoscaling import ScalingSettings
from cluster.config import ScoringConfig
from cluster.fair_share import DEFAULT_POLICY, TenantPolicy
from cluster.recipe import RecipeSettings
from cluster.protocol.openrlhf import OpenRLHFSettings
from cluster.protocol.schema import DEFAULT_MAX_TEXT_CHARS, DEFAULT_TOKEN_ENV, TENANT_PATTERN
from cluster.engines.config import SLEEP_ENGINES, EngineConfig
from deployments.autoscaling_policy import POLICY_PATH
from deployments.placement import ReplicaPlacement, plan_placement


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


# The policy's own defaults (cluster/autoscaling.py declares them): AutoscalingSettings takes each from here.
_SCALING = ScalingSettings()


class AutoscalingSettings(_Strict):
    """Replica autoscaling: on engine work and announced demand (the project's policy), or on ongoing
    requests (Serve's own, for comparison)."""

    policy: Literal["engine_work", "serve_default"] = Field(
        "engine_work", description="`engine_work`: scale on the engines' queued work and the demand trainers announce "
                                   "(cluster/autoscaling.py); members waiting for group-mates never count. "
                                   "`serve_default`: Serve's policy on ongoing requests (target_ongoing_requests), "
                                   "which counts waiting members as load.")
    min_replicas: int = Field(_SCALING.min_replicas, ge=0, description="Fewest scorer replicas autoscaling keeps.")
    max_replicas: int = Field(
        _SCALING.max_replicas, ge=1,
        description="Most scorer replicas autoscaling starts (at least min_replicas).")
    initial_replicas: int | None = Field(None, ge=0, description="Replicas started when the application is deployed "
                                                                 "(None: min_replicas).")
    target_backlog_s: float = Field(
        _SCALING.target_backlog_s, gt=0,
        description="engine_work: seconds of queued engine work one replica may hold before another is started; an "
                    "announced phase starts replicas ahead only from when its expected work reaches this.")
    cold_start_s: float = Field(
        _SCALING.cold_start_s, ge=0,
        description="engine_work: how long a new replica takes to serve (node, scheduling and engine load "
                    "included); announced work starting within this gets its replicas now. Once the policy has "
                    "timed its own (asking for replicas to all serving; the longest of the last three), that counts "
                    "instead; the replicas' measured construction, where longer, raises either.")
    default_seconds_per_group: float = Field(
        _SCALING.default_seconds_per_group, gt=0,
        description="engine_work: engine seconds per group assumed until the replicas have measured theirs.")
    demand_headroom: float = Field(
        _SCALING.demand_headroom, ge=1,
        description="engine_work: capacity over the announced rate of a phase's busiest slice (groups do not arrive "
                    "evenly within it).")
    demand_grace_s: float = Field(
        _SCALING.demand_grace_s, ge=0,
        description="engine_work: how long an announced phase keeps its replicas after its announced end; an "
                    "announcement then expires.")
    idle: Literal["stop", "sleep"] = Field(
        _SCALING.idle,
        description="What becomes of a replica the pool no longer needs. `stop`: it is removed and its GPU freed; "
                    "one started later costs cold_start_s. `sleep` (engines vllm and scripted): its engine sleeps "
                    "once idle for sleep_after_s (vLLM sleep mode level 1: weights offloaded to CPU memory, KV "
                    "cache freed) and serves again after wake_s; engine_work keeps it while an announced need comes "
                    "within (cold_start_s - wake_s) / sleeping_cost seconds, and removes it otherwise. vLLM's sleep "
                    "mode needs CUDA.")
    wake_s: float = Field(_SCALING.wake_s, ge=0, description="idle sleep: how long, in seconds, a sleeping engine "
                                                             "takes to serve again; the replica wakes this long "
                                                             "before announced work.")
    sleeping_cost: float = Field(
        _SCALING.sleeping_cost, gt=0, le=1,
        description="idle sleep: what a sleeping replica costs relative to an awake one (its GPU is held, its "
                    "memory free for other work); sets the break-even horizon.")
    sleep_after_s: float = Field(
        _SCALING.sleep_after_s, ge=0,
        description="idle sleep: seconds an engine has had no group queued or running before it sleeps (members "
                    "waiting for group-mates do not count).")
    target_ongoing_requests: float = Field(16.0, gt=0, description="serve_default: ongoing requests per replica that "
                                                                   "Serve's policy aims for.")
    upscale_delay_s: float = Field(
        _SCALING.upscale_delay_s, ge=0,
        description="How long, in seconds, more replicas must be wanted before they are started.")
    downscale_delay_s: float = Field(
        _SCALING.downscale_delay_s, ge=0,
        description="How long, in seconds, fewer replicas must do before replicas are stopped.")
    idle_downscale_delay_s: float = Field(
        _SCALING.idle_downscale_delay_s, ge=0,
        description="engine_work: while an announced phase is on (its quiet start, a lull), how long the pool must "
                    "be idle (no group queued or running, no member waiting for group-mates) before it drops the "
                    "replicas the announced demand does not need, instead of downscale_delay_s; idle while every "
                    "announced phase is ahead, it drops them at once. Either way it keeps what announced work needs "
                    "within two cold starts. A pool nobody announces to keeps downscale_delay_s.")
    metrics_interval_s: float = Field(2.0, gt=0, description="How often, in seconds, replicas report the load "
                                                             "autoscaling decides on.")
    look_back_period_s: float = Field(10.0, gt=0, description="Time window, in seconds, Serve keeps the load "
                                                              "reports of (serve_default averages over it).")

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self

    def announced_replicas(self, tenant: TenantDefaults) -> int:
        """The most replicas ``tenant``'s announced demand may claim: its ``max_announced_replicas``, else half
        of ``max_replicas`` (at least 1)."""
        return tenant.max_announced_replicas or max(1, self.max_replicas // 2)

    def scaling_settings(self, default_tenant: TenantDefaults | None = None,
                         named_tenants: Sequence[TenantSettings] = ()) -> ScalingSettings:
        """The engine_work policy's settings, with the caps on what each tenant's announced demand may claim:
        ``default_tenant``'s (``tenants.default``; None: the defaults') for every tenant but ``named_tenants``
        (``http.tenants``), which have their own."""
        return ScalingSettings(
            min_replicas=self.min_replicas, max_replicas=self.max_replicas, target_backlog_s=self.target_backlog_s,
            upscale_delay_s=self.upscale_delay_s, downscale_delay_s=self.downscale_delay_s,
            idle_downscale_delay_s=self.idle_downscale_delay_s, cold_start_s=self.cold_start_s,
            default_seconds_per_group=self.default_seconds_per_group, demand_headroom=self.demand_headroom,
            demand_grace_s=self.demand_grace_s, idle=self.idle, wake_s=self.wake_s, sleeping_cost=self.sleeping_cost,
            sleep_after_s=self.sleep_after_s,
            max_announced_replicas=self.announced_replicas(default_tenant or TenantDefaults()),
            tenant_max_announced_replicas=tuple((tenant.name, self.announced_replicas(tenant))
                                                for tenant in named_tenants))

    def serve_config(self, default_tenant: TenantDefaults | None = None,
                     named_tenants: Sequence[TenantSettings] = ()) -> dict[str, Any]:
        """Serve's ``autoscaling_config`` for this setting (the tenants: see :meth:`scaling_settings`)."""
        common = self.model_dump(include={"min_replicas", "max_replicas", "initial_replicas", "upscale_delay_s",
                                          "downscale_delay_s", "metrics_interval_s", "look_back_period_s"},
                                 exclude_none=True)
        if self.policy == "serve_default":
            return {**common, "target_ongoing_requests": self.target_ongoing_requests}
        # The project's policy applies the delays itself (cluster/autoscaling.py, the simulator's too):
        # Serve, which wraps a custom policy in its own delay logic, gets none, else the two would
        # restart each other's timers. Serve's bounds still hold.
        return {**common, "upscale_delay_s": 0.0, "downscale_delay_s": 0.0,
                "policy": {"policy_function": POLICY_PATH,
                           "policy_kwargs": dataclasses.asdict(self.scaling_settings(default_tenant, named_tenants))}}


class ReplicaSettings(_Strict):
    """How many scorer replicas run, what each one holds, and how much each accepts."""

    num_replicas: int | None = Field(None, ge=1, description="Fixed replica count; leave None and set "
                                                             "`autoscaling` to scale on load (neither: one replica).")
    autoscaling: AutoscalingSettings | None = Field(
        None,
        description="Scale the replica count on load (instead of num_replicas).")
    # Serve's default of 5 starves a batching engine, and members waiting for their group hold a
    # slot each: a low limit fills up with incomplete groups whose other members queue behind them
    # until the assembly timeout.
    max_ongoing_requests: int = Field(
        2048, ge=1, description="Concurrent requests one replica takes. Each member waiting for group-mates holds "
                                "one (an asyncio future: cheap), and so does each member of a complete group until "
                                "it is scored. A tenant's waiting members may hold three quarters of them "
                                "(tenants.*.max_waiting_members): for one run's step of B prompts x n rollouts on "
                                "R replicas without a refusal, about 2 x B x (n - 1) / R (8192 for 512 x 8 on one).")
    max_queued_requests: int = Field(1024, ge=-1, description="Requests a caller may queue beyond "
                                                              "max_ongoing_requests before it gets a 503 / "
                                                              "BackPressureError (-1: no limit); the clients "
                                                              "retry it (`overloaded`) until their deadline. A "
                                                              "queued member cannot complete its group until it "
                                                              "has a slot.")
    max_assembling_groups: int = Field(
        100_000, ge=1, description="Groups one replica collects members for at once; a member of one more group is "
                                   "answered `overloaded` (HTTP 503, Retry-After) and retried by the clients.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs each replica's actor asks Ray for.")
    # Without a resource of its own a replica fits any node with a free GPU, a trainer's included, where it
    # keeps verl's 8-GPU placement group from forming. The Kubernetes render asks for `grrm_worker`, which
    # only the reward worker pods offer.
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each replica asks for (with the Ray executor, in "
                                          "its placement group's first bundle): a replica then runs only on nodes "
                                          "that offer them (`ray start --resources`).")
    gpus_per_rank: float = Field(
        1.0, ge=0, description="GPUs per tensor/pipeline-parallel rank (a whole one when there are several ranks); "
                               "0 on a CPU machine. A replica takes this times engine.tensor_parallel_size x "
                               "pipeline_parallel_size.")
    # A hang is found within about health_check_period_s + hang_probes x hang_timeout_s: each missed check waits
    # hang_timeout_s for the one probe that is out.
    health_check_period_s: float = Field(5.0, gt=0, description="How often, in seconds, Serve checks each replica; "
                                                                "the check probes the engine.")
    hang_timeout_s: float = Field(
        8.0, gt=0, description="How long, in seconds, one health check waits for the engine's answer to its probe; "
                               "replicas.hang_probes checks in a row without an answer mean a hung engine: the replica "
                               "ends and is replaced. A probe is answered between two engine steps, so a long "
                               "generation is not a hang.")
    hang_probes: int = Field(
        3, ge=1, description="Consecutive health probes an engine must miss (each unanswered within hang_timeout_s) "
                             "before it counts as hung; an answered probe starts the count again. One late probe "
                             "(a burst of tokenizing under a pod's CPU limit) does not cost a cold start.")
    health_check_timeout_s: float = Field(30.0, gt=0, description="How long, in seconds, Serve waits for a health "
                                                                  "check to answer (above hang_timeout_s).")
    graceful_shutdown_timeout_s: float = Field(
        20.0, ge=0,
        description="How long, in seconds, Serve lets a stopping replica shut down gracefully before it is killed.")
    # Serve's default (2 s) is slept before the first look: every scale-down, redeploy and delete waited it.
    graceful_shutdown_wait_loop_s: float = Field(
        0.5, gt=0, description="How often, in seconds, a stopping replica (scorer, ingress or ledger) looks whether "
                               "its ongoing requests are done.")
    # The access log lines cost CPU on every call.
    access_log: bool = Field(False, description="Write Serve's per-request access log lines (errors are logged "
                                                "regardless).")
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="Environment for the replica processes (e.g. VLLM_* switches).")

    def demand_grace_s(self) -> float:
        """How long a replica keeps an announced demand past its end (see AutoscalingSettings)."""
        return (self.autoscaling or AutoscalingSettings()).demand_grace_s

    @model_validator(mode="after")
    def _one_sizing(self) -> ReplicaSettings:
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ValueError("replicas: set either num_replicas or autoscaling, not both")
        if self.hang_timeout_s >= self.health_check_timeout_s:
            raise ValueError(
                f"replicas.hang_timeout_s ({self.hang_timeout_s}) must be below health_check_timeout_s "
                f"({self.health_check_timeout_s}): Serve would give up on the check before the probe does"
            )
        return self


class ServiceSettings(_Strict):
    """A small deployment callers depend on besides the scorers: the HTTP ingress or the ledger.

    Two or more replicas survive the loss of one; Serve spreads a deployment's replicas over the
    nodes that can hold them. ``num_cpus`` above 0 keeps them off a head started with
    ``num-cpus: 0`` (a 0-CPU actor may land anywhere, the head included).
    """

    num_replicas: int = Field(1, ge=1, description="Replicas of the deployment (two or more survive the loss of "
                                                   "one).")
    num_cpus: float = Field(0.0, ge=0, description="CPUs each replica's actor asks Ray for (above 0 keeps it off "
                                                   "a head started with `num-cpus: 0`).")
    # The Kubernetes render pins the replicas to a worker group of their own this way.
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each replica asks for.")
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="At most this many replicas on one node (Serve's max_replicas_per_node): 1 "
                                "guarantees distinct nodes, and leaves a replica pending where the cluster has fewer "
                                "nodes.")

    def serve_options(self, env_vars: dict[str, str] | None = None) -> dict[str, Any]:
        """The Serve deployment options these settings stand for (``env_vars``: the processes' environment)."""
        actor: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.resources:
            actor["resources"] = dict(self.resources)
        actor.update(runtime_env(env_vars or {}))
        options: dict[str, Any] = {"num_replicas": self.num_replicas, "ray_actor_options": actor}
        if self.max_replicas_per_node is not None:
            options["max_replicas_per_node"] = self.max_replicas_per_node
        return options


def runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """Ray actor options that set these environment variables in a replica's process (none: {})."""
    return {"runtime_env": {"env_vars": dict(env_vars)}} if env_vars else {}


class RoutingSettings(_Strict):
    """The group-aware router (``deployments/router.py``)."""

    # Under `serve_default` members of a group would scatter, so member requests need `group_aware`.
    router: Literal["group_aware", "serve_default"] = Field(
        "group_aware", description="The request router of the scorer replicas: `group_aware`, or `serve_default` "
                                   "(Serve's power-of-two-choices router), for comparison benchmarks only.")
    load_factor: float = Field(1.25, ge=1, description="Bounded load for whole groups: a replica whose outstanding "
                                                       "work is above load_factor x the mean plus headroom hands new "
                                                       "groups to the next replica on the ring.")
    headroom: float = Field(8.0, ge=0, description="Outstanding work, in candidates, a replica may have above "
                                                   "load_factor x the mean before it hands new groups on.")
    virtual_nodes: int = Field(100, ge=1, description="Points per replica on the consistent-hash ring that maps "
                                                      "group ids to replicas.")
    stats_period_s: float = Field(1.0, gt=0, description="How often, in seconds, replicas report their outstanding "
                                                         "work to every router.")


class LimitSettings(_Strict):
    """Request limits enforced at the HTTP boundary (413/422 name the limit)."""

    max_groups_per_request: int = Field(256, ge=1, description="Most groups in one request.")
    max_candidates_per_group: int = Field(26, ge=2, description="Most candidates in one group (also the largest "
                                                                "group_size a member or an OpenRLHF request may "
                                                                "give).")
    max_text_chars: int = Field(
        DEFAULT_MAX_TEXT_CHARS, ge=1,
        description="Most characters in one source or candidate text.")
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest request body, in bytes.")
    # Reading the body first lets clients that send everything before reading (urllib) read the answer.
    max_discard_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="A body over max_request_bytes up to this many bytes is read to its end "
                                            "and dropped before the 413; a larger one is answered at once and its "
                                            "connection closed. An unauthenticated body gets its 401 after at most "
                                            "64 KiB (anyone can send one).")


class TenantDefaults(_Strict):
    """How a tenant shares the engines and what it may hold (``tenants.default``: every tenant not named)."""

    weight: float = Field(DEFAULT_POLICY.weight, gt=0, description="Its share of an engine relative to the others of "
                                                                   "its priority class.")
    priority: int = Field(DEFAULT_POLICY.priority, description="A higher class is always served first (e.g. training "
                                                               "0, evaluation -1).")
    max_groups_in_flight: int | None = Field(
        None, ge=1, description="Groups it may have assembling, waiting or scoring on one replica; beyond: 503 "
                                "with Retry-After for this tenant only (None: no limit).")
    max_waiting_members: int | None = Field(
        None, ge=1, description="Its members one replica holds waiting for group-mates (each holds one of the "
                                "replica's max_ongoing_requests slots): at this many its new groups get 503 "
                                "`overloaded` with Retry-After, this tenant only (the clients retry it until their "
                                "deadline); members of its groups already collecting join up to 1.5 times this, "
                                "and a member that completes its group always does. None: derived "
                                "(cluster/admission.py waiting_members_bound): a tenant's waiting members may hold "
                                "three quarters of replicas.max_ongoing_requests, the rest staying for other "
                                "tenants and for the members that complete groups, so the bound is that over the "
                                "1.5 join headroom (half the slots), and never above max_groups_in_flight x "
                                "(limits.max_candidates_per_group - 1) where that is set. A step of B groups of n "
                                "waits on one replica without a refusal while this is at least B x (n - 1).")
    max_announced_replicas: int | None = Field(
        None, ge=1, description="engine_work autoscaling: the most scorer replicas its announced demand (POST "
                                "/v1/demand) may claim; the other tenants' announcements add their own, and its "
                                "queued work still counts in full. None: half of replicas.autoscaling.max_replicas "
                                "(at least 1), a share that leaves room for the others.")
    recipe: RecipeSettings = Field(
        default_factory=RecipeSettings,
        description="How its candidates' rewards are composed (docs/recipes.md): default_reward and named, weighted "
                    "parts (grrm, language, overlong, format, bleu, chrf, length_ratio, kind: model); every answer "
                    "carries the reward and each part's value (components). Default: grrm at weight 1 and scale 1, "
                    "default_reward 0 (a reward is the score). A tenant of http.tenants without one takes "
                    "tenants.default's.")


class TenantSettings(TenantDefaults):
    """One named tenant of a shared pool (``http.tenants``), optionally with its own token."""

    name: str = Field(pattern=TENANT_PATTERN, description="The tenant's name (a run, a job): what requests carry.")
    token_env: str | None = Field(
        None, description="Environment variable (in the ingress) holding this tenant's own bearer token: a request "
                          "with it is this tenant's, whatever its body says.")


class HTTPSettings(_Strict):
    """The HTTP ingress."""

    auth_token_env: str | None = Field(
        DEFAULT_TOKEN_ENV, description="Name of an environment variable holding a bearer token; when it is set and "
                                      "non-empty, every /v1 request must carry `Authorization: Bearer <token>` (or "
                                      "another configured token). The shared token acts for every tenant without "
                                      "a token of its own.")
    operator_token_env: str | None = Field(
        None, description="Name of an environment variable holding the operator's bearer token: it acts for any "
                          "tenant, sees every tenant in GET /v1/tenants and GET /v1/demand, and withdraws any "
                          "tenant's announcement (DELETE /v1/demand/{tenant}).")
    allow_unauthenticated: bool = Field(
        False, description="Serve a non-loopback http_options.host with no token set at all (every /v1 route open "
                           "to whoever reaches the port). Without it such a service refuses to start. Once any "
                           "token is set (shared, operator or a tenant's), a request needs one of them.")
    include_answers: bool = Field(False, description="Return each group's raw model answer in /v1/score results.")
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds sent with 503.")
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of the ingress process (e.g. the token variable, when not set on the node).")
    tenants: list[TenantSettings] = Field(
        default_factory=list, description="Tenants with settings of their own (weight, priority, limit, token); "
                                          "every other tenant gets `tenants.default`.")

    @model_validator(mode="after")
    def _unique_tenants(self) -> HTTPSettings:
        names = [tenant.name for tenant in self.tenants]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"http.tenants: {', '.join(duplicated)} listed more than once")
        return self


class TenantsSettings(_Strict):
    """Many runs on one pool (docs/operations/tenants.md)."""

    fair_share: bool = Field(True, description="Complete groups waiting for an engine go by virtual token counters "
                                               "(cluster/fair_share.py); false: first come, first served.")
    engine_slots: int | None = Field(
        None, ge=1, description="Groups a replica sends to its engine at once (the fair queue holds the rest); None: "
                                "what the engine runs at once (vLLM max_num_seqs, SGLang max_running_requests, the "
                                "scripted engine's max_concurrent_prompts; else 256) divided by scoring.permutations.")
    return_credit_tokens: float = Field(
        2048.0, ge=0, description="A tenant back from idle may go this many tokens (divided by its weight) ahead of "
                                  "the least-served busy tenant, so a small run's few groups are not interleaved "
                                  "with a flood's; 0: strict virtual token counters.")
    reserved_slots: int = Field(
        0, ge=0, description="Engine slots a lower priority class leaves free while a higher class has sent a group "
                             "within window_s, so that class's groups start at once instead of waiting for a lower "
                             "one's to end (at most engine_slots - 1; 0: every slot to whoever waits).")
    default: TenantDefaults = Field(default_factory=TenantDefaults,
                                    description="Settings of every tenant not listed in `http.tenants`.")
    max_metric_labels: int = Field(64, ge=1, description="Distinct tenant labels a replica's metrics carry; later "
                                                         "tenants are counted under 'other'.")
    window_s: float = Field(60.0, gt=0, description="How far back GET /v1/tenants measures each tenant's share.")
    list_top: int = Field(50, ge=1, le=10_000, description="Tenants GET /v1/tenants and GET /v1/demand name one by "
                                                           "one (the busiest); the rest are summed under 'other'.")


METRIC_MODEL_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"


class MetricModelSettings(_Strict):
    """A second model in the application, a recipe's ``{kind: model, deployment: <name>}`` part: a judge
    asked GQM's single-candidate prompt, the reference in its notes (cluster/metric_judge.py)."""

    engine: EngineConfig = Field(description="The engine each of its replicas runs, and its model.")
    scoring: ScoringConfig = Field(
        default_factory=ScoringConfig, description="Its prompt guard, token budgets, sampling, retries, verdict "
                                                   "repair (a score constrained to 0..10) and generation timeout; "
                                                   "the group settings (prompt type, splits, permutations) do not "
                                                   "apply to one candidate.")
    replicas: ReplicaSettings = Field(
        default_factory=ReplicaSettings, description="Its replicas, as the scorers': a fixed num_replicas (None: "
                                                     "1; no autoscaling), num_cpus, gpus_per_rank, resources, "
                                                     "env_vars, health checks.")


class AppConfig(_Strict):
    """One reward application: engine, scoring recipe, replicas, routing, limits."""

    engine: EngineConfig = Field(description="The engine each scorer replica runs, and its model.")
    scoring: ScoringConfig = Field(
        default_factory=ScoringConfig,
        description="How a group becomes a GQM prompt, a generation and a verdict.")
    replicas: ReplicaSettings = Field(
        default_factory=ReplicaSettings,
        description="How many scorer replicas run, what each one holds, and how much each accepts.")
    routing: RoutingSettings = Field(
        default_factory=RoutingSettings,
        description="The request router of the scorer replicas.")
    limits: LimitSettings = Field(
        default_factory=LimitSettings,
        description="Request limits enforced at the HTTP boundary.")
    http: HTTPSettings = Field(
        default_factory=HTTPSettings,
        description="The HTTP ingress: authentication, answers, Retry-After, named tenants.")
    openrlhf: OpenRLHFSettings = Field(
        default_factory=OpenRLHFSettings,
        description="The OpenRLHF remote reward route (POST /openrlhf/get_reward).")
    tenants: TenantsSettings = Field(
        default_factory=TenantsSettings,
        description="How runs share one pool of engines (fair share, engine slots, tenant defaults).")
    ingress: ServiceSettings = Field(default_factory=ServiceSettings, description="The HTTP ingress's replicas.")
    ledger: ServiceSettings = Field(
        default_factory=ServiceSettings,
        description="The ledger of scored groups: each record is kept on every ledger replica.")
    assembly_timeout_s: float = Field(120.0, gt=0, description="Members of a group that do not all arrive within "
                                                               "this many seconds get a timeout error.")
    completed_ttl_s: float = Field(900.0, gt=0, description="How long, in seconds, a scored group's answer is kept "
                                                            "for retried members (idempotency).")
    build_tiny_model_if_missing: bool = Field(False, description="Build the tiny local test model at engine.model "
                                                                 "if the directory is missing (CPU demo).")
    replica_deployment_name: str = Field("GRRMReplica", description="Name of the scorer deployment (the trainer "
                                                                    "bridge looks it up by name).")
    ingress_deployment_name: str = Field("GRRMIngress", description="Name of the HTTP ingress deployment.")
    ledger_deployment_name: str = Field("GRRMLedger", description="Name of the ledger deployment.")
    metric_models: dict[str, MetricModelSettings] = Field(
        default_factory=dict, description="Second models in the application (name -> settings), each a "
                                          "deployment `MetricModel-<name>` that a recipe part `{kind: model, "
                                          "deployment: <name>}` scores with: its value is the model's 0..10 score "
                                          "of one candidate (QE; with the row's reference, reference-based) / 10.")

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        if self.engine.kind != "scripted" and not self.engine.model:
            raise ValueError("engine.model: required for engine kind " + repr(self.engine.kind))
        if self.sleeps_when_idle and self.engine.kind not in SLEEP_ENGINES:
            raise ValueError(
                f"replicas.autoscaling.idle: 'sleep' needs an engine that can sleep ({', '.join(SLEEP_ENGINES)}); the "
                f"{self.engine.kind} engine cannot offload its weights and free its KV cache while it holds its "
                "devices, so an idle replica can only be stopped (idle: stop)")
        self.placement  # noqa: B018 - a placement that cannot run is refused here, before Serve starts
        self._token_budget_fits()
        self._engine_slots_fit()
        self._metric_models_fit()
        self._recipes_fit()
        return self

    def _metric_models_fit(self) -> None:
        # Each metric model is checked as a scorer of its own would be (its model, placement, token budget).
        for name in self.metric_models:
            if not re.fullmatch(METRIC_MODEL_NAME, name):
                raise ValueError(f"metric_models.{name}: a metric model's name is a letter, then letters, digits, "
                                 "'_' or '-' (at most 64)")
            if self.metric_models[name].replicas.autoscaling is not None:
                raise ValueError(f"metric_models.{name}.replicas.autoscaling: a metric model runs a fixed "
                                 "replicas.num_replicas")
            try:
                self.metric_model_config(name)
            except ValidationError as error:
                raise ValueError(f"metric_models.{name}: {_problems(error)}") from None

    def metric_model_config(self, name: str) -> AppConfig:
        """Metric model ``name`` as a scorer application of its own: what its replicas build and check
        (engine, preflight, placement, Serve options), routed by Serve's own router (its calls carry no
        group)."""
        settings = self.metric_models[name]
        return AppConfig(engine=settings.engine, scoring=settings.scoring, replicas=settings.replicas,
                         routing=RoutingSettings(router="serve_default"), replica_deployment_name=f"MetricModel-{name}")

    def recipes(self) -> list[tuple[str, RecipeSettings]]:
        """Every tenant recipe with the field it is set in: ``tenants.default.recipe``, ``http.tenants[i].recipe``."""
        return [("tenants.default.recipe", self.tenants.default.recipe),
                *((f"http.tenants[{index}].recipe", tenant.recipe) for index, tenant in enumerate(self.http.tenants))]

    def _recipes_fit(self) -> None:
        # A named tenant without a recipe of its own rewards as every other tenant does, not by the bare default
        # (copies: a settings object given to two configs is not changed).
        default = self.tenants.default.recipe
        if any("recipe" not in tenant.model_fields_set for tenant in self.http.tenants):
            self.http = self.http.model_copy(update={"tenants": [
                tenant if "recipe" in tenant.model_fields_set else tenant.model_copy(update={"recipe": default})
                for tenant in self.http.tenants]})
        for where, recipe in self.recipes():
            for name, part in recipe.model_parts().items():
                if part.deployment not in self.metric_models:
                    known = ", ".join(sorted(self.metric_models)) or "none configured"
                    raise ValueError(f"{where}.parts.{name}.deployment: no metric model {part.deployment!r} in "
                                     f"metric_models ({known})")

    def _token_budget_fits(self) -> None:
        # A prompt and answer longer than the context would be refused or cut short by the engine, which
        # reads as an unparseable verdict. An unset max_model_len (the model's own) is checked at start.
        max_model_len = self.engine.max_model_len
        if max_model_len is not None and self.scoring.sequence_tokens() > max_model_len:
            raise ValueError(
                f"engine.max_model_len ({max_model_len}) is below {self.scoring.sequence_tokens_text()}: the "
                "engine would refuse or cut such a sequence; raise engine.max_model_len or lower those limits")

    def _engine_slots_fit(self) -> None:
        # Groups sent past what the engine runs at once would queue inside the engine, first come first
        # served, out of the fair queue's reach (tenants.fair_share).
        slots, engine_slots = self.tenants.engine_slots, self.engine.batch_slots()
        if slots is not None and engine_slots is not None and slots * self.scoring.permutations > engine_slots:
            raise ValueError(
                f"tenants.engine_slots ({slots}) x scoring.permutations ({self.scoring.permutations}) exceeds the "
                f"{engine_slots} sequences the engine runs at once (engine.max_num_seqs): raise "
                "engine.max_num_seqs or lower tenants.engine_slots")

    @property
    def sleeps_when_idle(self) -> bool:
        """Whether idle replicas put their engines to sleep (``replicas.autoscaling.idle: sleep``)."""
        autoscaling = self.replicas.autoscaling
        return autoscaling is not None and autoscaling.idle == "sleep"

    def replica_engine(self) -> EngineConfig:
        """The engine a scorer replica builds: ``engine``, able to sleep where idle replicas sleep."""
        return self.engine.model_copy(update={"sleep_mode": True}) if self.sleeps_when_idle else self.engine

    def waiting_members_limit(self, tenant: str) -> int:
        """How many of ``tenant``'s members one replica holds waiting for group-mates before it refuses
        the tenant's new groups: ``max_waiting_members``, else derived from what a replica holds and what
        the tenant may use (:func:`cluster.admission.waiting_members_bound`)."""
        settings = self.tenant(tenant)
        if settings.max_waiting_members is not None:
            return settings.max_waiting_members
        return waiting_members_bound(self.replicas.max_ongoing_requests,
                                     largest_group=self.limits.max_candidates_per_group,
                                     max_groups_in_flight=settings.max_groups_in_flight)

    def tenant(self, name: str) -> TenantDefaults:
        """A tenant's settings: its own (``http.tenants``), else ``tenants.default`` (shared by every
        unlisted tenant: asked for each member a replica admits, so not copied under the name)."""
        for tenant in self.http.tenants:
            if tenant.name == name:
                return tenant
        return self.tenants.default

    def tenant_policy(self, name: str) -> TenantPolicy:
        """How a replica's fair queue treats the tenant."""
        settings = self.tenant(name)
        return TenantPolicy(weight=settings.weight, priority=settings.priority)

    @property
    def placement(self) -> ReplicaPlacement:
        """One replica's Ray resources and its engine's executor (``deployments/placement.py``)."""
        return plan_placement(self.engine, num_cpus=self.replicas.num_cpus, gpus_per_rank=self.replicas.gpus_per_rank,
                              resources=self.replicas.resources)

    @property
    def gpus_per_replica(self) -> float:
        """GPUs one replica holds: one per tensor- and pipeline-parallel rank."""
        return self.placement.gpus


def _problems(error: ValidationError) -> str:
    """A validation error's problems on one line, each after the field it names (where it names one)."""
    problems = []
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        where = ".".join(map(str, problem["loc"]))
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def load_app_config(path: str | Path, app_name: str | None = None) -> AppConfig:
    """Read a Serve config file and validate one application's ``args`` as an :class:`AppConfig`."""
    document = yaml.safe_load(Path(path).read_text())
    return AppConfig.model_validate(application_args(document, app_name))


def application_args(document: dict[str, Any], app_name: str | None = None) -> dict[str, Any]:
    """The ``args`` of the named (or only) application in a Serve config document."""
    return find_application(document, app_name).get("args") or {}


def find_application(document: dict[str, Any], app_name: str | None = None) -> dict[str, Any]:
    """The named (or first) application entry of a Serve config document, as written there."""
    for application in document.get("applications") or []:
        if app_name is None or application.get("name") == app_name:
            return application
    raise ValueError(f"applications: no application named {app_name!r}")
