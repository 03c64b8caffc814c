"""The GPUs this machine's NVIDIA driver lists, read with ``nvidia-smi``, as CUDA will see them.

Read by the pre-flight (``deployments/node_facts.py``) and by the vLLM engine before it falls back to
its CPU settings. Not through torch: a CUDA context made here would keep ~0.5 GiB of the GPU that the
engine is about to measure and claim, and torch on a too-old driver sees no GPU at all.

MIG: a GPU in MIG mode is no CUDA device itself; its MIG devices are (``nvidia-smi -L`` lists them).
Their size is their profile's (``3g.40gb``: 40 GB); nvidia-smi's GPU query does not report what each
one holds, so a MIG device counts as free. ``CUDA_VISIBLE_DEVICES`` may name MIG devices (``MIG-<uuid>``);
a GPU index or uuid naming a MIG-mode GPU stands for its first MIG device, the one a CUDA process
given that GPU enumerates.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["GPU_QUERY", "Gpu", "GpuReading", "read_gpus"]

# The one query the pre-flight asks nvidia-smi (the simulated stand-in answers exactly these fields).
GPU_QUERY = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version", "mig.mode.current")
_NVIDIA_SMI_TIMEOUT_S = 20.0
_MIB = 1024**2
# A MIG profile names its memory in decimal GB: 1g.10gb, 3g.40gb, 1c.3g.20gb, 1g.10gb+me.
_PROFILE_GB = re.compile(r"(\d+)gb")
_GPU_LINE = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as the driver reports it: a whole GPU, or a MIG device of one."""

    index: int  # the GPU's index (a MIG device's: its GPU's)
    uuid: str  # GPU-... or, for a MIG device, MIG-...
    name: str
    total_bytes: int
    used_bytes: int
    mig_profile: str | None = None  # a MIG device's profile (3g.40gb); None for a whole GPU

    @property
    def free_bytes(self) -> int:
        """Memory no process holds."""
        return self.total_bytes - self.used_bytes


class GpuReading(NamedTuple):
    """What ``nvidia-smi`` said: the CUDA devices this process may use, how they were read, the driver."""

    gpus: list[Gpu]
    note: str  # how the GPUs were read, or why none were found
    driver_version: str | None
    failure: str | None = None  # nvidia-smi is there but failed (its words); None when it answered or is absent


def _run(tool: str, *args: str) -> tuple[str | None, str]:
    """nvidia-smi's output, or None and why it failed."""
    try:
        completed = subprocess.run([tool, *args], capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S,
                                   check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"nvidia-smi failed ({error})"
    if completed.returncode != 0:
        return None, (f"nvidia-smi exited {completed.returncode}: "
                      f"{(completed.stderr or completed.stdout).strip()[:300]}")
    return completed.stdout, ""


def _mig_devices(listing: str, gpus: dict[int, Gpu]) -> dict[int, list[Gpu]]:
    """Each MIG-mode GPU's MIG devices, from ``nvidia-smi -L``."""
    devices: dict[int, list[Gpu]] = {}
    parent: Gpu | None = None
    for line in listing.splitlines():
        if match := _GPU_LINE.match(line):
            parent = gpus.get(int(match.group(1)))
        elif (match := _MIG_LINE.match(line)) and parent is not None:
            profile, uuid = match.groups()
            size = _PROFILE_GB.search(profile)
            total = int(size.group(1)) * 10**9 if size else parent.total_bytes
            devices.setdefault(parent.index, []).append(
                Gpu(parent.index, uuid, f"{parent.name} MIG {profile}", total, 0, mig_profile=profile))
    return devices


def _visible(gpus: list[Gpu], migs: dict[int, list[Gpu]], visible: str | None) -> list[Gpu]:
    """The CUDA devices ``CUDA_VISIBLE_DEVICES`` leaves (indices or uuids, as CUDA reads it; unset: all)."""

    def as_device(gpu: Gpu) -> Gpu | None:
        if gpu.index in migs:  # a MIG-mode GPU: its first MIG device, or nothing where none was made
            return migs[gpu.index][0] if migs[gpu.index] else None
        return gpu

    if visible is None:
        return [device for gpu in gpus if (device := as_device(gpu)) is not None]
    every_mig = [device for devices in migs.values() for device in devices]
    chosen: list[Gpu] = []
    for item in (part.strip() for part in visible.split(",")):
        if item.startswith("MIG-"):
            match = [device for device in every_mig if device.uuid.startswith(item)]
        else:
            match = [gpu for gpu in gpus if str(gpu.index) == item or (item.startswith("GPU-")
                                                                         and gpu.uuid.startswith(item))]
            match = [device for gpu in match if (device := as_device(gpu)) is not None]
        if not item or not match:
            break  # CUDA stops at the first empty or invalid entry
        chosen.append(match[0])
    return chosen


def read_gpus(visible: str | None = None) -> GpuReading:
    """The CUDA devices ``nvidia-smi`` lists, less those ``visible`` (``CUDA_VISIBLE_DEVICES``) hides."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return GpuReading([], "nvidia-smi is not on PATH (no NVIDIA driver here)", None)
    output, error = _run(tool, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits")
    if output is None:
        return GpuReading([], error, None, error)
    gpus: list[Gpu] = []
    mig_mode: set[int] = set()
    driver: str | None = None
    for line in output.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 5:
            continue
        try:
            gpu = Gpu(int(fields[0]), fields[1], fields[2], int(float(fields[3]) * _MIB), int(float(fields[4]) * _MIB))
        except ValueError:
            continue
        gpus.append(gpu)
        driver = driver or (fields[5] if len(fields) > 5 and fields[5][:1].isdigit() else None)
        if len(fields) > 6 and fields[6] == "Enabled":
            mig_mode.add(gpu.index)
    migs: dict[int, list[Gpu]] = {}
    note = f"nvidia-smi lists {len(gpus)}"
    if mig_mode:
        listing, error = _run(tool, "-L")
        migs = _mig_devices(listing or "", {gpu.index: gpu for gpu in gpus if gpu.index in mig_mode})
        migs = {index: migs.get(index, []) for index in mig_mode}
        note += f", {len(mig_mode)} in MIG mode with {sum(len(devices) for devices in migs.values())} MIG device(s)"
    shown = _visible(gpus, migs, visible)
    if visible is not None:
        note += f", CUDA_VISIBLE_DEVICES={visible!r} leaves {len(shown)}"
    return GpuReading(shown, note, driver)
