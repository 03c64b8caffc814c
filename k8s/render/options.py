"""What a render depends on: :class:`RenderOptions` (defaults = the committed manifests), and the
combinations of options that would deploy but misbehave (:func:`check_options`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k8s.render.app import Sizing

# verl's placement-group bundle: {"CPU": max_colocate_count=3, "GPU": 1} per GPU (k8s/render/placement.py).
VERL_CPUS_PER_GPU_BUNDLE = 3
UPGRADE_STRATEGIES = ("NewCluster", "NewClusterWithIncrementalUpgrade", "None")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# kubectl taint's form: key[=value][:Effect] (no effect: every effect).
_TOLERATION = re.compile(r"(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)(=(?P<value>[-A-Za-z0-9_.]*))?(:(?P<effect>\w+))?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_REDIS_ADDRESS = re.compile(r"(rediss?://([^@/\s]+@)?)?[^:/@\s]+:\d+/?")
# RWX storage classes of the big clouds, for the message of a render that names none.
RWX_STORAGE_CLASSES = (
    "GKE: `standard-rwx` (Filestore; also premium-rwx, enterprise-rwx; the Filestore CSI driver enabled)",
    "AKS: `azurefile-csi` (or azurefile-csi-premium)",
    "EKS: an EFS class you create (provisioner efs.csi.aws.com, often named `efs-sc`)",
    "elsewhere: an NFS or CephFS class",
)


@dataclass(frozen=True)
class RenderOptions:
    """Everything a render depends on. ``None`` for model / TP / replica range: deployments/grrm.yaml's."""

    name: str = "grrm"
    namespace: str = "grrm"
    model: str | None = None
    tensor_parallel_size: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    # Serve replicas per reward worker pod (the pod gets TP x gpus_per_rank x this many GPUs).
    replicas_per_worker: int = 1
    gpu_label_key: str = "nvidia.com/gpu.product"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    image: str = "grrm-cluster:0.1.0-vllm"
    trainer_image: str = "grrm-cluster:0.1.0-verl"
    ray_version: str = "2.60.0"
    hf_token_secret: str = "hf-token"
    api_token_secret: str = "grrm-api-token"
    # Head pod (CPU only: it runs GCS, the dashboard, the autoscaler, the Serve controller).
    head_cpus: int = 4
    head_memory_gi: int = 16
    # Reward worker pod sizing beyond what Ray accounts for the replicas.
    worker_extra_cpus_per_gpu: int = 2
    worker_memory_gi_per_gpu: int = 32
    worker_base_memory_gi: int = 16
    # Where the weights live (HF_HOME=/models/hf): a PersistentVolumeClaim that outlives pods, filled once
    # by the model-download Job (model-cache.yaml), so a new replica pod loads ~15 GB from it instead of
    # downloading them; or a path on each node (filled by the first pod there); '' for both: an emptyDir
    # per pod (every pod downloads).
    model_cache_pvc: str | None = "grrm-model-cache"
    # Required with the PVC: most clusters' default class cannot mount ReadWriteMany, and a claim it
    # cannot provision waits forever. The default is a placeholder for `envsubst '$GRRM_RWX_STORAGE_CLASS'`
    # (the API server refuses it unsubstituted), like ray_cluster_name.
    model_cache_storage_class: str | None = "${GRRM_RWX_STORAGE_CLASS}"
    model_cache_host_path: str | None = None
    model_cache_gi: int = 100
    # A root init container gives the image's group (users, 100) write access to the cache's directories
    # on pods that mount it (fsGroup alone does not reach NFS, nor a hostPath). Off where Pod Security
    # forbids root containers: then make the volume writable by gid 100 yourself (README, Weights).
    model_cache_fix_permissions: bool = True
    # Pods never ask the hub (HF_HUB_OFFLINE=1): the weights must be in the cache already (the download
    # Job fills it; it alone asks the hub). A new pod then starts from the cache without a round trip.
    hf_offline: bool = True
    # /dev/shm per trainer GPU (verl's FSDP ranks and its vLLM rollout's TP ranks pass tensors through it).
    policy_shm_gi_per_gpu: int = 2
    worker_idle_timeout_s: int = 300
    # The policy (trainer) worker group.
    policy_nodes: int = 1
    # Trainer nodes kept up. 0 by default: a trainer node has no Serve replica, so it is never
    # "Ready" (see README), and a RayCluster created with one never reaches the state a RayJob
    # waits for. The job's entrypoint resource wakes one node; patch more up before a bigger job.
    policy_min_nodes: int = 0
    policy_gpus_per_node: int = 8
    policy_gpu_product: str | None = None  # None: gpu_product
    policy_cpus_per_gpu: int = 8
    policy_memory_gi_per_gpu: int = 48
    policy_idle_timeout_s: int = 600
    trainer_data_pvc: str | None = "verl-data"
    # The verl job (its hyperparameters: k8s/render/verl_job.yaml).
    policy_model: str = "Qwen/Qwen2.5-7B-Instruct"
    rollout_n: int = 8
    rollout_tp: int = 2
    train_files: str = "/data/grrm-mt/train.parquet"
    val_files: str = "/data/grrm-mt/test.parquet"
    job_name: str = "verl-grpo-grrm"
    # The RayService's active RayCluster: its name has a generated suffix, so the default is a
    # placeholder for `envsubst '$GRRM_RAY_CLUSTER'` (see README).
    ray_cluster_name: str = "${GRRM_RAY_CLUSTER}"
    upgrade_strategy: str = "NewCluster"
    # GCS fault tolerance: the head's GCS keeps its state in this Redis, so a head failure does
    # not restart the workers (their replicas keep serving while the head comes back). None: a Redis
    # rendered in the cluster (redis.yaml: one pod with an append-only file on a volume, so a first
    # deploy works); a redis:// address: one of yours (production: a highly available one); '': off.
    redis_address: str | None = None
    redis_password_secret: str = "grrm-redis"
    redis_image: str = "redis:7.4"
    redis_storage_gi: int = 1
    # Scheduling (README, Scheduling). Extra taints the pods tolerate, in kubectl taint's form
    # `key[=value][:Effect]` (no effect: every effect; no value: any value), e.g. `dedicated=grrm:NoSchedule`:
    # on every pod, or on one kind. The GPU pods tolerate nvidia.com/gpu already.
    tolerations: tuple[str, ...] = ()
    cpu_tolerations: tuple[str, ...] = ()  # head, grrm-services, Redis, the download Job, the job submitter
    reward_tolerations: tuple[str, ...] = ()
    policy_tolerations: tuple[str, ...] = ()
    # Node labels each kind of pod requires (node pools), e.g. {"cloud.google.com/gke-nodepool": "cpu-pool"}.
    cpu_node_selector: dict[str, str] = field(default_factory=dict)
    reward_node_selector: dict[str, str] = field(default_factory=dict)
    policy_node_selector: dict[str, str] = field(default_factory=dict)
    # The CPU pods stay off GPU nodes (nodes labelled gpu_label_key), where they would take a trainer's
    # CPUs and memory. True (a cluster of GPU nodes only): they may run there, tolerating the GPU taint.
    cpu_pods_on_gpu_nodes: bool = False
    # Reward and trainer pods never share a node (required anti-affinity): 1-GPU reward pods spread over
    # the GPU nodes would leave no node whole for an 8-GPU trainer pod. True: they may (one GPU node
    # split between the two, with policy_gpus_per_node below its GPUs).
    share_gpu_nodes: bool = False
    # The grrm-services pods on distinct nodes: preferred by default (a cluster with one CPU node still
    # starts both); True requires it (as many CPU nodes as service_pods), so a node loss takes one.
    service_pods_on_distinct_nodes: bool = False
    # CPU pods of their own for the ingress and the ledger: one replica of each per pod, so losing
    # a pod (or its node) loses one replica of each, never both.
    service_pods: int = 2
    service_cpus: int = 2
    service_memory_gi: int = 4


