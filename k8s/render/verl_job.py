"""The verl job on the RayService's Ray cluster: a RayJob running verl's ``main_ppo`` with the
trainer bridge, and the same job as a ``ray job submit`` script. Its Hydra overrides (the
hyperparameters, the bridge) are in ``verl_job.yaml`` next to this module."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from k8s.render.app import Sizing
from k8s.render.kube import DASHBOARD_PORT, GENERATED_HEADER, labels, resources
from k8s.render.options import RenderOptions
from k8s.render.ray_cluster import TRAINER_RESOURCE
from k8s.render.scheduling import cpu_pod

VERL_JOB_OVERRIDES = Path(__file__).with_name("verl_job.yaml")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")  # a whole value "{name}": a render option's value


def verl_overrides(options: RenderOptions, sizing: Sizing, path: Path = VERL_JOB_OVERRIDES) -> list[str]:
    """verl's main_ppo Hydra overrides (``key=value``): ``verl_job.yaml``'s, its ``{name}`` values
    filled from the options and the application."""
    names: dict[str, Any] = {field.name: getattr(options, field.name) for field in fields(options)}
    names.update(app_name=sizing.app_name, replica_deployment=sizing.replica_deployment)
    overrides = yaml.safe_load(path.read_text())
    return [f"{key}={_hydra_value(value, names, key)}" for key, value in overrides.items()]


def _hydra_value(value: Any, names: dict[str, Any], key: str) -> str:
    """A YAML value as a Hydra override writes it."""
    if isinstance(value, str):
        placeholder = _PLACEHOLDER.fullmatch(value)
        if placeholder is None:
            return value
        if placeholder.group(1) not in names:
            raise ValueError(f"{key}: {value!r} names no render option (known: {', '.join(names)})")
        return str(names[placeholder.group(1)])
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(item, names, key) for item in value) + "]"
    return str(value)


def entrypoint_text(options: RenderOptions, sizing: Sizing) -> str:
    lines = ["python3 -m verl.trainer.main_ppo"] + [shlex.quote(item) for item in verl_overrides(options, sizing)]
    return " \\\n  ".join(lines) + "\n"


def entrypoint_resources() -> str:
    return json.dumps({TRAINER_RESOURCE: 1})


def rayjob(options: RenderOptions, sizing: Sizing) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": options.job_name, "namespace": options.namespace, "labels": labels(options, "trainer")},
        "spec": {
            # KubeRay reads only the `ray.io/cluster` key of clusterSelector, as the exact name of
            # an existing RayCluster. A RayService's cluster is named <rayservice>-<random suffix>
            # and renamed on every cluster upgrade, so the name is filled in at submit time.
            "clusterSelector": {"ray.io/cluster": options.ray_cluster_name},
            "submissionMode": "K8sJobMode",
            "entrypoint": entrypoint_text(options, sizing),
            # The driver (main_ppo) runs on a trainer node, which has verl installed.
            "entrypointResources": entrypoint_resources(),
            # The cluster is the reward service's: never tear it down with the job.
            "shutdownAfterJobFinishes": False,
            "submitterPodTemplate": submitter_pod(options),
        },
    }


def submitter_pod(options: RenderOptions) -> dict[str, Any]:
    """The pod that runs ``ray job submit`` (KubeRay fills in its command): KubeRay's default, placed as the
    other CPU pods are (its default would ignore the render's tolerations and node selectors)."""
    return {
        "metadata": {"labels": labels(options, "trainer-submitter")},
        "spec": {
            **cpu_pod(options),
            "restartPolicy": "Never",
            "containers": [{
                "name": "ray-job-submitter",
                # The head's image, as KubeRay's default: the same Ray as the cluster.
                "image": options.image,
                "imagePullPolicy": "IfNotPresent",
                "resources": resources(1, 1),
            }],
        },
    }


def submit_script(options: RenderOptions, sizing: Sizing) -> str:
    address = f"http://{options.name}-head-svc.{options.namespace}.svc.cluster.local:{DASHBOARD_PORT}"
    return (
        "#!/usr/bin/env bash\n"
        + GENERATED_HEADER
        + "#\n"
        "# The alternative to verl-job.yaml: submit the same verl job with `ray job submit` to the\n"
        f"# RayService's head Service ({options.name}-head-svc), which KubeRay keeps pointed at the active\n"
        "# RayCluster (no generated name to look up). Run it where that Service resolves (a pod in the\n"
        "# cluster), or set RAY_ADDRESS, e.g. after\n"
        f"#   kubectl -n {options.namespace} port-forward svc/{options.name}-head-svc "
        f"{DASHBOARD_PORT}:{DASHBOARD_PORT}\n"
        f"#   RAY_ADDRESS=http://127.0.0.1:{DASHBOARD_PORT} bash k8s/submit-verl-job.sh\n"
        "# Extra arguments go to `ray job submit` (e.g. --submission-id, --no-wait).\n"
        "set -euo pipefail\n"
        f'RAY_ADDRESS="${{RAY_ADDRESS:-{address}}}"\n'
        'exec ray job submit --address "$RAY_ADDRESS" \\\n'
        f"  --entrypoint-resources {shlex.quote(entrypoint_resources())} \\\n"
        '  "$@" \\\n'
        "  -- " + entrypoint_text(options, sizing)
    )
