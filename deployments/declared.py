"""Deploying a reward application the way ``serve run CONFIG`` does: declaratively, from its config.

Ray Serve takes an application-level autoscaling policy only from a declarative config (a
``serve run``/``serve deploy`` file's ``autoscaling_policy``); ``serve.run(app)`` has no such
parameter. Benchmarks and tests that need the policy ``deployments/grrm.yaml`` names deploy
through :func:`deploy_declared`, which builds the same config a YAML file would hold.
"""

from __future__ import annotations

import time
from typing import Any

from deployments.autoscaling_policy import APPLICATION_POLICY_PATH
from deployments.config import AppConfig

__all__ = ["BUILDER_PATH", "application_policy", "deploy_declared"]

BUILDER_PATH = "deployments.app:build_app"


def application_policy(config: AppConfig) -> dict[str, Any] | None:
    """The application-level ``autoscaling_policy`` an application of ``config`` takes: the project's
    where its scorers scale on engine work (see :class:`deployments.autoscaling_policy.ApplicationEngineWorkPolicy`),
    none otherwise."""
    scaling = config.replicas.autoscaling
    if scaling is None or scaling.policy != "engine_work":
        return None
    return {"policy_function": APPLICATION_POLICY_PATH}


def deploy_declared(config: AppConfig, name: str, route_prefix: str | None, timeout_s: float = 180.0) -> None:
    """Deploy ``config``'s application as ``name`` on the running Serve instance, as a ``serve run``
    config file with the application's autoscaling policy would, and wait until it runs.

    Other applications deployed with ``serve.run`` stay; other declared ones are replaced (a
    declarative config lists every application it keeps)."""
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    application: dict[str, Any] = {
        "name": name, "route_prefix": route_prefix, "import_path": BUILDER_PATH,
        "args": config.model_dump(mode="json", exclude_unset=True),
    }
    policy = application_policy(config)
    if policy is not None:
        application["autoscaling_policy"] = policy
    serve.context._get_global_client().deploy_apps(ServeDeploySchema(applications=[application]))
    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(name)
        state = str(status.status) if status is not None else "NOT_STARTED"
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED"):
            raise RuntimeError(f"application {name!r} failed to deploy: {status.message}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"application {name!r} is not running after {timeout_s:.0f} s ({state})")
        time.sleep(0.2)