def check_options(options: RenderOptions, sizing: Sizing) -> None:
    """Refuse combinations that deploy but misbehave.

    Not here: whether verl's per-node placement group could take a reward pod. That is structural
    (k8s/render/placement.py, checked on every render): a reward pod offers no Ray CPU and each bundle asks
    for 3, so a reward pod of any size (replicas_per_worker up to policy_gpus_per_node and beyond) is safe.
    """
    if options.policy_nodes < 1 or options.policy_gpus_per_node < 1:
        raise ValueError("policy_nodes and policy_gpus_per_node must be >= 1 (verl's trainer.nnodes, n_gpus_per_node)")
    if not 0 <= options.policy_min_nodes <= options.policy_nodes:
        raise ValueError(f"policy_min_nodes must be in [0, policy_nodes={options.policy_nodes}]")
    if options.policy_gpus_per_node % options.rollout_tp:
        raise ValueError(
            f"policy_gpus_per_node ({options.policy_gpus_per_node}) is not a multiple of "
            f"rollout_tp ({options.rollout_tp})"
        )
    if options.upgrade_strategy not in UPGRADE_STRATEGIES:
        raise ValueError(f"upgrade_strategy: {options.upgrade_strategy!r} is not a RayService upgrade type")
    if options.model_cache_pvc and options.model_cache_host_path:
        raise ValueError("model_cache_pvc and model_cache_host_path: choose one cache for the weights")
    if options.hf_offline and not (options.model_cache_pvc or options.model_cache_host_path):
        raise ValueError("hf_offline (on by default): pods that never ask the hub need the weights in a cache that "
                         "outlives them (model_cache_pvc or model_cache_host_path); with neither, every pod downloads "
                         "its weights: render with --no-hf-offline")
    check_storage_class(options)
    if options.redis_address and not _REDIS_ADDRESS.fullmatch(options.redis_address):
        raise ValueError(f"redis_address: {options.redis_address!r} is not redis://host:port (or rediss://, "
                         "host:port); '' turns GCS fault tolerance off, leaving it out renders a Redis")
    for name in ("tolerations", "cpu_tolerations", "reward_tolerations", "policy_tolerations"):
        for text in getattr(options, name):
            toleration(text, name)
    if len(options.name) > 47:
        raise ValueError("name: a RayService name is at most 47 characters (KubeRay adds a 6-character suffix)")


