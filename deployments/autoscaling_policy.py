"""The scorer deployment's Ray Serve autoscaling policy: engine work and announced demand.

A thin edge over :func:`cluster.autoscaling.decide_replicas`. Each replica reports its engine
work and the demand announced to it through ``record_autoscaling_stats``
(:func:`autoscaling_stats`); Serve's controller calls :class:`EngineWorkPolicy` with those reports
(only running replicas report: one that fails to start counts for nothing) and applies
``min_replicas``/``max_replicas``. Everything the policy knows is rebuilt from the reports, so a
restarted controller decides as before (the downscale delay starts again, and a withdrawal no longer
reported is forgotten: an older copy of its tenant's announcement kept elsewhere counts until its end).

The demand in a report is bounded whatever the number of tenants: the largest announcements whole, the
rest merged (``cluster/demand_report.py``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cluster.autoscaling import Demand, ReplicaLoad, ScalingSettings, decide_replicas
from cluster.demand_report import DemandReader, report_demands

__all__ = [
    "APPLICATION_POLICY_PATH",
    "ApplicationEngineWorkPolicy",
    "EngineWorkPolicy",
    "POLICY_PATH",
    "autoscaling_stats",
    "demand_stats",
    "demands_of",
    "loads_of",
]

logger = logging.getLogger("ray.serve")
POLICY_PATH = "deployments.autoscaling_policy:EngineWorkPolicy"
APPLICATION_POLICY_PATH = "deployments.autoscaling_policy:ApplicationEngineWorkPolicy"
# Report keys: a replica's load, and the announced demand (cluster/demand_report.py: "demand/...").
# Counts (0 when unreported), a flag, and measurements a replica may not have yet (None when unreported).
COUNT_KEYS = ("groups_waiting", "groups_running", "queued_work_s", "members_waiting")
MEASURED_KEYS = ("seconds_per_group", "cold_start_s", "members_per_group")
LOAD_KEYS = (*COUNT_KEYS, "sleeping", "saturated", *MEASURED_KEYS)


def autoscaling_stats(load: ReplicaLoad, demands: list[Demand], now: float | None = None,
                      grace_s: float = 0.0) -> dict[str, float]:
    """A replica's report, as Serve's ``record_autoscaling_stats`` wants it (flat names, numbers)."""
    stats = {key: float(getattr(load, key)) for key in LOAD_KEYS if getattr(load, key) is not None}
    return {**stats, **demand_stats(demands, now, grace_s)}


def demand_stats(demands: list[Demand], now: float | None = None, grace_s: float = 0.0) -> dict[str, float]:
    """Announced demands as report keys, at most :data:`~cluster.demand_report.MAX_REPORT_KEYS` of them: a
    scorer replica's, or the HTTP ingress's (which keeps every announcement it took, so the application's
    policy sees them while no scorer replica runs). ``now``: Unix seconds (default: the clock's);
    ``grace_s``: how long a phase merged with others keeps its last slice's rate after its end."""
    return report_demands(demands, time.time() if now is None else now, grace_s)


def _latest(raw_metrics: dict[str, dict[Any, list[Any]]]) -> dict[Any, dict[str, float]]:
    """Each replica's last reported value of every key (Serve keeps a time series per key)."""
    by_replica: dict[Any, dict[str, float]] = {}
    for name, series_by_replica in raw_metrics.items():
        for replica, series in series_by_replica.items():
            if series:
                by_replica.setdefault(replica, {})[name] = float(max(series, key=lambda point: point.timestamp).value)
    return by_replica


def loads_of(reports: dict[Any, dict[str, float]]) -> list[ReplicaLoad]:
    """Each reporting replica's load."""
    return [
        ReplicaLoad(**{key: report.get(key, 0.0) for key in COUNT_KEYS}, sleeping=bool(report.get("sleeping")),
                    saturated=bool(report.get("saturated")), **{key: report.get(key) for key in MEASURED_KEYS})
        for report in reports.values()
    ]


def demands_of(reports: dict[Any, dict[str, float]], now: float, grace_s: float,
               others: dict[Any, dict[str, float]] | None = None, tenants: tuple[str, ...] = ()) -> list[Demand]:
    """The announced demands the replicas (``reports``) and another deployment's (``others``: the ingress's)
    know: per tenant its latest announcement (wherever it is kept), unless that withdrew it (0 groups) or is
    long over (a client that announced and never came stops counting ``grace_s`` after its phase's end).
    ``tenants``: those named (the others by number). One read, remembering nothing (the policy remembers
    withdrawals from one read to the next: :class:`~cluster.demand_report.DemandReader`)."""
    return DemandReader(tenants).demands([reports.values(), (others or {}).values()], now, grace_s)


class EngineWorkPolicy:
    """Serve instantiates this once per deployment (``policy_kwargs``: the :class:`ScalingSettings`
    fields) and calls it on every autoscaling tick with an ``AutoscalingContext``."""

    def __init__(self, **settings: Any):
        # Pairs arrive as lists where the kwargs went through JSON.
        caps = tuple((tenant, int(replicas)) for tenant, replicas in settings.pop("tenant_max_announced_replicas", ()))
        self.settings = ScalingSettings(**settings, tenant_max_announced_replicas=caps)
        # The tenants with a cap of their own are named; the reader remembers withdrawals between ticks.
        self.demand_reader = DemandReader(tenant for tenant, _ in caps)
        self.last_reason = ""

    def __call__(self, context: Any) -> tuple[int, dict[str, Any]]:
        return self.decide(context)

    def decide(self, context: Any, announcements: dict[Any, dict[str, float]] | None = None,
               reports: dict[Any, dict[str, float]] | None = None) -> tuple[int, dict[str, Any]]:
        """The replica count for ``context``'s deployment, from its replicas' reports (``reports``: read
        from ``context`` unless given) and the demands in ``announcements`` (other deployments' reports:
        the ingress's) besides theirs."""
        now = context.current_time or time.time()
        reports = _latest(context.raw_metrics or {}) if reports is None else reports
        decision = decide_replicas(
            now=now,
            current=context.target_num_replicas,
            loads=loads_of(reports),
            demands=self.demand_reader.demands([reports.values(), (announcements or {}).values()], now,
                                               self.settings.demand_grace_s),
            settings=self.settings,
            state=dict(context.policy_state or {}),
            queued_at_callers=float(context.total_queued_requests or 0.0),
            serving=context.current_num_replicas,
        )
        if decision.reason != self.last_reason:  # the controller's log says why the pool is the size it is
            logger.info("engine_work autoscaling of %s: %s (engine work %.1f s, for work %d, for demand %d, "
                        "%d reporting, %d asleep, cold start %.1f s)", getattr(context, "deployment_name", "?"),
                        decision.reason, decision.engine_work_s, decision.for_work, decision.for_demand, len(reports),
                        decision.sleeping, decision.cold_start_s)
        self.last_reason = decision.reason
        return decision.replicas, decision.state


class ApplicationEngineWorkPolicy:
    """The application-level policy (``autoscaling_policy`` of a ``serve run`` config's application,
    as ``deployments/grrm.yaml`` sets it): the scorer deployment scaled as :class:`EngineWorkPolicy`
    scales it, with the demands the HTTP ingress took as well.

    A deployment's own policy sees only its own replicas' reports, so a scorer pool at 0 replicas
    (``min_replicas: 0``) hears of no announcement and grows only when work reaches its callers; the
    ingress, which always runs, reports every announcement it took, and this policy reads them. Each
    deployment whose own policy is :class:`EngineWorkPolicy` is decided here with its settings (its
    ``policy_kwargs``); every other one with an autoscaling config keeps its target (the ingress's
    is fixed: min = max)."""

    def __init__(self) -> None:
        self.policies: dict[Any, EngineWorkPolicy] = {}

    def __call__(self, contexts: dict[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict[str, Any]]]:
        reports = {deployment: _latest(context.raw_metrics or {}) for deployment, context in contexts.items()}
        decisions: dict[Any, int] = {}
        states: dict[Any, dict[str, Any]] = {}
        for deployment, context in contexts.items():
            policy = getattr(context.config, "policy", None)
            if getattr(policy, "policy_function", None) not in (POLICY_PATH, EngineWorkPolicy):
                decisions[deployment], states[deployment] = context.target_num_replicas, dict(context.policy_state or {})
                continue
            if deployment not in self.policies:
                self.policies[deployment] = EngineWorkPolicy(**policy.policy_kwargs)
            # Its own replicas' reports are its load; the other deployments' (the ingress's) bring announcements.
            others = {replica: report for other, by_replica in reports.items() if other != deployment
                      for replica, report in by_replica.items()}
            decisions[deployment], states[deployment] = self.policies[deployment].decide(context, others,
                                                                                         reports[deployment])
        return decisions, states
