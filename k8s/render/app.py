"""The Serve application the RayService runs: deployments/grrm.yaml's, with the render's model,
tensor parallel size and replica range applied (one source of truth), and the reward worker pods
sized for it (:class:`Sizing`)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster.engines.memory import GIB, shared_memory_bytes
from deployments.config import AppConfig, find_application
from k8s.render.kube import SERVE_PORT
from k8s.render.options import RenderOptions

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIG = PROJECT_ROOT / "deployments" / "grrm.yaml"
APP_NAME = "grrm"
# Advertised by the grrm-services pods only; the ingress and the ledger ask for one unit each.
SERVICE_RESOURCE = "grrm_service"
# Advertised by the grrm-gpus pods only, one unit per replica slot; each scorer replica asks for one.
GRRM_RESOURCE = "grrm_worker"
# A 0-CPU actor gets OMP_NUM_THREADS=1 from Ray anyway (ray._private.utils.set_omp_num_threads_if_unset),
# and 1 is what vLLM serves with (vllm.utils.torch_utils.set_torch_threads_for_runtime): said here so the
# replica's environment does not hang on a Ray default. The engine's work is on the GPU, in its own processes.
REPLICA_ENV = {"OMP_NUM_THREADS": "1"}


def load_serve_config(path: Path = SERVE_CONFIG) -> dict[str, Any]:
    """The production Serve config (deployments/grrm.yaml) as a dict."""
    return yaml.safe_load(path.read_text())


def grrm_application(serve_config: dict[str, Any]) -> dict[str, Any]:
    """The reward application's entry in a Serve config."""
    return find_application(serve_config, APP_NAME)


