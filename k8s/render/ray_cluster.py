"""The RayService: its Ray cluster (a CPU-only head, the ``grrm-gpus`` reward workers, the
``grrm-services`` CPU pods for the ingress and the ledger, the ``policy-gpus`` trainer workers,
the Ray autoscaler v2) with the Serve application embedded, and GCS fault tolerance."""

from __future__ import annotations

import json
from typing import Any

from deployments.process_env import BODY_MEMORY_ENV
from k8s.render.app import GRRM_RESOURCE, SERVICE_RESOURCE, Sizing
from k8s.render.kube import (
    CLIENT_PORT,
    DASHBOARD_AGENT_PORT,
    DASHBOARD_PORT,
    GCS_PORT,
    METRICS_PORT,
    SERVE_PORT,
    labels,
    resources,
    secret_env,
    to_yaml,
)
from k8s.render.options import RenderOptions
from k8s.render.redis import redis_address
from k8s.render.scheduling import (
    HEAD_COMPONENT,
    POLICY_COMPONENT,
    REWARD_COMPONENT,
    SERVICES_COMPONENT,
    cpu_pod,
    policy_pod,
    reward_pod,
    service_pod,
)
from k8s.render.volumes import cache_pod_settings, engine_env, engine_volume_mounts, model_cache_volume, shm_volume

# Custom Ray resources that tag each worker group (see README "Keeping the two workloads apart"); the
# reward group's, GRRM_RESOURCE, is defined beside the application that asks for it (app.py).
TRAINER_RESOURCE = "verl_trainer"


def api_token_env(options: RenderOptions) -> dict[str, Any]:
    # Required: a missing Secret must not silently start an unauthenticated service (an empty
    # value in the Secret is the explicit way to run without a token).
    return secret_env("GRRM_API_TOKEN", options.api_token_secret, optional=False)


def agent_health_probe(initial_delay: int, period: int, timeout: int, failures: int) -> dict[str, Any]:
    """The dashboard agent's node health endpoint (raylet, and GCS on the head), Ray >= 2.53."""
    return {
        "httpGet": {"path": "/api/healthz", "port": DASHBOARD_AGENT_PORT},
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def serve_proxy_probe() -> dict[str, Any]:
    """The node's Serve proxy: ready = this pod takes HTTP traffic from the serve Service.

    Like KubeRay's own RayService worker probe: one failure takes the pod out of the Service
    (a proxy answers 503 while it drains, e.g. on a node that lost its last replica).
    """
    return {
        "httpGet": {"path": "/-/healthz", "port": SERVE_PORT},
        "initialDelaySeconds": 10,
        "periodSeconds": 5,
        "timeoutSeconds": 2,
        "successThreshold": 1,
        "failureThreshold": 1,
    }


def ray_resources_param(custom: dict[str, int]) -> str:
    """A rayStartParams `resources` value in the form both KubeRay and Ray's autoscaler read."""
    return '"' + json.dumps(custom).replace('"', '\\"') + '"'


def head_group(options: RenderOptions) -> dict[str, Any]:
    container = {
        "name": "ray-head",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"containerPort": GCS_PORT, "name": "gcs-server"},
            {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
            {"containerPort": CLIENT_PORT, "name": "client"},
            {"containerPort": SERVE_PORT, "name": "serve"},
            {"containerPort": METRICS_PORT, "name": "metrics"},
        ],
        "resources": resources(options.head_cpus, options.head_memory_gi),
        "readinessProbe": agent_health_probe(initial_delay=10, period=5, timeout=5, failures=10),
        "livenessProbe": agent_health_probe(initial_delay=30, period=10, timeout=5, failures=60),
    }
    return {
        # num-cpus 0: no task or actor that asks for a CPU runs on the head (verl's TaskRunner,
        # the replicas' CPU bundle); num-gpus 0: no GPU work either.
        "rayStartParams": {
            "num-cpus": "0",
            "num-gpus": "0",
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {
            "metadata": {"labels": labels(options, HEAD_COMPONENT)},
            "spec": {**cpu_pod(options), "containers": [container]},
        },
    }


def serving_container(options: RenderOptions, env: list[dict[str, Any]], quantities: dict[str, Any]) -> dict[str, Any]:
    """A worker container that runs Serve replicas and a proxy (reward and services pods)."""
    return {
        "name": "ray-worker",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"containerPort": SERVE_PORT, "name": "serve"},
            {"containerPort": METRICS_PORT, "name": "metrics"},
        ],
        # Serve's proxy and the ingress read request bodies here (deployments/process_env.py).
        "env": [*env, *({"name": name, "value": value} for name, value in BODY_MEMORY_ENV.items())],
        "resources": quantities,
        "readinessProbe": serve_proxy_probe(),
        # Model download and load do not block the raylet, so the node probe can stay strict.
        "livenessProbe": agent_health_probe(initial_delay=30, period=10, timeout=5, failures=30),
    }


