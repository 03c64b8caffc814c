"""What this machine offers an engine, read without starting one: its GPUs and driver, ``/dev/shm``, the
engine package and torch's build, the model and the hub cache. The I/O half of the pre-flight
(``deployments/preflight.py`` judges the facts).

GPUs are read with ``nvidia-smi`` (``cluster/engines/gpu_devices.py``), packages from their metadata:
nothing here imports torch or makes a CUDA context.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cluster.engines.gpu_devices import Gpu, read_gpus
from cluster.engines.model_source import (ModelNotFoundError, ModelSource, hub_cache_dir, hub_offline, is_hub_id,
                                          resolve_model)
from cluster.engines.versions import InstalledPackage, TorchBuild, installed_engine_package, installed_torch_build

__all__ = ["Gpu", "HubCache", "NodeFacts", "SHM_PATH", "SHM_STAND_IN_ENV", "gather_facts", "read_gpus",
           "read_hub_cache", "read_shm_bytes"]

SHM_PATH = "/dev/shm"
# The node-fleet rehearsal (simulated/node_fleet.py) stands in a container's small /dev/shm with this
# variable (free bytes): a 64 MB tmpfs cannot be mounted where the tests run. Not a setting: unset, as
# everywhere else, /dev/shm is measured.
SHM_STAND_IN_ENV = "GRRM_STAND_IN_SHM_BYTES"


@dataclass(frozen=True)
class HubCache:
    """The hub cache a hub-id model is read from (and downloaded into), and whether this user may write it."""

    path: str
    writable: bool
    why_not: str  # why it is not writable ("" when it is)
    user: str  # who asked: ``uid 1000``
    offline: bool  # HF_HUB_OFFLINE: the engine's start neither asks the hub nor writes the cache


@dataclass(frozen=True)
class NodeFacts:
    """What the checks judge. ``gpus`` are the CUDA devices this process may use (``CUDA_VISIBLE_DEVICES``)."""

    gpus: tuple[Gpu, ...]
    gpu_note: str  # how the GPUs were read, or why none were found
    shm_bytes: int | None  # free bytes in /dev/shm (None: no /dev/shm)
    engine_package: InstalledPackage | None
    model: ModelSource | None
    model_error: str | None
    environment: dict[str, str]  # the variables the checks read
    driver_version: str | None = None  # the NVIDIA driver (None: not read)
    torch_build: TorchBuild | None = None  # None: torch is not installed
    hub_cache: HubCache | None = None  # None: the model is no hub id (a directory, the tiny model, none)
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as set (None: unset)
    gpu_failure: str | None = None  # nvidia-smi is there and failed (a broken driver), in its words


def read_shm_bytes(path: str = SHM_PATH) -> int | None:
    """Free bytes in the shared-memory file system (None where there is none)."""
    stand_in = os.environ.get(SHM_STAND_IN_ENV)
    if stand_in is not None and path == SHM_PATH:
        return int(stand_in)
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _why_not_writable(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "a read-only file system"
        info = path.stat()
    except OSError as error:
        return error.strerror or str(error)
    return f"owned by uid {info.st_uid}, mode {stat.filemode(info.st_mode)}"


def read_hub_cache() -> HubCache:
    """The hub cache as the environment names it now, and whether this user can write there (or create
    it: the nearest directory that exists must then be writable). Asks ``access(2)``, which knows
    read-only mounts and, over NFS, the server's view; writes nothing."""
    path = hub_cache_dir()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    writable = existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)
    why_not = "" if writable else _why_not_writable(existing)
    if not writable and existing != path:
        why_not = f"it does not exist and {existing} cannot be written: {why_not}"
    return HubCache(str(path), writable, why_not, f"uid {os.getuid()}", hub_offline())


def gather_facts(engine_kind: str, model: str, *, environment_names: tuple[str, ...] = ()) -> NodeFacts:
    """Read this machine's facts for an engine of ``engine_kind`` on ``model`` (a resolved path or hub id;
    empty for the scripted engine). ``environment_names``: variables the checks read (tokens)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    reading = read_gpus(visible)
    source: ModelSource | None = None
    error: str | None = None
    if model:
        try:
            source = resolve_model(model)
        except ModelNotFoundError as problem:
            error = str(problem)
    return NodeFacts(
        gpus=tuple(reading.gpus),
        gpu_note=reading.note,
        shm_bytes=read_shm_bytes(),
        engine_package=installed_engine_package(engine_kind),
        model=source,
        model_error=error,
        environment={name: os.environ[name] for name in environment_names if name in os.environ},
        driver_version=reading.driver_version,
        torch_build=installed_torch_build() if engine_kind != "scripted" else None,
        hub_cache=read_hub_cache() if is_hub_id(model) else None,
        visible_devices=visible,
        gpu_failure=reading.failure,
    )