def sized_application(options: RenderOptions, serve_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """deployments/grrm.yaml's application with the render's model / TP / replica range applied: what the
    reward pods are sized for (:func:`sizing_for`)."""
    serve_config = load_serve_config() if serve_config is None else serve_config
    application = copy.deepcopy(grrm_application(serve_config))
    args = application.setdefault("args", {})
    engine = args.setdefault("engine", {})
    if options.model is not None:
        engine["model"] = options.model
    if options.tensor_parallel_size is not None:
        engine["tensor_parallel_size"] = options.tensor_parallel_size
    if options.min_replicas is not None or options.max_replicas is not None:
        replicas = args.setdefault("replicas", {})
        fixed = replicas.pop("num_replicas", None)
        autoscaling = replicas.setdefault("autoscaling", {})
        if fixed is not None:
            autoscaling.setdefault("min_replicas", fixed)
            autoscaling.setdefault("max_replicas", fixed)
        if options.min_replicas is not None:
            autoscaling["min_replicas"] = options.min_replicas
        if options.max_replicas is not None:
            autoscaling["max_replicas"] = options.max_replicas
    return application


def application_for(options: RenderOptions, serve_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The application the RayService runs: :func:`sized_application`, each deployment pinned to its group.

    A scorer replica asks for no Ray CPU and one ``grrm_worker``: only a ``grrm-gpus`` pod offers that, and
    those pods offer no Ray CPU, so no trainer actor or placement-group bundle (verl's ask for CPUs) fits
    there, and no replica fits anywhere else. The pod keeps its real CPUs in its container's quota.
    """
    application = sized_application(options, serve_config)
    args = application["args"]
    replicas = args.setdefault("replicas", {})
    asked = replicas.get("resources") or {}
    if set(asked) - {GRRM_RESOURCE}:
        raise ValueError(
            f"replicas.resources: {sorted(asked)} are not offered by the reward pods (they advertise only "
            f"{GRRM_RESOURCE!r}, which the render asks for itself): drop them from deployments/grrm.yaml"
        )
    replicas["num_cpus"] = 0
    replicas["resources"] = {GRRM_RESOURCE: 1}
    replicas["env_vars"] = {**REPLICA_ENV, **(replicas.get("env_vars") or {})}
    for service in ("ingress", "ledger"):
        # On the grrm-services pods, one per pod: never on the head, a reward pod or a trainer pod.
        args[service] = {
            "num_replicas": options.service_pods,
            "num_cpus": 0,
            "resources": {SERVICE_RESOURCE: 1},
            "max_replicas_per_node": 1,
        }
    return application


def serve_config_for(options: RenderOptions, serve_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole serveConfigV2: grrm.yaml's proxy/HTTP options (host 0.0.0.0) and its applications."""
    serve_config = load_serve_config() if serve_config is None else serve_config
    rendered: dict[str, Any] = {}
    rendered["proxy_location"] = serve_config.get("proxy_location", "EveryNode")
    http_options = dict(serve_config.get("http_options") or {})
    http_options["host"] = "0.0.0.0"  # reachable from the Kubernetes Services, not only localhost
    http_options["port"] = SERVE_PORT
    rendered["http_options"] = http_options
    for key, value in serve_config.items():
        if key not in ("proxy_location", "http_options", "applications"):
            rendered[key] = copy.deepcopy(value)
    applications = []
    for application in serve_config.get("applications") or []:
        if application.get("name") == APP_NAME:
            applications.append(application_for(options, serve_config))
        else:
            applications.append(copy.deepcopy(application))
    rendered["applications"] = applications
    return rendered


@dataclass(frozen=True)
class Sizing:
    """What one reward worker pod holds, derived from the application and the options."""

    tensor_parallel_size: int
    gpus_per_replica: int
    replicas_per_worker: int
    gpus_per_worker: int
    container_cpus: int
    memory_gi: int
    min_replicas: int
    max_replicas: int
    min_workers: int
    max_workers: int
    shm_gi: int  # a reward pod's memory-backed /dev/shm
    app_name: str
    replica_deployment: str
    model: str


def sizing_for(options: RenderOptions, application: dict[str, Any]) -> Sizing:
    """Validate the application (as AppConfig) and size the reward worker group for it.

    ``application``: grrm.yaml's with the render's sizes (:func:`sized_application`), not yet pinned to the
    groups: its ``replicas.num_cpus`` is what a replica's process needs, which the pod's container gets.
    """
    config = AppConfig.model_validate(application.get("args") or {})
    replicas = config.replicas
    if replicas.autoscaling is not None:
        low, high = replicas.autoscaling.min_replicas, replicas.autoscaling.max_replicas
        initial = replicas.autoscaling.initial_replicas
        if initial is not None and not low <= initial <= high:
            raise ValueError(f"autoscaling.initial_replicas ({initial}) is outside [{low}, {high}]")
    else:
        low = high = replicas.num_replicas or 1
    if config.placement.executor == "ray":
        raise ValueError(
            "engine.distributed_executor_backend: 'ray' lets a replica's ranks span pods; these manifests "
            "give each reward pod whole replicas (single-node ranks): use 'auto' or 'mp'"
        )
    gpus = config.gpus_per_replica
    if gpus <= 0:
        raise ValueError("replicas.gpus_per_rank is 0: the Kubernetes manifests are for GPU replicas")
    if options.replicas_per_worker < 1:
        raise ValueError(f"replicas_per_worker must be >= 1, got {options.replicas_per_worker}")
    gpus_per_worker = gpus * options.replicas_per_worker
    if gpus_per_worker != int(gpus_per_worker):
        raise ValueError(
            f"a worker pod would hold {gpus_per_worker} GPUs (gpus_per_rank x TP x replicas_per_worker): "
            "nvidia.com/gpu must be a whole number"
        )
    gpus_per_worker = int(gpus_per_worker)
    # The replicas' own CPUs (grrm.yaml's num_cpus, which Ray is not asked for here) and vLLM's processes.
    replica_cpus = max(1, math.ceil(replicas.num_cpus * options.replicas_per_worker))
    # What the replicas' parallel ranks pass through it (the pre-flight's figure), at least 1 GiB.
    shm_gi = max(1, math.ceil(shared_memory_bytes(config.engine.ranks) * options.replicas_per_worker / GIB))
    return Sizing(
        tensor_parallel_size=config.engine.tensor_parallel_size,
        gpus_per_replica=int(gpus) if gpus == int(gpus) else gpus,
        replicas_per_worker=options.replicas_per_worker,
        gpus_per_worker=gpus_per_worker,
        container_cpus=replica_cpus + options.worker_extra_cpus_per_gpu * gpus_per_worker,
        # A memory-backed /dev/shm counts against the pod's memory.
        memory_gi=options.worker_base_memory_gi + options.worker_memory_gi_per_gpu * gpus_per_worker + shm_gi,
        min_replicas=low,
        max_replicas=high,
        min_workers=math.ceil(low / options.replicas_per_worker),
        max_workers=math.ceil(high / options.replicas_per_worker),
        shm_gi=shm_gi,
        app_name=APP_NAME,
        replica_deployment=config.replica_deployment_name,
        model=config.engine.model,
    )
