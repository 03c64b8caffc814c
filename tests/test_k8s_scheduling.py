"""Where Kubernetes puts the rendered pods: a model of kube-scheduler's filters, fed the rendered manifests.

The model (:class:`Scheduler`) implements what the pods' placement depends on: taints and tolerations,
nodeSelector, required node affinity, CPU and GPU requests, required pod anti-affinity (the incoming
pod's and, symmetrically, the placed pods'), and scores preferred pod (anti-)affinity. Ties go to the
node with the most free GPUs, then CPUs: kube-scheduler's default LeastAllocated scoring, which
spreads pods, the behaviour the affinities must overcome. It is a model, not kube-scheduler; it tests
that the rendered rules say what k8s/README.md (Scheduling) says they do, for clusters of the shapes
users run: a CPU node and two 8-GPU nodes, GPU nodes only, a tainted dedicated pool, node pools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from k8s import render as k8s_render

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


@dataclass
class Node:
    name: str
    cpus: float
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labels = {"kubernetes.io/hostname": self.name, "topology.kubernetes.io/zone": "zone-a", **self.labels}


@dataclass
class Pod:
    name: str
    labels: dict[str, str]
    spec: dict[str, Any]

    def requests(self, resource: str) -> float:
        total = 0.0
        for container in self.spec["containers"]:
            value = str(container.get("resources", {}).get("requests", {}).get(resource, "0"))
            total += float(value[:-1]) / 1000 if value.endswith("m") else float(value)
        return total


def cpu_node(name: str, **extra: Any) -> Node:
    return Node(name, cpus=32, **extra)


def gpu_node(name: str, tainted: bool = True, **extra: Any) -> Node:
    labels = {PRODUCT: H100, **extra.pop("labels", {})}
    return Node(name, cpus=224, gpus=8, labels=labels, taints=[GPU_TAINT] if tainted else [], **extra)


def _tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, taint["effect"]):
            continue
        if toleration.get("key") not in (None, taint["key"]):
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value") == taint.get("value"):
            return True
    return False


def _matches_expression(labels: dict[str, str], expression: dict[str, Any]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    return {
        "In": lambda: labels.get(key) in values,
        "NotIn": lambda: labels.get(key) not in values,
        "Exists": lambda: key in labels,
        "DoesNotExist": lambda: key not in labels,
    }[operator]()


def _selects(term: dict[str, Any], pod: Pod) -> bool:
    return term["labelSelector"]["matchLabels"].items() <= pod.labels.items()


class Scheduler:
    """Places pods one at a time on the feasible node with the best score, as kube-scheduler would."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.placed: dict[str, tuple[Pod, Node]] = {}

    def free(self, node: Node, resource: str) -> float:
        capacity = node.gpus if resource == GPU else node.cpus
        return capacity - sum(pod.requests(resource) for pod, where in self.placed.values() if where is node)

    def _pods_in_domain(self, node: Node, topology: str) -> list[Pod]:
        return [pod for pod, where in self.placed.values() if where.labels.get(topology) == node.labels.get(topology)]

    def feasible(self, pod: Pod, node: Node) -> bool:
        spec = pod.spec
        if any(taint["effect"] in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations", []), taint)
               for taint in node.taints):
            return False
        if not spec.get("nodeSelector", {}).items() <= node.labels.items():
            return False
        affinity = spec.get("affinity", {})
        required_nodes = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        if required_nodes and not any(all(_matches_expression(node.labels, expression)
                                          for expression in term.get("matchExpressions", []))
                                      for term in required_nodes["nodeSelectorTerms"]):
            return False
        if pod.requests(GPU) > self.free(node, GPU) or pod.requests("cpu") > self.free(node, "cpu"):
            return False
        for term in affinity.get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []):
            if any(_selects(term, other) for other in self._pods_in_domain(node, term["topologyKey"])):
                return False
        # Symmetry: a placed pod's required anti-affinity keeps this pod out of its domain too.
        for other, where in self.placed.values():
            for term in other.spec.get("affinity", {}).get("podAntiAffinity", {}).get(
                    "requiredDuringSchedulingIgnoredDuringExecution", []):
                if _selects(term, pod) and where.labels.get(term["topologyKey"]) == node.labels.get(term["topologyKey"]):
                    return False
        return True

    def score(self, pod: Pod, node: Node) -> tuple[float, float, float]:
        affinity = pod.spec.get("affinity", {})
        preference = 0.0
        for kind, sign in (("podAffinity", 1), ("podAntiAffinity", -1)):
            for weighted in affinity.get(kind, {}).get("preferredDuringSchedulingIgnoredDuringExecution", []):
                term = weighted["podAffinityTerm"]
                if any(_selects(term, other) for other in self._pods_in_domain(node, term["topologyKey"])):
                    preference += sign * weighted["weight"]
        return preference, self.free(node, GPU), self.free(node, "cpu")

    def place(self, pod: Pod) -> Node | None:
        candidates = [node for node in self.nodes if self.feasible(pod, node)]
        if not candidates:
            return None
        best = max(candidates, key=lambda node: self.score(pod, node))
        self.placed[pod.name] = (pod, best)
        return best

    def remove(self, name: str) -> None:
        del self.placed[name]

    def where(self, prefix: str | tuple[str, ...]) -> list[str]:
        """The nodes of the placed pods whose names start with ``prefix``."""
        return [node.name for name, (_, node) in self.placed.items() if name.startswith(prefix)]


