"""Prometheus metrics of a scorer replica (exported through Ray's metrics endpoint)."""

from __future__ import annotations

import asyncio

from ray.serve.metrics import Counter, Gauge, Histogram

from cluster.engines.base import EngineStats, ReportingEngine
from cluster.protocol.schema import GroupResult

_LATENCY_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]


# Label of the tenants beyond a replica's max_tenant_labels.
OTHER_TENANTS = "other"
# How often a replica copies its engine's scheduler figures into its metrics: finer than a Prometheus
# scrape (15 s by default) is wasted; an engine updates them every step.
ENGINE_STATS_PERIOD_S = 5.0


class ReplicaMetrics:
    """Counters and histograms for groups, members, tokens and per-stage latency, and per tenant."""

    def __init__(self, max_tenant_labels: int = 64) -> None:
        # Each tenant label is a series of its own for the process's life: at most this many names.
        self._tenant_labels: set[str] = set()
        self._max_tenant_labels = max_tenant_labels
        self.tenant_groups = Counter("grrm_tenant_groups", "Groups a tenant had scored, valid or not.",
                                     tag_keys=("tenant",))
        self.tenant_failures = Counter(
            "grrm_tenant_failures", "A tenant's failures by kind: groups without a verdict, refusals over its "
                                    "limit, assembly timeouts.", tag_keys=("tenant", "failure"))
        self.tenant_prompt_tokens = Counter("grrm_tenant_prompt_tokens", "Prompt tokens of a tenant's groups.",
                                            tag_keys=("tenant",))
        self.tenant_completion_tokens = Counter("grrm_tenant_completion_tokens",
                                                "Answer tokens of a tenant's groups.", tag_keys=("tenant",))
        self.tenant_queue_wait = Histogram("grrm_tenant_queue_wait_s",
                                           "Seconds a tenant's complete group waited for the engine.",
                                           boundaries=_LATENCY_BOUNDARIES, tag_keys=("tenant",))
        self.groups_scored = Counter("grrm_groups_scored", "Groups scored with a valid verdict.")
        self.groups_failed = Counter(
            "grrm_groups_failed", "Groups that got no verdict, by failure reason.", tag_keys=("failure",)
        )
        self.parse_failures = Counter("grrm_parse_failures", "Generations whose verdict did not parse.")
        self.retries = Counter("grrm_retries", "Extra generation attempts after an unparseable answer.")
        self.verdict_repairs = Counter("grrm_verdict_repairs", "Verdicts obtained by constrained repair.")
        self.assembly_timeouts = Counter("grrm_assembly_timeouts", "Members answered with an assembly timeout.")
        self.groups_handed_off = Counter("grrm_groups_handed_off", "Groups not yet at the engine (assembling, or "
                                                                  "queued complete) handed to their new owner when "
                                                                  "the replica set changed.")
        self.prompt_tokens = Counter("grrm_prompt_tokens", "Prompt tokens sent to the engine.")
        self.completion_tokens = Counter("grrm_completion_tokens", "Completion tokens generated.")
        self.all_equal_groups = Counter(
            "grrm_all_equal_groups", "Valid groups whose scores are all equal (no learning signal)."
        )
        self.guarded_texts = Counter(
            "grrm_guarded_texts",
            "Texts (source, candidates) that could change the GQM prompt's structure, by what was done: "
            "neutralized, rejected or unguarded (scoring.prompt_guard off).",
            tag_keys=("action",),
        )
        self.members_waiting = Gauge("grrm_members_waiting", "Members waiting for the rest of their group.")
        self.engine_sleeping = Gauge("grrm_engine_sleeping", "1 while the replica's engine sleeps "
                                                             "(replicas.autoscaling.idle: sleep), else 0.")
        self.engine_probes_missed = Counter(
            "grrm_engine_probes_missed", "Health checks that found no answer to the engine's probe within "
                                         "hang_timeout_s (replicas.hang_probes in a row: the engine is hung).")
        # The engine scheduler's figures (vLLM only, but the queue lengths: the scripted engine too).
        self.engine_kv_cache_usage = Gauge("grrm_engine_kv_cache_usage", "Fraction of the engine's KV cache in "
                                                                         "use, 0 to 1 (vLLM).")
        self.engine_requests_running = Gauge("grrm_engine_requests_running", "Requests the engine generates for "
                                                                             "now (its running batch).")
        self.engine_requests_waiting = Gauge("grrm_engine_requests_waiting", "Requests queued at the engine, not "
                                                                             "yet scheduled.")
        self.engine_preemptions = Counter("grrm_engine_preemptions", "Requests the engine preempted (KV cache "
                                                                     "full: their blocks freed, recomputed later; "
                                                                     "vLLM).")
        self._preemptions_exported = 0
        self.stage_latency = Histogram(
            "grrm_stage_latency_s",
            "Seconds spent per stage (generation, parse, repair, merge, total).",
            boundaries=_LATENCY_BOUNDARIES,
            tag_keys=("stage",),
        )

    def record_group(self, result: GroupResult) -> None:
        """Account for one scored (or failed) group."""
        if result.valid:
            self.groups_scored.inc()
            if result.scores and len(set(result.scores)) == 1:
                self.all_equal_groups.inc()
        else:
            self.groups_failed.inc(tags={"failure": result.failure or "unknown"})
        unparsed = result.attempts - (1 if result.valid else 0)
        if result.failure in ("parse_failed", None) and unparsed > 0:
            self.parse_failures.inc(unparsed)
        if result.repairs:
            self.verdict_repairs.inc(result.repairs)
        if result.attempts > 1:
            self.retries.inc(result.attempts - 1)
        if result.usage.prompt_tokens:
            self.prompt_tokens.inc(result.usage.prompt_tokens)
        if result.usage.completion_tokens:
            self.completion_tokens.inc(result.usage.completion_tokens)
        for action, count in result.guarded_texts.items():
            self.guarded_texts.inc(count, tags={"action": action})
        for stage, seconds in result.stages.items():
            self.stage_latency.observe(seconds, tags={"stage": stage})
        self.stage_latency.observe(result.latency_s, tags={"stage": "total"})

    def tenant_label(self, tenant: str) -> str:
        """The label a tenant's series carry: its name, or ``other`` once the labels are all taken."""
        if tenant in self._tenant_labels:
            return tenant
        if len(self._tenant_labels) < self._max_tenant_labels:
            self._tenant_labels.add(tenant)
            return tenant
        return OTHER_TENANTS

    def record_tenant(self, tenant: str, result: GroupResult, waited_s: float) -> None:
        """Account for one of a tenant's groups: scored or failed, its tokens, its wait for the engine."""
        tags = {"tenant": self.tenant_label(tenant)}
        self.tenant_groups.inc(tags=tags)
        if not result.valid:
            self.record_tenant_failure(tenant, result.failure or "unknown")
        if result.usage.prompt_tokens:
            self.tenant_prompt_tokens.inc(result.usage.prompt_tokens, tags=tags)
        if result.usage.completion_tokens:
            self.tenant_completion_tokens.inc(result.usage.completion_tokens, tags=tags)
        self.tenant_queue_wait.observe(waited_s, tags=tags)

    def record_engine_stats(self, stats: EngineStats) -> None:
        """Copy the engine's latest scheduler figures into the gauges, and its new preemptions into the
        counter; a figure the engine does not have (``None``) is left out."""
        self.engine_requests_running.set(stats.running)
        self.engine_requests_waiting.set(stats.waiting)
        if stats.kv_cache_usage is not None:
            self.engine_kv_cache_usage.set(stats.kv_cache_usage)
        if stats.preemptions is not None:
            # A total below the last one is a restarted count: all of it is new.
            new = stats.preemptions - self._preemptions_exported
            new = stats.preemptions if new < 0 else new
            if new:
                self.engine_preemptions.inc(new)
            self._preemptions_exported = stats.preemptions

    def record_tenant_failure(self, tenant: str, failure: str) -> None:
        """One of a tenant's requests failed: a group without a verdict, a refusal, an assembly timeout."""
        self.tenant_failures.inc(tags={"tenant": self.tenant_label(tenant), "failure": failure})


async def export_engine_stats(engine: ReportingEngine, metrics: ReplicaMetrics,
                              period_s: float = ENGINE_STATS_PERIOD_S) -> None:
    """Copy the engine's scheduler figures into the replica's metrics every ``period_s``, until cancelled."""
    while True:
        stats = engine.stats()
        if stats is not None:
            metrics.record_engine_stats(stats)
        await asyncio.sleep(period_s)
