"""scripts/setup_gpu_env.sh, the GPU install for a node without Kubernetes, without a GPU or CUDA wheels here:
it refuses a node without NVIDIA's driver or with one older than the lock's CUDA needs (a stand-in
``nvidia-smi`` on PATH reports the driver), its install commands are the image's (the service lock,
hash-checked, ``--no-deps``; the project ``--no-deps``), and that lock resolves, complete, for the image's
platform (uv against PyPI: the lock's own versions and nothing more, for Linux x86_64 and Python 3.11)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.engines.versions import DRIVER_FLOORS, GPU_INSTALL_CUDA_MAJOR

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "setup_gpu_env.sh"
LOCK = ROOT / "requirements" / "image-service.lock.txt"
FLOOR = DRIVER_FLOORS[GPU_INSTALL_CUDA_MAJOR]


def path_without_nvidia_smi() -> str:
    """This PATH less any folder holding a real nvidia-smi (a GPU machine running the suite)."""
    return os.pathsep.join(folder for folder in os.environ["PATH"].split(os.pathsep)
                           if not (Path(folder) / "nvidia-smi").exists())


def setup(tmp_path: Path, driver: str | None, *args: str) -> subprocess.CompletedProcess:
    """Run the script with a stand-in nvidia-smi reporting ``driver`` (None: no nvidia-smi at all)."""
    path = path_without_nvidia_smi()
    if driver is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        stand_in = bin_dir / "nvidia-smi"
        stand_in.write_text(f"#!/bin/sh\nprintf '{driver}\\n{driver}\\n'\n")  # two GPUs, one driver
        stand_in.chmod(0o755)
        path = f"{bin_dir}{os.pathsep}{path}"
    env = {**os.environ, "PATH": path, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), "--venv", str(tmp_path / "venv"), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)


def test_a_node_without_nvidia_smi_is_refused_and_pointed_to_the_cpu_install(tmp_path):
    run = setup(tmp_path, None, "--dry-run")
    assert run.returncode == 1
    assert "REFUSED: nvidia-smi is not on PATH" in run.stderr and "scripts/setup_env.sh" in run.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("driver", ["535.183.01", "550.127.05", "570.86.15"])
def test_a_driver_older_than_the_locks_cuda_needs_is_refused_before_anything_is_installed(tmp_path, driver):
    run = setup(tmp_path, driver, "--dry-run")
    assert run.returncode == 1, run.stderr
    branch = driver.split(".")[0]
    assert f"REFUSED: NVIDIA driver {driver} (R{branch}) is older than R{FLOOR}" in run.stderr
    assert f"upgrade the node's driver to R{FLOOR} or later" in run.stderr
    assert "pip install" not in run.stderr and not (tmp_path / "venv").exists()


def test_the_install_commands_are_the_images_the_lock_hash_checked_without_deps_then_the_project(tmp_path):
    run = setup(tmp_path, "580.95.05", "--dry-run")
    assert run.returncode == 0, run.stderr
    assert f"NVIDIA driver 580.95.05 (R580; CUDA {GPU_INSTALL_CUDA_MAJOR} needs R{FLOOR} or later)" in run.stderr
    commands = [line.removeprefix("[setup-gpu] ") for line in run.stderr.splitlines()
                if re.match(r"\[setup-gpu\] \S*uv ", line)]
    venv_python = str(tmp_path / "venv" / "bin" / "python")
    assert len(commands) == 3, run.stderr
    assert " venv " in commands[0] and commands[0].endswith(str(tmp_path / "venv"))
    lock = commands[1].split()
    assert lock[1:3] == ["pip", "install"] and lock[-2:] == ["-r", "requirements/image-service.lock.txt"]
    assert {"--require-hashes", "--no-deps"} <= set(lock) and venv_python in lock
    project = commands[2].split()
    assert project[-2:] == ["-e", "."] and "--no-deps" in project and venv_python in project
    assert "none ran" in run.stderr and not (tmp_path / "venv").exists()


def test_the_service_lock_resolves_complete_for_the_images_platform(tmp_path):
    """uv resolves the lock's pins, dependencies included, for Linux x86_64 (manylinux 2.28) and Python 3.11:
    the result is the lock itself, so installing it with --no-deps leaves nothing missing. Needs PyPI (uv
    reads the packages' metadata, not their wheels; seconds)."""
    uv = subprocess.run(["bash", "-c", "source scripts/uv.sh >&2 && echo $UV"], capture_output=True, text=True,
                        cwd=ROOT, timeout=300)
    assert uv.returncode == 0, uv.stderr
    resolved = tmp_path / "resolved.txt"
    run = subprocess.run([uv.stdout.strip(), "pip", "compile", "--quiet", "--python-version", "3.11",
                          "--python-platform", "x86_64-manylinux_2_28", "--no-header", "--no-annotate",
                          str(LOCK), "-o", str(resolved)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr

    def pins(text: str) -> set[str]:
        return {line.split(" ")[0].lower() for line in text.splitlines() if re.match(r"^[A-Za-z0-9][^ ]*==", line)}

    locked, found = pins(LOCK.read_text()), pins(resolved.read_text())
    assert len(locked) > 200 and "torch==2.13.0" in locked and "vllm==0.32.0" in locked
    assert found == locked, {"not in the lock": sorted(found - locked), "not resolved": sorted(locked - found)}
