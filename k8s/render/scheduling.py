"""Where Kubernetes may put each pod: tolerations, node selectors and (anti-)affinity, from the options.

* Reward pods pack onto nodes that already hold reward pods (preferred podAffinity), and reward and
  trainer pods never share a node (required podAntiAffinity, written on both sides): 1-GPU reward pods
  spread over the GPU nodes would leave no node whole for an 8-GPU trainer pod.
* CPU pods (head, ``grrm-services``, Redis, the download Job, the job submitter) stay off GPU nodes
  unless ``cpu_pods_on_gpu_nodes``; the two services pods prefer distinct nodes and zones (required with
  ``service_pods_on_distinct_nodes``); Redis prefers a node without the head it keeps the state of.
* Every pod tolerates ``tolerations``, each kind its own list too; node pools by ``*_node_selector``.
"""

from __future__ import annotations

from typing import Any

from k8s.render.kube import labels
from k8s.render.options import RenderOptions, toleration

# The component label of each kind of pod (k8s/render/kube.py `labels`): the affinity rules select by it.
HEAD_COMPONENT = "ray-head"
REWARD_COMPONENT = "reward-worker"
SERVICES_COMPONENT = "reward-services"
POLICY_COMPONENT = "policy-worker"
REDIS_COMPONENT = "redis"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _tolerations(options: RenderOptions, kind: str, gpu: bool) -> list[dict[str, str]]:
    """The GPU taint's toleration (GPU pods), then ``tolerations``, then the kind's own list."""
    own = f"{kind}_tolerations"
    parsed = [toleration(text, "tolerations") for text in options.tolerations]
    parsed += [toleration(text, own) for text in getattr(options, own)]
    return [GPU_TOLERATION, *parsed] if gpu else parsed


def _term(options: RenderOptions, component: str, topology: str) -> dict[str, Any]:
    """A pod (anti-)affinity term: this deployment's pods of one component, in one topology domain."""
    return {"labelSelector": {"matchLabels": labels(options, component)}, "topologyKey": topology}


def _preferred(options: RenderOptions, component: str, topology: str, weight: int) -> dict[str, Any]:
    return {"weight": weight, "podAffinityTerm": _term(options, component, topology)}


def _spec(tolerations: list[dict[str, str]], selector: dict[str, str], affinity: dict[str, Any]) -> dict[str, Any]:
    """The pod spec keys, the empty ones left out."""
    spec: dict[str, Any] = {}
    if tolerations:
        spec["tolerations"] = tolerations
    if selector:
        spec["nodeSelector"] = selector
    if affinity:
        spec["affinity"] = affinity
    return spec


def cpu_pod(options: RenderOptions, pod_affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    """A CPU pod's placement: off GPU nodes (a required DoesNotExist on ``gpu_label_key``) unless
    ``cpu_pods_on_gpu_nodes``, then tolerating the GPU taint; ``cpu_node_selector``; ``pod_affinity``."""
    affinity = dict(pod_affinity or {})
    if not options.cpu_pods_on_gpu_nodes:
        off_gpus = {"matchExpressions": [{"key": options.gpu_label_key, "operator": "DoesNotExist"}]}
        affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [off_gpus]}}, **affinity}
    return _spec(_tolerations(options, "cpu", gpu=options.cpu_pods_on_gpu_nodes), dict(options.cpu_node_selector),
                 affinity)


def _gpu_pod(options: RenderOptions, kind: str, product: str | None, affinity: dict[str, Any]) -> dict[str, Any]:
    selector = {options.gpu_label_key: product} if product else {}
    selector.update(getattr(options, f"{kind}_node_selector"))
    return _spec(_tolerations(options, kind, gpu=True), selector, affinity)


def reward_pod(options: RenderOptions) -> dict[str, Any]:
    """A ``grrm-gpus`` pod's placement: packed with the other reward pods, never beside a trainer pod."""
    affinity: dict[str, Any] = {"podAffinity": {PREFERRED: [_preferred(options, REWARD_COMPONENT, HOSTNAME, 100)]}}
    if not options.share_gpu_nodes:
        affinity["podAntiAffinity"] = {REQUIRED: [_term(options, POLICY_COMPONENT, HOSTNAME)]}
    return _gpu_pod(options, "reward", options.gpu_product, affinity)


def policy_pod(options: RenderOptions) -> dict[str, Any]:
    """A ``policy-gpus`` pod's placement: never beside a reward pod.

    The same rule as on the reward pods: the scheduler checks a pod's required anti-affinity and, for
    the pods already placed, theirs against it, so either side alone would hold. Both sides state it so
    each pod's spec says where it may go, and the cluster autoscaler's simulation sees it from either.
    """
    affinity = {} if options.share_gpu_nodes else {
        "podAntiAffinity": {REQUIRED: [_term(options, REWARD_COMPONENT, HOSTNAME)]}}
    return _gpu_pod(options, "policy", options.policy_gpu_product or options.gpu_product, affinity)


def service_pod(options: RenderOptions) -> dict[str, Any]:
    """A ``grrm-services`` pod's placement: apart from the other services pods (node, then zone)."""
    node = ({REQUIRED: [_term(options, SERVICES_COMPONENT, HOSTNAME)]} if options.service_pods_on_distinct_nodes
            else {PREFERRED: [_preferred(options, SERVICES_COMPONENT, HOSTNAME, 100)]})
    zone = _preferred(options, SERVICES_COMPONENT, ZONE, 50)
    node[PREFERRED] = [*node.get(PREFERRED, []), zone]
    return cpu_pod(options, {"podAntiAffinity": node})


def redis_pod(options: RenderOptions) -> dict[str, Any]:
    """The in-cluster Redis pod's placement: preferably not on the head's node (one node loss would take
    both the GCS and the state it comes back from)."""
    return cpu_pod(options, {"podAntiAffinity": {PREFERRED: [_preferred(options, HEAD_COMPONENT, HOSTNAME, 100)]}})
