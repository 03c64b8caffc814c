"""TEST SUPPORT: one Ray head of our own, shared by the reward service and a verl trainer.

``ray start --head --block`` in its own process group, with free ports, its own temp dir, a
fake GPU (verl's resource pools always ask for GPUs) and more logical CPUs than the machine
has (verl's placement groups and TransferQueue actors reserve CPUs they barely use). It is
stopped by its PID (SIGTERM makes ``--block`` take down every process it started; SIGKILL of the
group after a grace period), never with ``ray stop``, which would stop other Ray instances on
the machine too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["RAY_ENV", "RayHead", "free_port"]

# Environment of the head and of every process that connects to it. Ray 2.60 turns on token
# authentication when it finds ~/.ray/auth_token (written by other Ray tools on the machine), and
# then refuses drivers that do not send the token: this private loopback cluster opts out.
RAY_ENV: dict[str, str] = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RayHead:
    """A single-node Ray cluster started and stopped by this object (a context manager)."""

    def __init__(self, *, num_cpus: int = 16, num_gpus: int = 1, env: dict[str, str] | None = None):
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.env = dict(env or {})
        self.port = free_port()
        # Unix socket paths live under the temp dir and must stay short (108 bytes).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="grrm-ray-", dir="/tmp"))
        self.process: subprocess.Popen | None = None
        self.log_path = self.temp_dir / "ray-start.log"

    @property
    def address(self) -> str:
        """The GCS address other processes pass to ``ray.init(address=...)``."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> RayHead:
        """Start the head and wait until a driver can connect."""
        ray = str(Path(sys.executable).with_name("ray"))
        command = [
            ray, "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--num-cpus={self.num_cpus}", f"--num-gpus={self.num_gpus}",
            f"--temp-dir={self.temp_dir}", "--include-dashboard=false", f"--dashboard-port={free_port()}",
            f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ]
        environment = {**os.environ, **self.env, **RAY_ENV}
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        probe = [sys.executable, "-c", f"import ray; ray.init(address='{self.address}', log_to_driver=False)"]
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.process.returncode}: {self.log_path.read_text()[-2000:]}")
            if subprocess.run(probe, capture_output=True, timeout=60, env=environment).returncode == 0:
                return self
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"the Ray head at {self.address} did not come up in {timeout_s} s")

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop every process the head started (by PID, process group and session), then remove its temp dir.

        SIGTERM first (``--block`` then stops what it started); with actors still running that can
        take minutes, so after ``grace_s`` the head's process group (raylet, GCS, every worker and
        the engine processes they spawned) is killed outright: nothing of it is worth keeping.
        Ray starts some workers in process groups of their own, and a vLLM engine process started
        by such a worker outlives it (orphaned, ~1.7 GiB each); they all stay in the head's session
        (the head is started with ``start_new_session``), so whatever is left in it is killed too.
        """
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if process is not None:
            _kill_group(process)
            _kill_session(process.pid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> RayHead:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _session_members(session: int) -> list[int]:
    """The live (not zombie) processes of ``session``, this process excluded."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            if os.getsid(pid) != session:
                continue
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            members.append(pid)
    return members


def _kill_session(session: int, timeout_s: float = 10.0) -> None:
    """SIGKILL every process left in ``session`` (the head's, of which it was the leader) until none is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        members = _session_members(session)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _kill_group(leader: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGKILL every process of ``leader``'s process group and wait until none is left."""
    group = leader.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    leader.wait()  # reaped: a zombie leader would keep the group alive
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, signal.SIGKILL)  # stragglers, until their parents are gone and they are reaped
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)
