"""No engine process outlives its replica: a watcher process kills them once the replica is gone.

An engine's processes (vLLM's engine core and its ``mp`` TP workers, SGLang's scheduler and
detokenizer) are descendants of the replica process. A replica that dies without stopping its
engine (SIGKILL, Serve's ``ray.kill``, its own ``os._exit`` after losing the engine, the OOM killer)
leaves them re-parented: vLLM's engine core does not notice its client's death, and its TP workers
follow only the engine core, so they keep their GPU memory and block the replacement replica. Ray
2.60 covers part of it: a dying worker kills its direct children (``RAY_kill_child_processes_on_worker_exit``,
not on SIGKILL) and the raylet kills a dead worker's process group (``RAY_process_group_cleanup_enabled``,
on by default), but only where that is on and only processes that stayed in the group.

:func:`arm` starts a watcher that is neither in the replica's process group nor its child (Ray kills
both as a worker ends, before the engine core's own children). While the replica lives the watcher
records, every :data:`POLL_S`, its descendants born since the guard was armed (with their start
times: a recycled pid is never killed). Once the replica is gone it SIGKILLs those still running,
with their descendants, and exits. A replica that stopped its engine itself disarms it. Linux only
(elsewhere :func:`arm` returns a guard that does nothing). The TP ranks of the ``ray`` executor are
Ray actors, not processes of the replica: Ray ends them with their owner.

The watcher is this file run as a script: it imports nothing but the standard library and psutil.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import IO

import psutil

# How often the watcher records the replica's descendants and looks whether the replica is gone. A
# process born less than this before the replica's death is missed (a look costs ~0.3 ms).
POLL_S = 0.25
# Once the replica closed the command pipe (it is ending), how often the watcher looks.
ENDING_POLL_S = 0.05
# How long a replica that disarms its watcher waits for it to end.
WAIT_S = 5.0
# What a replica that stopped its engine itself writes to its watcher.
DISARM = b"disarm\n"


class ProcessGuard:
    """A replica's watcher process (none off Linux); see the module docstring."""

    def __init__(self, watcher: psutil.Process | None = None, commands: IO[bytes] | None = None):
        self.pid = watcher.pid if watcher is not None else None
        self._watcher = watcher
        self._commands = commands

    @property
    def watching(self) -> bool:
        """Whether the watcher process runs."""
        return self._watcher is not None and _is_running(self._watcher)

    def disarm(self) -> None:
        """Let the watcher end without killing anything (the engine was stopped); idempotent."""
        commands, self._commands = self._commands, None
        if commands is None:
            return
        try:
            commands.write(DISARM)
            commands.close()
        except OSError:  # the watcher is gone already
            return
        deadline = time.monotonic() + WAIT_S
        while self.watching and time.monotonic() < deadline:
            time.sleep(0.01)


def arm() -> ProcessGuard:
    """Start this process's watcher: the processes it starts from now on end once it is gone."""
    if not sys.platform.startswith("linux"):
        return ProcessGuard()
    # Processes that exist already are not the engine's (in a test, the Ray cluster a pytest started).
    existing = [identity for child in _descendants(psutil.Process()) if (identity := _identity(child))]
    # -P: this file's folder (the engine modules) does not go first on the watcher's import path.
    launcher = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), str(os.getpid()), *existing],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert launcher.stdin is not None and launcher.stdout is not None
    with launcher.stdout:
        answer = launcher.stdout.readline()
    launcher.wait()
    if not answer.strip().isdigit():
        launcher.stdin.close()
        raise RuntimeError(f"the process guard did not start (exit status {launcher.returncode})")
    return ProcessGuard(psutil.Process(int(answer)), launcher.stdin)


def _descendant_pids(pid: int) -> list[int] | None:
    """``pid``'s descendants from each thread's ``/proc/PID/task/TID/children`` (None where the kernel has
    no such file). It reads the replica's own tree only: psutil's recursive ``children()`` reads every
    process of the machine, ~50 ms a look among 400 processes, which a watcher per replica repeated
    several times a second on a loaded 2-core machine. A child missed while it is being born is seen
    next time."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone meanwhile
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    born = [int(child) for child in children.read().split()]
            except (OSError, ValueError):
                continue
            found += born
            parents += born
    return found


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    pids = _descendant_pids(process.pid)
    if pids is None:
        try:
            return process.children(recursive=True)
        except psutil.Error:  # gone meanwhile
            return []
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.Error:  # gone meanwhile
            continue
    return processes


def _is_running(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (not a recycled pid, not a zombie)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _identity(process: psutil.Process) -> str | None:
    """``pid:start time``: one process, never a later one with its recycled pid (None: gone)."""
    try:
        return f"{process.pid}:{process.create_time()!r}"
    except psutil.Error:
        return None


def watch(owner: psutil.Process, existing: set[str], commands: int) -> list[str]:
    """The watcher's loop (see the module docstring); returns the processes it killed (``pid name``).
    ``existing``: the owner's descendants at arming (:func:`_identity`); ``commands``: the pipe's fd."""
    recorded: dict[int, psutil.Process] = {}
    pipe_open, next_look = True, 0.0
    while _is_running(owner):
        if time.monotonic() >= next_look:
            next_look = time.monotonic() + POLL_S
            for child in _descendants(owner):
                if child.pid != os.getpid() and _identity(child) not in existing:
                    recorded[child.pid] = child
            recorded = {pid: process for pid, process in recorded.items() if _is_running(process)}
        if not pipe_open:
            time.sleep(ENDING_POLL_S)
        elif select.select([commands], [], [], POLL_S)[0]:
            command = os.read(commands, len(DISARM))
            if command == DISARM:
                return []
            pipe_open = command != b""  # closed: the owner is ending (an exit closes its files first)
    # Their descendants now too: a TP worker an engine core started after the last look.
    targets = {process.pid: process for process in recorded.values() if _is_running(process)}
    for process in list(targets.values()):
        targets.update((child.pid, child) for child in _descendants(process))
    killed = []
    for process in targets.values():
        try:
            name = process.name()
            process.kill()  # nothing is left to stop gracefully, and the engine's processes ignore SIGTERM
            killed.append(f"{process.pid} {name}")
        except psutil.Error:
            continue
    if killed:
        print(f"process guard: process {owner.pid} is gone; killed what it left running: {', '.join(killed)}",
              file=sys.stderr, flush=True)
    return killed


def main(argv: list[str]) -> None:
    """The launcher: fork the watcher, print its pid and end (``argv``: the owner's pid, then ``existing``)."""
    owner = psutil.Process(int(argv[0]))
    watcher = os.fork()
    if watcher:
        print(watcher, flush=True)
        os._exit(0)
    # The owner reads one line: nothing more goes to that pipe.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    watch(owner, set(argv[1:]), sys.stdin.fileno())


if __name__ == "__main__":
    main(sys.argv[1:])