def reward_worker_group(options: RenderOptions, sizing: Sizing) -> dict[str, Any]:
    container = serving_container(
        options, [*engine_env(options), api_token_env(options)],
        resources(sizing.container_cpus, sizing.memory_gi, sizing.gpus_per_worker),
    )
    container["volumeMounts"] = engine_volume_mounts()
    spec: dict[str, Any] = {
        **reward_pod(options),
        **cache_pod_settings(options, options.image),
        "containers": [container],
        "volumes": [model_cache_volume(options), shm_volume(sizing.shm_gi)],
    }
    return {
        "groupName": "grrm-gpus",
        "replicas": sizing.min_workers,
        "minReplicas": sizing.min_workers,
        "maxReplicas": sizing.max_workers,
        "idleTimeoutSeconds": options.worker_idle_timeout_s,
        # No autoscaler `priority`: a replica's demand (grrm_worker) fits this group only, and no trainer
        # demand (a CPU) fits it, so the autoscaler never has two groups to choose from.
        "rayStartParams": {
            # No Ray CPU, whatever the container's quota: nothing that asks for a CPU (verl's TaskRunner,
            # its reward-loop workers, its {CPU: 3, GPU: 1} bundles) can land on a reward pod. The replicas
            # ask for none (app.py), only for their GPUs and a grrm_worker each.
            "num-cpus": "0",
            "num-gpus": str(sizing.gpus_per_worker),
            "resources": ray_resources_param({GRRM_RESOURCE: sizing.replicas_per_worker}),
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {"metadata": {"labels": labels(options, REWARD_COMPONENT)}, "spec": spec},
    }


def service_worker_group(options: RenderOptions) -> dict[str, Any]:
    """CPU pods for the ingress and the ledger, one replica of each per pod (max_replicas_per_node)."""
    container = serving_container(options, [api_token_env(options)], resources(options.service_cpus, options.service_memory_gi))
    return {
        "groupName": "grrm-services",
        "replicas": options.service_pods,
        "minReplicas": options.service_pods,
        "maxReplicas": options.service_pods,
        "rayStartParams": {
            # No Ray CPU: nothing that asks for one (trainer actors) lands here; the ingress and the
            # ledger ask for the custom resource instead (one each per pod). No GPU either, said
            # explicitly: Ray would count the GPUs a runtime exposes to a pod that asked for none.
            "num-cpus": "0",
            "num-gpus": "0",
            "resources": ray_resources_param({SERVICE_RESOURCE: 2}),
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {
            "metadata": {"labels": labels(options, SERVICES_COMPONENT)},
            "spec": {**service_pod(options), "containers": [container]},
        },
    }


def policy_worker_group(options: RenderOptions) -> dict[str, Any]:
    gpus = options.policy_gpus_per_node
    cpus = options.policy_cpus_per_gpu * gpus
    shm_gi = options.policy_shm_gi_per_gpu * gpus
    container = {
        "name": "ray-worker",
        "image": options.trainer_image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"containerPort": SERVE_PORT, "name": "serve"},
            {"containerPort": METRICS_PORT, "name": "metrics"},
        ],
        # The bridge reaches the reward app through a Serve handle (no token needed); the token
        # is there for its HTTP transport.
        "env": [*engine_env(options), api_token_env(options)],
        # A memory-backed /dev/shm counts against the pod's memory.
        "resources": resources(cpus, options.policy_memory_gi_per_gpu * gpus + shm_gi, gpus),
        # Same readiness as the reward workers: a trainer node has no Serve replica, its proxy
        # drains, so it never receives HTTP traffic from the serve Service (KubeRay labels every
        # RayService worker as a serve endpoint; readiness is what filters them).
        "readinessProbe": serve_proxy_probe(),
        "livenessProbe": agent_health_probe(initial_delay=30, period=10, timeout=5, failures=30),
        "volumeMounts": engine_volume_mounts(),
    }
    volumes: list[dict[str, Any]] = [model_cache_volume(options), shm_volume(shm_gi)]
    if options.trainer_data_pvc:
        container["volumeMounts"].append({"name": "data", "mountPath": "/data"})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": options.trainer_data_pvc}})
    spec: dict[str, Any] = {
        **policy_pod(options),
        **cache_pod_settings(options, options.trainer_image),
        "containers": [container],
        "volumes": volumes,
    }
    minimum = options.policy_min_nodes
    return {
        "groupName": "policy-gpus",
        "replicas": minimum,
        "minReplicas": minimum,
        "maxReplicas": options.policy_nodes,
        "idleTimeoutSeconds": options.policy_idle_timeout_s,
        "rayStartParams": {
            "num-cpus": str(cpus),
            "num-gpus": str(gpus),
            # One per node: the job's entrypoint asks for it, so the driver runs on a trainer
            # node (with the trainer image) and, from zero, wakes the group up.
            "resources": ray_resources_param({TRAINER_RESOURCE: 1}),
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {"metadata": {"labels": labels(options, POLICY_COMPONENT)}, "spec": spec},
    }


def ray_groups(options: RenderOptions, sizing: Sizing) -> dict[str, dict[str, Any]]:
    """The head group and the worker groups (in ``workerGroupSpecs`` order), by group name (``head``)."""
    return {
        "head": head_group(options),
        "grrm-gpus": reward_worker_group(options, sizing),
        "grrm-services": service_worker_group(options),
        "policy-gpus": policy_worker_group(options),
    }


def rayservice(options: RenderOptions, serve_config: dict[str, Any], sizing: Sizing) -> dict[str, Any]:
    groups = ray_groups(options, sizing)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {
            "name": options.name,
            "namespace": options.namespace,
            # KubeRay copies the RayService's labels onto every RayCluster it creates for it.
            "labels": labels(options, "reward-service"),
        },
        "spec": {
            # Blue/green on a rayClusterConfig change (2x GPUs while both clusters run);
            # a serveConfigV2-only change is applied in place on the running cluster.
            "upgradeStrategy": {"type": options.upgrade_strategy},
            # External traffic goes to the worker proxies only (the head hosts no replica), unless
            # Serve may scale to zero replicas: then only the head's proxy can take the request
            # that makes Serve scale up from zero.
            "excludeHeadPodFromServeSvc": sizing.min_replicas > 0,
            "serveConfigV2": to_yaml(serve_config),
            "rayClusterConfig": {
                "rayVersion": options.ray_version,
                "enableInTreeAutoscaling": True,
                "autoscalerOptions": {
                    "version": "v2",
                    "upscalingMode": "Default",
                    "idleTimeoutSeconds": options.worker_idle_timeout_s,
                    "imagePullPolicy": "IfNotPresent",
                    "resources": resources("1", 1),
                },
                "headGroupSpec": groups.pop("head"),
                "workerGroupSpecs": list(groups.values()),
                **gcs_fault_tolerance(options),
            },
        },
    }


def gcs_fault_tolerance(options: RenderOptions) -> dict[str, Any]:
    """The RayService's GCS fault tolerance on Redis (KubeRay >= 1.3): the rendered one or yours; none if off."""
    address = redis_address(options)
    if not address:
        return {}
    return {
        "gcsFaultToleranceOptions": {
            "redisAddress": address,
            "redisPassword": {
                "valueFrom": {"secretKeyRef": {"name": options.redis_password_secret, "key": "password"}}
            },
        }
    }