def check_storage_class(options: RenderOptions) -> None:
    """The weights cache's PVC names a storage class, and one Kubernetes accepts (or the envsubst placeholder)."""
    if not options.model_cache_pvc:
        return
    storage_class = options.model_cache_storage_class
    if not storage_class:
        raise ValueError(
            "model_cache_storage_class: the weights cache PVC needs a storage class that mounts ReadWriteMany "
            "(most clusters' default class cannot, and the claim then waits forever); name one of yours, e.g. "
            + "; ".join(RWX_STORAGE_CLASSES)
        )
    if storage_class != RenderOptions.model_cache_storage_class and not _DNS_SUBDOMAIN.fullmatch(storage_class):
        raise ValueError(f"model_cache_storage_class: {storage_class!r} is not a storage class name")


def toleration(text: str, option: str = "tolerations") -> dict[str, str]:
    """A Kubernetes toleration from kubectl taint's form ``key[=value][:Effect]`` (``option`` names the setting
    in errors): no value tolerates any value (Exists), no effect every effect."""
    match = _TOLERATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{option}: {text!r} is not key[=value][:Effect] (e.g. dedicated=grrm:NoSchedule)")
    effect = match.group("effect")
    if effect is not None and effect not in TAINT_EFFECTS:
        raise ValueError(f"{option}: {text!r} has effect {effect!r}, not one of {', '.join(TAINT_EFFECTS)}")
    result = {"key": match.group("key")}
    if match.group("value") is None:
        result["operator"] = "Exists"
    else:
        result.update(operator="Equal", value=match.group("value"))
    if effect is not None:
        result["effect"] = effect
    return result
