"""The volumes an engine pod needs: the cache volume at ``/models`` (the weights in ``/models/hf``, ``HF_HOME``;
vLLM's compile cache in ``/models/vllm-cache``, ``VLLM_CACHE_ROOT``) and a memory-backed ``/dev/shm``; the
pod settings that let the image's user write the cache; and ``model-cache.yaml``: the cache's
PersistentVolumeClaim and the Job that fills it once."""

from __future__ import annotations

import shlex
from typing import Any

from k8s.render.kube import labels, resources, secret_env
from k8s.render.options import RenderOptions
from k8s.render.scheduling import cpu_pod

CACHE_MOUNT = "/models"
MODEL_CACHE_PATH = f"{CACHE_MOUNT}/hf"
# vLLM's compile cache (torch.compile's graphs, Inductor's and Triton's kernels) under a directory named by
# vLLM's own hash of its version, the model config, its code, torch and the GPU: pods of one image share it,
# so only the first pod of a shape compiles.
VLLM_CACHE_PATH = f"{CACHE_MOUNT}/vllm-cache"
MODEL_CACHE_VOLUME = "model-cache"
SHM_VOLUME = "dshm"
DOWNLOAD_JOB = "grrm-model-download"
# The images' user is ray (uid 1000) in group users (gid 100): docker/Dockerfile.
IMAGE_GID = 100
# Directories of the cache the pods write: the volume's root, the hub cache, vLLM's compile cache.
CACHE_DIRECTORIES = (CACHE_MOUNT, MODEL_CACHE_PATH, VLLM_CACHE_PATH)


def hf_env(options: RenderOptions) -> list[dict[str, Any]]:
    """The hub's variables: the token (optional: public checkpoints need none; gated ones fail with a
    clear 401), the cache, and offline mode."""
    env = [
        secret_env("HF_TOKEN", options.hf_token_secret, optional=True),
        secret_env("HUGGING_FACE_HUB_TOKEN", options.hf_token_secret, optional=True),
        {"name": "HF_HOME", "value": MODEL_CACHE_PATH},
    ]
    if options.hf_offline:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    return env


def engine_env(options: RenderOptions) -> list[dict[str, Any]]:
    """An engine pod's cache variables: the hub's (:func:`hf_env`) and vLLM's compile cache on the volume."""
    return [*hf_env(options), {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_PATH}]


def model_cache_volume(options: RenderOptions) -> dict[str, Any]:
    """The weights cache: the shared PVC, a node path, or (neither) an emptyDir that dies with its pod."""
    if options.model_cache_pvc:
        return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": options.model_cache_pvc}}
    if options.model_cache_host_path:
        return {"name": MODEL_CACHE_VOLUME, "hostPath": {"path": options.model_cache_host_path,
                                                          "type": "DirectoryOrCreate"}}
    return {"name": MODEL_CACHE_VOLUME, "emptyDir": {"sizeLimit": f"{options.model_cache_gi}Gi"}}


def shm_volume(size_gi: int) -> dict[str, Any]:
    """A memory-backed /dev/shm: a container's own is 64 MB, and vLLM's multiprocess executor passes every
    step to its TP ranks through shared memory (NCCL's intra-node transport keeps buffers there too)."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{size_gi}Gi"}}


def engine_volume_mounts() -> list[dict[str, Any]]:
    """Where an engine container mounts the two volumes."""
    return [cache_mount(), {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]


def cache_mount() -> dict[str, Any]:
    return {"name": MODEL_CACHE_VOLUME, "mountPath": CACHE_MOUNT}


def cache_pod_settings(options: RenderOptions, image: str) -> dict[str, Any]:
    """Pod spec keys that let the image's user (uid 1000, gid 100) write the cache: ``fsGroup`` 100 (applied
    by the volume types that support it, re-owning a volume only while its root's group differs), and,
    unless ``model_cache_fix_permissions`` is off or the cache is an ``emptyDir`` (writable by all), a root
    init container that makes the cache's directories group-writable.

    The init container is safe to run on every start: it touches three directories, not their contents
    (no recursive walk of 100 GB), and grants write to group 100 only, which every pod of this deployment
    runs in. It cannot help where root is squashed (an NFS export's default); it then says so and the
    download Job stops with the fix (README, Weights).
    """
    spec: dict[str, Any] = {"securityContext": {"fsGroup": IMAGE_GID, "fsGroupChangePolicy": "OnRootMismatch"}}
    if options.model_cache_fix_permissions and (options.model_cache_pvc or options.model_cache_host_path):
        directories = " ".join(CACHE_DIRECTORIES)
        steps = (
            f'for d in {directories}; do mkdir -p "$d" && chgrp {IMAGE_GID} "$d" && chmod 2775 "$d" || echo '
            f'"cache-permissions: cannot give group {IMAGE_GID} write access to $d (root squashed on an NFS export?): '
            'see k8s/README.md, Weights"; done'
        )
        spec["initContainers"] = [{
            "name": "cache-permissions",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["bash", "-c", steps],
            "securityContext": {"runAsUser": 0, "runAsGroup": 0},
            "resources": resources("100m", 1),
            "volumeMounts": [cache_mount()],
        }]
    return spec


def model_cache_claim(options: RenderOptions) -> dict[str, Any]:
    """The PVC every engine pod mounts: ReadWriteMany, since reward and trainer pods on many nodes read it."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        # Required (options.check_storage_class): the cluster's default class rarely mounts ReadWriteMany.
        "storageClassName": options.model_cache_storage_class,
        "resources": {"requests": {"storage": f"{options.model_cache_gi}Gi"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": options.model_cache_pvc, "namespace": options.namespace,
                     "labels": labels(options, "model-cache")},
        "spec": spec,
    }


def model_download_job(options: RenderOptions, models: list[str]) -> dict[str, Any]:
    """A Job that downloads the models into the PVC once (the service image carries the `hf` command),
    after checking it may write there."""
    unwritable = (
        f'echo "{DOWNLOAD_JOB}: {MODEL_CACHE_PATH} is not writable by uid $(id -u) (groups $(id -G)): make the '
        f'volume writable by group {IMAGE_GID} (k8s/README.md, Weights)" >&2; exit 1'
    )
    script = " && ".join([f"{{ test -w {MODEL_CACHE_PATH} || {{ {unwritable}; }}; }}",
                          *(f"hf download {shlex.quote(model)}" for model in models)])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": DOWNLOAD_JOB, "namespace": options.namespace, "labels": labels(options, "model-cache")},
        "spec": {
            "backoffLimit": 4,
            "template": {
                "metadata": {"labels": labels(options, "model-cache")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    **cache_pod_settings(options, options.image),
                    **cpu_pod(options),
                    "containers": [{
                        "name": "download",
                        "image": options.image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["bash", "-c", script],
                        # The download itself needs the hub, whatever the pods' hf_offline says.
                        "env": [variable for variable in hf_env(options) if variable["name"] != "HF_HUB_OFFLINE"],
                        "resources": resources(2, 8),
                        "volumeMounts": [cache_mount()],
                    }],
                    "volumes": [model_cache_volume(options)],
                },
            },
        },
    }
