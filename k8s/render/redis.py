"""The Redis behind GCS fault tolerance: its address, and (by default) one rendered in the cluster.

In the cluster by default so that a first deploy works: the RayService's head does not start without
the Redis its GCS keeps state in, and a prerequisite a user has to find in the docs is one a first
deploy misses. It is one pod with its append-only file on a volume (a restart of the pod or its node
keeps the state), which protects against the head's failure, the one that restarts every replica.
It is not highly available: production points ``redis_address`` at a Redis that is (README).
"""

from __future__ import annotations

from typing import Any

from k8s.render.kube import labels, resources
from k8s.render.options import RenderOptions
from k8s.render.scheduling import REDIS_COMPONENT, redis_pod

REDIS_PORT = 6379
# The password comes from the Secret as an environment variable; the probes and the command read it there.
_PING = 'redis-cli --no-auth-warning -a "$REDIS_PASSWORD" ping | grep -q PONG'


def redis_name(options: RenderOptions) -> str:
    """The in-cluster Redis's Service and StatefulSet name."""
    return f"{options.name}-redis"


def in_cluster(options: RenderOptions) -> bool:
    """Whether this render brings its own Redis (``redis_address`` None)."""
    return options.redis_address is None


def redis_address(options: RenderOptions) -> str:
    """The GCS's Redis: the rendered one's Service, or ``redis_address`` ('' = GCS fault tolerance off)."""
    if in_cluster(options):
        return f"redis://{redis_name(options)}.{options.namespace}.svc.cluster.local:{REDIS_PORT}"
    return options.redis_address or ""


def redis_objects(options: RenderOptions) -> list[dict[str, Any]]:
    """The in-cluster Redis: a Service and a one-pod StatefulSet with a volume of its own."""
    name = redis_name(options)
    selector = labels(options, REDIS_COMPONENT)
    probe = {"exec": {"command": ["sh", "-c", _PING]}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "redis",
        "image": options.redis_image,
        "imagePullPolicy": "IfNotPresent",
        # $(REDIS_PASSWORD) is expanded by the kubelet from the container's environment. The append-only
        # file keeps every write: a restarted Redis gives the GCS its state back.
        "args": ["--requirepass", "$(REDIS_PASSWORD)", "--appendonly", "yes", "--dir", "/data"],
        "env": [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
            "name": options.redis_password_secret, "key": "password", "optional": False}}}],
        "ports": [{"containerPort": REDIS_PORT, "name": "redis"}],
        "resources": resources(1, 2),
        "readinessProbe": {**probe, "initialDelaySeconds": 2},
        "livenessProbe": {**probe, "initialDelaySeconds": 30, "failureThreshold": 6},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": options.namespace, "labels": selector},
        "spec": {"selector": selector, "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": REDIS_PORT}]},
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": options.namespace, "labels": selector},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {**redis_pod(options), "containers": [container]},
            },
            # ReadWriteOnce on the cluster's default class: every cluster's default offers it.
            "volumeClaimTemplates": [{
                "metadata": {"name": "data", "labels": selector},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": f"{options.redis_storage_gi}Gi"}}},
            }],
        },
    }
    return [service, statefulset]
