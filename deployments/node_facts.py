"""What this machine offers an engine, read without starting one: its GPUs, ``/dev/shm``, the engine
package, the model. The I/O half of the pre-flight (``deployments/preflight.py`` judges the facts).

GPUs are read with ``nvidia-smi`` (the NVIDIA driver's tool, in every GPU container the NVIDIA
container toolkit sets up), not through torch: a CUDA context made here would keep ~0.5 GiB of the
GPU that the engine is about to measure and claim.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from cluster.engines.model_source import ModelNotFoundError, ModelSource, resolve_model
from cluster.engines.versions import InstalledPackage, installed_engine_package

__all__ = ["Gpu", "NodeFacts", "SHM_PATH", "gather_facts", "read_gpus", "read_shm_bytes"]

SHM_PATH = "/dev/shm"
_NVIDIA_SMI_TIMEOUT_S = 20.0
_MIB = 1024**2


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver reports it."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int

    @property
    def free_bytes(self) -> int:
        """Memory no process holds."""
        return self.total_bytes - self.used_bytes


@dataclass(frozen=True)
class NodeFacts:
    """What the checks judge. ``gpus`` are the ones this process may use (``CUDA_VISIBLE_DEVICES``)."""

    gpus: tuple[Gpu, ...]
    gpu_note: str  # how the GPUs were read, or why none were found
    shm_bytes: int | None  # free bytes in /dev/shm (None: no /dev/shm)
    engine_package: InstalledPackage | None
    model: ModelSource | None
    model_error: str | None
    environment: dict[str, str]  # the variables the checks read


def _visible(gpus: list[Gpu], visible: str | None) -> list[Gpu]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves (indices or UUIDs, as CUDA reads it; unset: all)."""
    if visible is None:
        return gpus
    chosen: list[Gpu] = []
    for item in (part.strip() for part in visible.split(",")):
        if not item:
            break  # CUDA stops at the first empty or invalid entry
        match = [gpu for gpu in gpus if str(gpu.index) == item or gpu.uuid == item or gpu.uuid.startswith(item)]
        if not match:
            break
        chosen.append(match[0])
    return chosen


def read_gpus(visible: str | None = None) -> tuple[list[Gpu], str]:
    """The GPUs ``nvidia-smi`` lists, less those ``visible`` (``CUDA_VISIBLE_DEVICES``) hides, and a note."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return [], "nvidia-smi is not on PATH (no NVIDIA driver here)"
    try:
        completed = subprocess.run(
            [tool, "--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], f"nvidia-smi failed ({error})"
    if completed.returncode != 0:
        return [], f"nvidia-smi exited {completed.returncode}: {(completed.stderr or completed.stdout).strip()[:300]}"
    gpus: list[Gpu] = []
    for line in completed.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 5:
            continue
        try:
            gpus.append(Gpu(int(fields[0]), fields[1], fields[2], int(float(fields[3]) * _MIB),
                            int(float(fields[4]) * _MIB)))
        except ValueError:
            continue
    shown = _visible(gpus, visible)
    note = f"nvidia-smi lists {len(gpus)}"
    if visible is not None:
        note += f", CUDA_VISIBLE_DEVICES={visible!r} leaves {len(shown)}"
    return shown, note


def read_shm_bytes(path: str = SHM_PATH) -> int | None:
    """Free bytes in the shared-memory file system (None where there is none)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def gather_facts(engine_kind: str, model: str, *, environment_names: tuple[str, ...] = ()) -> NodeFacts:
    """Read this machine's facts for an engine of ``engine_kind`` on ``model`` (a resolved path or hub id;
    empty for the scripted engine). ``environment_names``: variables the checks read (tokens)."""
    gpus, note = read_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    source: ModelSource | None = None
    error: str | None = None
    if model:
        try:
            source = resolve_model(model)
        except ModelNotFoundError as problem:
            error = str(problem)
    return NodeFacts(
        gpus=tuple(gpus),
        gpu_note=note,
        shm_bytes=read_shm_bytes(),
        engine_package=installed_engine_package(engine_kind),
        model=source,
        model_error=error,
        environment={name: os.environ[name] for name in environment_names if name in os.environ},
    )
