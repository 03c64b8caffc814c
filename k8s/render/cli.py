"""The command line: ``python -m k8s.render`` writes the manifests, ``--check`` compares them."""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

from k8s.render.manifests import render
from k8s.render.options import RenderOptions

K8S_DIR = Path(__file__).resolve().parents[1]
DESCRIPTION = "Render the KubeRay manifests of the reward cluster (and the verl job that shares its Ray cluster)."
# A command-line flag per option (the others keep their defaults), with its help text.
FLAGS = {
    "name": "RayService name",
    "namespace": "namespace of every object",
    "model": "engine.model (default: deployments/grrm.yaml's)",
    "tensor_parallel_size": "engine.tensor_parallel_size (default: grrm.yaml's)",
    "min_replicas": "Serve autoscaling min_replicas (default: grrm.yaml's)",
    "max_replicas": "Serve autoscaling max_replicas (default: grrm.yaml's)",
    "replicas_per_worker": "Serve replicas per reward worker pod",
    "gpu_label_key": "node label that names the GPU type",
    "gpu_product": "its value for the reward workers ('' = no nodeSelector)",
    "image": "image of the head and the reward workers (project + vLLM)",
    "trainer_image": "image of the policy workers (project + verl)",
    "ray_version": "Ray version in both images",
    "hf_token_secret": "Secret (key `token`) with the Hugging Face token",
    "api_token_secret": "Secret (key `token`) with the HTTP bearer token",
    "policy_nodes": "trainer nodes (verl trainer.nnodes)",
    "policy_min_nodes": "trainer nodes kept up (default 0: the job's entrypoint wakes one)",
    "policy_gpus_per_node": "GPUs per trainer node (verl trainer.n_gpus_per_node)",
    "policy_gpu_product": "GPU type of the trainer nodes (default: --gpu-product)",
    "policy_model": "the policy checkpoint verl trains",
    "rollout_n": "rollouts per prompt (the GRPO group size)",
    "rollout_tp": "tensor parallel size of the policy's vLLM rollout",
    "trainer_data_pvc": "PVC mounted at /data on trainer nodes ('' = none)",
    "train_files": "verl data.train_files",
    "val_files": "verl data.val_files",
    "job_name": "RayJob name",
    "ray_cluster_name": "RayCluster for the RayJob's clusterSelector",
    "upgrade_strategy": "RayService upgradeStrategy.type",
    "redis_address": "Redis of GCS fault tolerance (default: one rendered in the cluster, redis.yaml; '' = off)",
    "redis_password_secret": "Secret (key `password`) with that Redis's password",
    "redis_image": "image of the in-cluster Redis",
    "service_pods": "grrm-services pods (= ingress and ledger replicas, one of each per pod)",
    "model_cache_pvc": "PVC (ReadWriteMany) mounted at /models (weights, vLLM's compile cache), filled once by "
                       "model-cache.yaml's Job ('' = none)",
    "model_cache_storage_class": "storage class of that PVC, one that mounts ReadWriteMany (required; default: a "
                                 "placeholder for envsubst '$GRRM_RWX_STORAGE_CLASS')",
    "model_cache_host_path": "a node path holding the cache instead of a PVC",
    "model_cache_gi": "size of the weights cache (GiB)",
    "model_cache_fix_permissions": "a root init container makes the cache's directories writable by gid 100",
    "hf_offline": "pods never ask the hub (HF_HUB_OFFLINE=1; on by default): the weights must be in the cache first",
    "tolerations": "taints every pod tolerates, comma-separated key[=value][:Effect] (e.g. dedicated=grrm:NoSchedule)",
    "cpu_tolerations": "taints the CPU pods (head, services, Redis, download Job, job submitter) tolerate too",
    "reward_tolerations": "taints the reward pods tolerate too",
    "policy_tolerations": "taints the trainer pods tolerate too",
    "cpu_node_selector": "node labels the CPU pods require, comma-separated key=value",
    "reward_node_selector": "node labels the reward pods require (with the GPU product's), key=value,...",
    "policy_node_selector": "node labels the trainer pods require (with the GPU product's), key=value,...",
    "cpu_pods_on_gpu_nodes": "let the CPU pods run on GPU nodes (a cluster of GPU nodes only)",
    "share_gpu_nodes": "let reward and trainer pods share a node (no anti-affinity between them)",
    "service_pods_on_distinct_nodes": "require the grrm-services pods on distinct nodes (default: preferred)",
}
# Options whose '' means None (no such object).
EMPTY_MEANS_NONE = ("trainer_data_pvc", "model_cache_pvc", "model_cache_storage_class", "model_cache_host_path")
ALIASES = {"tensor_parallel_size": ["--tp"]}


def write(files: dict[str, str], out: Path) -> None:
    """Write the files into ``out`` (scripts executable)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)


def check(files: dict[str, str], out: Path) -> list[str]:
    """File names whose committed text differs from the fresh render (missing counts)."""
    stale = []
    for name, text in files.items():
        path = out / name
        if not path.is_file() or path.read_text() != text:
            stale.append(name)
    return stale


def parse_args(argv: list[str] | None = None) -> tuple[RenderOptions, argparse.Namespace]:
    """The options (a flag per :data:`FLAGS` entry, typed as its :class:`RenderOptions` field) and
    the output arguments."""
    parser = argparse.ArgumentParser(prog="python -m k8s.render", description=DESCRIPTION)
    parser.add_argument("--out", type=Path, default=K8S_DIR, help="output directory (default: k8s/)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the files in --out differ from a fresh render")
    types = typing.get_type_hints(RenderOptions)
    for key, text in FLAGS.items():
        flag = f"--{key.replace('_', '-')}"
        kind = _value_type(types[key])
        if kind is bool:  # --flag / --no-flag
            parser.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, *ALIASES.get(key, []), dest=key, type=kind, default=None, help=text)
    args = parser.parse_args(argv)
    values = {key: getattr(args, key) for key in FLAGS if getattr(args, key) is not None}
    for key in EMPTY_MEANS_NONE:
        if values.get(key) == "":
            values[key] = None
    return RenderOptions(**values), args


def _value_type(hint: Any) -> Any:
    """What a flag's text converts with: the field's type, ``X`` for ``X | None``, a comma-separated list for
    a tuple, ``key=value,...`` for a dict."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        return _items
    if origin is dict:
        return _labels
    (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
    return kind


def _items(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _labels(text: str) -> dict[str, str]:
    result = {}
    for item in _items(text):
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise argparse.ArgumentTypeError(f"{item!r} is not key=value")
        result[key] = value
    return result


def main(argv: list[str] | None = None) -> int:
    """Render into ``--out`` (or compare with ``--check``); the exit status."""
    options, args = parse_args(argv)
    try:
        files = render(options)
    except ValueError as error:
        print(f"render: {error}", file=sys.stderr)
        return 2
    if args.check:
        stale = check(files, args.out)
        if stale:
            print(
                "k8s manifests are stale (re-render with `python -m k8s.render`): " + ", ".join(stale), file=sys.stderr
            )
            return 1
        print(f"k8s manifests up to date ({len(files)} files in {args.out})")
        return 0
    write(files, args.out)
    print(f"rendered {len(files)} files into {args.out}")
    return 0
