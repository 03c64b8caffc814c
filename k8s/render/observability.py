"""Observability: a headless Service over every Ray pod's metrics port, and a Prometheus scrape
job for it (a ConfigMap)."""

from __future__ import annotations

from typing import Any

from k8s.render.kube import METRICS_PORT, labels, to_yaml
from k8s.render.options import RenderOptions

RAY_NODE_LABEL = "ray.io/is-ray-node"


def metrics_service(options: RenderOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{options.name}-ray-metrics",
            "namespace": options.namespace,
            "labels": labels(options, "metrics"),
        },
        "spec": {
            # Headless: one endpoint per Ray pod (head, reward and trainer workers, both clusters
            # during a blue/green upgrade), for Prometheus' endpoints discovery.
            "clusterIP": "None",
            # KubeRay's label on every Ray pod (not Redis, the download Job or the job submitter, which
            # carry this deployment's labels and export no metrics); stable across cluster renames.
            "selector": {**labels(options), RAY_NODE_LABEL: "yes"},
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"}],
        },
    }


def prometheus_config(options: RenderOptions) -> dict[str, Any]:
    service = f"{options.name}-ray-metrics"
    scrape = {
        "scrape_configs": [
            {
                "job_name": f"{options.name}-ray",
                "scrape_interval": "15s",
                "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [options.namespace]}}],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_service_name"], "regex": service, "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics", "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    {"source_labels": ["__meta_kubernetes_pod_label_ray_io_cluster"], "target_label": "ray_io_cluster"},
                    {"source_labels": ["__meta_kubernetes_pod_label_ray_io_group"], "target_label": "ray_io_group"},
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_ray_io_node_type"],
                        "target_label": "ray_io_node_type",
                    },
                ],
            }
        ]
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{options.name}-prometheus-scrape",
            "namespace": options.namespace,
            "labels": labels(options, "metrics"),
        },
        "data": {"grrm-ray-scrape.yml": to_yaml(scrape)},
    }
