"""Which Ray demand fits which worker group: the structural guarantee that keeps the reward replicas and
verl apart (:func:`check_placement`, on every render), and each group's Ray node shape as the manifests
declare it (:func:`worker_groups`, :func:`node_shapes`), for anything that rebuilds the cluster elsewhere
(``bench/topology.py`` starts one Ray cluster shaped so on one machine).

Every group is a Ray node type whose ``rayStartParams`` say what it offers; every demand (a scorer
replica, the ingress, a verl placement-group bundle, verl's CPU actors, the job's driver) must fit the
groups meant for it and no other, whatever a group's size. Then neither Ray's scheduler nor the
autoscaler ever has a choice to make between the reward and the trainer groups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deployments.config import AppConfig
from k8s.render.app import application_for, sized_application, sizing_for
from k8s.render.options import VERL_CPUS_PER_GPU_BUNDLE, RenderOptions
from k8s.render.ray_cluster import ray_groups
from k8s.render.verl_job import entrypoint_resources

HEAD = "head"
REWARD_GROUP = "grrm-gpus"
SERVICES_GROUP = "grrm-services"
POLICY_GROUP = "policy-gpus"


@dataclass(frozen=True)
class NodeShape:
    """What one pod of a group offers Ray: its ``rayStartParams`` read as Ray's autoscaler reads them."""

    group: str
    num_cpus: int
    num_gpus: int
    resources: dict[str, int]

    def offers(self, ask: dict[str, float]) -> bool:
        """Whether one such node, empty, holds ``ask`` (Ray resource names: CPU, GPU, custom)."""
        return all(amount <= self.total().get(name, 0) for name, amount in ask.items() if amount > 0)

    def total(self) -> dict[str, int]:
        """All the node's resources by Ray's names."""
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}

    def add_node_kwargs(self) -> dict[str, Any]:
        """The arguments of ``ray.cluster_utils.Cluster.add_node`` (and ``ray start``) for such a node."""
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.resources)}


def node_shape(group: str, params: dict[str, str]) -> NodeShape:
    """A group's :class:`NodeShape` from its ``rayStartParams`` (every group states its CPUs and GPUs: left
    out, Ray would count what the pod can see)."""
    resources: dict[str, int] = {}
    if "resources" in params:
        # KubeRay's form: a JSON object inside escaped quotes ("{\"name\": 1}"), as ray_resources_param writes it.
        resources = json.loads(params["resources"][1:-1].replace("\\", ""))
    return NodeShape(group=group, num_cpus=int(params["num-cpus"]), num_gpus=int(params["num-gpus"]),
                     resources=resources)


def worker_groups(options: RenderOptions | None = None) -> dict[str, dict[str, str]]:
    """Each group's ``rayStartParams`` exactly as the RayService of this render declares them, by group name
    (the head as ``head``)."""
    options = options or RenderOptions()
    sizing = sizing_for(options, sized_application(options))
    return {name: dict(group["rayStartParams"]) for name, group in ray_groups(options, sizing).items()}


def node_shapes(options: RenderOptions | None = None) -> dict[str, NodeShape]:
    """Each group's :class:`NodeShape` for this render, by group name."""
    return {name: node_shape(name, params) for name, params in worker_groups(options).items()}


def demands(application: dict[str, Any]) -> dict[str, tuple[dict[str, float], set[str]]]:
    """Every Ray demand of the cluster: {what: (its ask, the groups it must fit and no other)}."""
    config = AppConfig.model_validate(application.get("args") or {})
    replica = config.placement.serve_options()
    found: dict[str, tuple[dict[str, float], set[str]]] = {
        "a scorer replica": (_ask(replica["ray_actor_options"]), {REWARD_GROUP}),
    }
    for name, settings in (("an ingress replica", config.ingress), ("a ledger replica", config.ledger)):
        found[name] = (_ask(settings.serve_options()["ray_actor_options"]), {SERVICES_GROUP})
    # verl 0.9.1 (verl/single_controller/ray/base.py, RayResourcePool): one STRICT_PACK placement group per
    # node of n_gpus_per_node bundles {"CPU": max_colocate_count (3), "GPU": 1}; its TaskRunner and reward-loop
    # workers are actors asking a CPU; the job's driver asks for the entrypoint resource.
    found["a verl placement-group bundle"] = ({"CPU": VERL_CPUS_PER_GPU_BUNDLE, "GPU": 1}, {POLICY_GROUP})
    found["a verl CPU actor (TaskRunner, reward-loop worker)"] = ({"CPU": 1}, {POLICY_GROUP})
    found["the verl job's driver"] = (json.loads(entrypoint_resources()), {POLICY_GROUP})
    return found


def _ask(actor_options: dict[str, Any]) -> dict[str, float]:
    """A Ray actor's options as the resources it asks a node for."""
    return {"CPU": actor_options.get("num_cpus", 0), "GPU": actor_options.get("num_gpus", 0),
            **actor_options.get("resources", {})}


def check_placement(shapes: dict[str, NodeShape], application: dict[str, Any], replicas_per_worker: int) -> None:
    """Refuse a render where a demand could land on a group not meant for it, or misses its own.

    Structural, not a count of spare CPUs: a reward pod advertises no Ray CPU, so no verl bundle or CPU
    actor fits it at any size, and a replica asks for ``grrm_worker``, which only reward pods advertise.
    """
    for what, (ask, meant) in demands(application).items():
        fits = {name for name, shape in shapes.items() if shape.offers(ask)}
        if fits != meant:
            raise ValueError(
                f"{what} ({_text(ask)}) would fit the groups {sorted(fits) or 'none'}, not only {sorted(meant)}: "
                + ", ".join(f"{name} offers {_text(shape.total())}" for name, shape in shapes.items())
            )
    ask, _ = demands(application)["a scorer replica"]
    reward = shapes[REWARD_GROUP]
    held = min(int(reward.total().get(name, 0) // amount) for name, amount in ask.items() if amount > 0)
    if held != replicas_per_worker:
        raise ValueError(f"a {REWARD_GROUP} pod ({_text(reward.total())}) holds {held} scorer replicas "
                         f"({_text(ask)} each), not replicas_per_worker={replicas_per_worker}")


def _text(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"
