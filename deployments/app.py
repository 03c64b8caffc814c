"""The builder that turns an :class:`AppConfig` into a Ray Serve application.

``serve run deployments/local.yaml`` calls :func:`build_app` with the YAML's ``args``; Serve
validates them against ``AppConfig`` (the annotation) before anything starts.
"""

# No `from __future__ import annotations` here: Serve reads build_app's annotation as a class
# to validate YAML `args` against AppConfig before anything starts.
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deployments.config import AppConfig, runtime_env
from deployments.ingress import GRRMIngress
from deployments.ledger import LedgerReplica
from deployments.metric_models import MetricModelReplica
from deployments.process_env import BODY_MEMORY_ENV
from deployments.replica import GRRMReplica

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ROUTER_CLASS = "deployments.router:GroupAwareRequestRouter"
LEDGER_ROUTER_CLASS = "deployments.ledger:LedgerCopyRouter"


def resolve_model_path(config: AppConfig) -> AppConfig:
    """Make a relative local model path absolute (replica processes do not share our cwd)."""
    model = config.engine.model
    if not model or Path(model).is_absolute():
        return config
    local = PROJECT_ROOT / model
    if local.exists() or config.build_tiny_model_if_missing or model.startswith("."):
        engine = config.engine.model_copy(update={"model": str(local)})
        return config.model_copy(update={"engine": engine})
    return config  # a hub id such as double7/Qwen2.5-7B-GRRM


def shared_options(config: AppConfig) -> dict[str, Any]:
    """Serve deployment options the scorer, ledger and ingress deployments all take from the config."""
    return {
        "graceful_shutdown_wait_loop_s": config.replicas.graceful_shutdown_wait_loop_s,
        "logging_config": {"enable_access_log": config.replicas.access_log},
    }


def replica_options(config: AppConfig) -> dict[str, Any]:
    """Serve deployment options of the scorer replica deployment.

    Its resources and the engine's executor follow from :func:`deployments.placement.plan_placement`
    (one rank: the actor holds its GPU; single-node TP/PP: the actor holds every rank's GPU and
    the engine starts the ranks as processes; the Ray executor: a placement group per replica).
    """
    replicas = config.replicas
    options: dict[str, Any] = {
        "name": config.replica_deployment_name,
        "max_ongoing_requests": replicas.max_ongoing_requests,
        "max_queued_requests": replicas.max_queued_requests,
        "health_check_period_s": replicas.health_check_period_s,
        "health_check_timeout_s": replicas.health_check_timeout_s,
        "graceful_shutdown_timeout_s": replicas.graceful_shutdown_timeout_s,
        **shared_options(config),
    }
    if config.routing.router == "group_aware":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs={
                "load_factor": config.routing.load_factor,
                "headroom": config.routing.headroom,
                "virtual_nodes": config.routing.virtual_nodes,
            },
            request_routing_stats_period_s=config.routing.stats_period_s,
        )
    placed = config.placement.serve_options()
    placed["ray_actor_options"].update(runtime_env(replicas.env_vars))
    options.update(placed)
    if replicas.autoscaling is not None:
        # The policy caps what each tenant's announcements may claim: tenants.default's, http.tenants' own.
        options["autoscaling_config"] = replicas.autoscaling.serve_config(config.tenants.default, config.http.tenants)
    else:
        options["num_replicas"] = replicas.num_replicas or 1
    return options


def build_app(args: AppConfig) -> Application:
    """Build the reward application: scorer replicas behind the group-aware router, the metric models
    they score recipe parts with, and HTTP."""
    config = resolve_model_path(args if isinstance(args, AppConfig) else AppConfig.model_validate(args))
    ledger = serve.deployment(LedgerReplica).options(
        name=config.ledger_deployment_name,
        max_ongoing_requests=100_000,
        request_router_config=RequestRouterConfig(request_router_class=LEDGER_ROUTER_CLASS),
        **shared_options(config),
        **config.ledger.serve_options(),
    ).bind(config.completed_ttl_s, copies=config.ledger.num_replicas)
    # Bound to the scorers (which reach them as handles), the metric models are deployments of this application.
    replicas = serve.deployment(GRRMReplica).options(**replica_options(config)).bind(
        config, ledger, metric_models=metric_model_deployments(config))
    ingress = GRRMIngress.options(
        name=config.ingress_deployment_name,
        max_ongoing_requests=100_000,  # backpressure belongs to the replicas (503 from there)
        **shared_options(config),
        **ingress_options(config),
    )
    return ingress.bind(replicas, config)


def metric_model_deployments(config: AppConfig) -> dict[str, Application]:
    """A bound deployment per metric model (name -> application; ``metric_models`` in the config): its
    replicas' options are a scorer's of the same settings (resources, placement, health checks), under
    its own name and Serve's own router."""
    deployments: dict[str, Application] = {}
    for name in config.metric_models:
        own = resolve_model_path(config.metric_model_config(name))
        deployments[name] = serve.deployment(MetricModelReplica).options(**replica_options(own)).bind(name, own)
    return deployments


def ingress_options(config: AppConfig) -> dict[str, Any]:
    """Serve deployment options of the HTTP ingress.

    Where the scorers scale on the project's policy, the ingress reports the demand announcements it
    took (``GRRMIngress.record_autoscaling_stats``), which Serve collects only from a deployment with
    an autoscaling config: it gets one that holds it at its replica count (min = max), and the
    application-level policy (:data:`~deployments.autoscaling_policy.APPLICATION_POLICY_PATH`) reads
    the reports, so that a scorer pool at 0 replicas still grows ahead of announced work."""
    options = config.ingress.serve_options(env_vars={**BODY_MEMORY_ENV, **config.http.env_vars})
    scaling = config.replicas.autoscaling
    if scaling is not None and scaling.policy == "engine_work":
        count = options.pop("num_replicas")
        options["autoscaling_config"] = {
            "min_replicas": count, "max_replicas": count, "initial_replicas": count,
            "metrics_interval_s": scaling.metrics_interval_s, "look_back_period_s": scaling.look_back_period_s,
        }
    return options
