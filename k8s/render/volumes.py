"""The volumes an engine pod needs: the weights cache at ``/models/hf`` (``HF_HOME``) and a memory-backed
``/dev/shm``; and ``model-cache.yaml``: the cache's PersistentVolumeClaim and the Job that fills it once."""

from __future__ import annotations

import shlex
from typing import Any

from k8s.render.kube import labels, secret_env
from k8s.render.options import RenderOptions

MODEL_CACHE_PATH = "/models/hf"
MODEL_CACHE_VOLUME = "model-cache"
SHM_VOLUME = "dshm"
DOWNLOAD_JOB = "grrm-model-download"


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
    return [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH}, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]


def model_cache_claim(options: RenderOptions) -> dict[str, Any]:
    """The PVC every engine pod mounts: ReadWriteMany, since reward and trainer pods on many nodes read it."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": f"{options.model_cache_gi}Gi"}},
    }
    if options.model_cache_storage_class:
        spec["storageClassName"] = options.model_cache_storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": options.model_cache_pvc, "namespace": options.namespace,
                     "labels": labels(options, "model-cache")},
        "spec": spec,
    }


def model_download_job(options: RenderOptions, models: list[str]) -> dict[str, Any]:
    """A Job that downloads the models into the PVC once (the service image carries the `hf` command)."""
    script = " && ".join(f"hf download {shlex.quote(model)}" for model in models)
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
                    "containers": [{
                        "name": "download",
                        "image": options.image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["bash", "-c", script],
                        # The download itself needs the hub, whatever the pods' hf_offline says.
                        "env": [variable for variable in hf_env(options) if variable["name"] != "HF_HUB_OFFLINE"],
                        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
                        "volumeMounts": [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH}],
                    }],
                    "volumes": [model_cache_volume(options)],
                },
            },
        },
    }