def pods_of(options: k8s_render.RenderOptions, reward_pods: int = 8) -> dict[str, list[Pod]]:
    """Every pod a render creates, by kind (the reward group at ``reward_pods`` pods)."""
    files = {name: [doc for doc in yaml.safe_load_all(text) if doc]
             for name, text in k8s_render.render(options).items() if name.endswith(".yaml")}
    (rayservice,) = files["rayservice-grrm.yaml"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = {group["groupName"]: group for group in cluster["workerGroupSpecs"]}

    def pods(kind: str, template: dict[str, Any], count: int = 1) -> list[Pod]:
        return [Pod(f"{kind}-{index}", template["metadata"]["labels"], template["spec"]) for index in range(count)]

    result = {
        "head": pods("head", cluster["headGroupSpec"]["template"]),
        "services": pods("services", groups["grrm-services"]["template"], groups["grrm-services"]["replicas"]),
        "reward": pods("reward", groups["grrm-gpus"]["template"], reward_pods),
        "policy": pods("policy", groups["policy-gpus"]["template"], 1),
        "submitter": pods("submitter", files["verl-job.yaml"][0]["spec"]["submitterPodTemplate"]),
    }
    if "redis.yaml" in files:
        result["redis"] = pods("redis", files["redis.yaml"][1]["spec"]["template"])
    if "model-cache.yaml" in files:
        result["download"] = pods("download", files["model-cache.yaml"][1]["spec"]["template"])
    return result


CPU_KINDS = ("head", "services", "redis", "download", "submitter")


def place_all(scheduler: Scheduler, pods: dict[str, list[Pod]], order: tuple[str, ...]) -> list[str]:
    """Place the pods kind by kind; the names of those left pending."""
    return [pod.name for kind in order for pod in pods.get(kind, []) if scheduler.place(pod) is None]


def test_reward_pods_pack_and_leave_a_whole_node_for_the_trainer() -> None:
    scheduler = Scheduler([cpu_node("cpu-1"), gpu_node("gpu-a"), gpu_node("gpu-b")])
    pods = pods_of(k8s_render.RenderOptions(), reward_pods=8)
    # The reward pool scales up one pod at a time, then the trainer's pod comes.
    assert place_all(scheduler, pods, (*CPU_KINDS, "reward", "policy")) == []
    assert len(set(scheduler.where("reward"))) == 1
    assert scheduler.where("policy") != scheduler.where("reward")[:1]
    assert set(scheduler.where(CPU_KINDS)) == {"cpu-1"}


def test_without_the_affinities_the_spread_leaves_no_node_for_the_trainer() -> None:
    """The manifests before: the scheduler's default spreading puts 1-GPU pods on both nodes."""
    scheduler = Scheduler([gpu_node("gpu-a"), gpu_node("gpu-b")])
    pods = pods_of(k8s_render.RenderOptions(), reward_pods=2)
    for pod in [*pods["reward"], *pods["policy"]]:
        pod.spec = {key: value for key, value in pod.spec.items() if key != "affinity"}
    assert place_all(scheduler, pods, ("reward", "policy")) == ["policy-0"]
    assert sorted(scheduler.where("reward")) == ["gpu-a", "gpu-b"]


def test_reward_pods_never_join_a_trainer_node_and_scale_back_onto_the_free_one() -> None:
    # A 4-GPU trainer pod on an 8-GPU node: 4 GPUs stay free beside it.
    scheduler = Scheduler([gpu_node("gpu-a"), gpu_node("gpu-b")])
    pods = pods_of(k8s_render.RenderOptions(policy_gpus_per_node=4), reward_pods=10)
    (trainer,) = pods["policy"]
    assert scheduler.place(trainer) is not None
    # The pool outgrows the other node: the last two wait (for a node the cluster autoscaler adds), never
    # taking the trainer node's free GPUs.
    assert place_all(scheduler, pods, ("reward",)) == ["reward-8", "reward-9"]
    assert set(scheduler.where("reward")) == {"gpu-a", "gpu-b"} - set(scheduler.where("policy"))
    # Trainer gone, the pool scales down and up again: still one node, the other left whole.
    scheduler.remove(trainer.name)
    for pod in pods["reward"][2:8]:
        scheduler.remove(pod.name)
    for pod in pods["reward"][2:8]:
        scheduler.place(pod)
    assert len(set(scheduler.where("reward"))) == 1
    assert scheduler.place(trainer) is not None


def test_share_gpu_nodes_lets_one_node_hold_both() -> None:
    node = gpu_node("gpu-a")
    for share, pending in ((False, ["policy-0"]), (True, [])):
        scheduler = Scheduler([node])
        pods = pods_of(k8s_render.RenderOptions(share_gpu_nodes=share, policy_gpus_per_node=4), reward_pods=4)
        assert place_all(scheduler, pods, ("reward", "policy")) == pending, share


def test_cpu_pods_stay_off_untainted_gpu_nodes_unless_asked() -> None:
    # Untainted GPU nodes and a CPU node: the CPU pods go to the CPU node although the GPU nodes have room.
    scheduler = Scheduler([gpu_node("gpu-a", tainted=False), cpu_node("cpu-1"), gpu_node("gpu-b", tainted=False)])
    pods = pods_of(k8s_render.RenderOptions())
    assert place_all(scheduler, pods, CPU_KINDS) == []
    assert set(scheduler.where(CPU_KINDS)) == {"cpu-1"}
    # A cluster of tainted GPU nodes only: nothing CPU-only starts, until the render lets it.
    only_gpus = [gpu_node("gpu-a"), gpu_node("gpu-b")]
    assert place_all(Scheduler(only_gpus), pods, CPU_KINDS) == [pod.name for kind in CPU_KINDS for pod in pods[kind]]
    allowed = pods_of(k8s_render.RenderOptions(cpu_pods_on_gpu_nodes=True))
    assert place_all(Scheduler(only_gpus), allowed, (*CPU_KINDS, "reward", "policy")) == []


def test_a_dedicated_tainted_pool_needs_the_tolerations_option() -> None:
    dedicated = {"key": "dedicated", "value": "grrm", "effect": "NoSchedule"}
    nodes = [cpu_node("cpu-1", taints=[dedicated]), gpu_node("gpu-a"), gpu_node("gpu-b")]
    nodes[1].taints.append(dedicated)
    nodes[2].taints.append(dedicated)
    kinds = (*CPU_KINDS, "reward", "policy")
    pods = pods_of(k8s_render.RenderOptions(), reward_pods=2)
    assert len(place_all(Scheduler(nodes), pods, kinds)) == sum(len(pods[kind]) for kind in kinds)
    tolerated = pods_of(k8s_render.RenderOptions(tolerations=("dedicated=grrm:NoSchedule",)), reward_pods=2)
    assert place_all(Scheduler(nodes), tolerated, kinds) == []
    # One kind only: the reward pods' own list.
    own = pods_of(k8s_render.RenderOptions(reward_tolerations=("dedicated",)), reward_pods=2)
    assert set(place_all(Scheduler(nodes), own, kinds)) == {pod.name for kind in kinds if kind != "reward"
                                                             for pod in own[kind]}


def test_node_pools_by_label() -> None:
    nodes = [cpu_node("cpu-1", labels={"pool": "system"}), cpu_node("cpu-2", labels={"pool": "grrm-cpu"}),
             gpu_node("gpu-a", labels={"pool": "reward"}), gpu_node("gpu-b", labels={"pool": "train"})]
    options = k8s_render.RenderOptions(cpu_node_selector={"pool": "grrm-cpu"}, reward_node_selector={"pool": "reward"},
                                       policy_node_selector={"pool": "train"})
    scheduler = Scheduler(nodes)
    assert place_all(scheduler, pods_of(options, reward_pods=8), (*CPU_KINDS, "policy", "reward")) == []
    assert set(scheduler.where(CPU_KINDS)) == {"cpu-2"}
    assert set(scheduler.where("reward")) == {"gpu-a"} and scheduler.where("policy") == ["gpu-b"]


def test_services_pods_spread_over_nodes_and_redis_avoids_the_head() -> None:
    scheduler = Scheduler([cpu_node("cpu-1"), cpu_node("cpu-2")])
    pods = pods_of(k8s_render.RenderOptions())
    assert place_all(scheduler, pods, ("head", "services", "redis")) == []
    assert sorted(scheduler.where("services")) == ["cpu-1", "cpu-2"]
    assert scheduler.where("redis") != scheduler.where("head")
    # Preferred by default: one CPU node still starts both; required leaves the second pending.
    assert place_all(Scheduler([cpu_node("cpu-1")]), pods, ("services",)) == []
    required = pods_of(k8s_render.RenderOptions(service_pods_on_distinct_nodes=True))
    assert place_all(Scheduler([cpu_node("cpu-1")]), required, ("services",)) == ["services-1"]


@pytest.mark.parametrize("text", ["dedicated=grrm:NoSchedule", "dedicated:NoExecute", "dedicated=grrm", "dedicated"])
def test_tolerations_are_written_as_kubernetes_reads_them(text: str) -> None:
    from k8s.render.options import toleration

    parsed = toleration(text)
    taint = {"key": "dedicated", "value": "grrm", "effect": parsed.get("effect", "NoSchedule")}
    assert _tolerates([parsed], taint)
    assert not _tolerates([parsed], {**taint, "key": "other"})


@pytest.mark.parametrize(("text", "message"), [("dedicated=grrm:Never", "effect 'Never'"), ("=x", "key")])
def test_bad_tolerations_are_refused_naming_the_option(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"cpu_tolerations: .*{message}"):
        k8s_render.render(k8s_render.RenderOptions(cpu_tolerations=(text,)))


def test_cli_takes_the_scheduling_options(tmp_path) -> None:
    argv = ["--tolerations", "dedicated=grrm:NoSchedule,spot", "--cpu-node-selector", "pool=cpu,tier=system",
            "--share-gpu-nodes", "--out", str(tmp_path)]
    assert k8s_render.main(argv) == 0
    (rayservice,) = yaml.safe_load_all((tmp_path / "rayservice-grrm.yaml").read_text())
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"pool": "cpu", "tier": "system"}
    assert head["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "grrm", "effect": "NoSchedule"},
                                   {"key": "spot", "operator": "Exists"}]
    (reward, _, policy) = [group["template"]["spec"] for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
    assert "podAntiAffinity" not in reward["affinity"] and "affinity" not in policy
    with pytest.raises(SystemExit) as error:
        k8s_render.main(["--cpu-node-selector", "pool", "--out", str(tmp_path)])
    assert error.value.code == 2
