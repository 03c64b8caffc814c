"""One writer per output: ``grrm score -o OUTPUT`` holds ``OUTPUT.lock`` while it runs.

A batch job retried while its first attempt still runs would start a second ``grrm score`` on the
same output: it would take the first's live ``OUTPUT.parts/`` for a crash to resume, and the two
would delete or interleave each other's parts. The lock is an exclusive ``flock`` on a file next to
the output, which records who holds it; the second writer is refused at once, naming the first, and
touches nothing. The kernel releases the lock when its process ends however it ends, so a crashed
writer never blocks a later run; the file itself is removed by the writer that leaves normally.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OutputLocked", "lock_path", "output_lock"]


class OutputLocked(RuntimeError):
    """Another ``grrm score`` writes this output now."""


def lock_path(output: Path) -> Path:
    """The lock file of an output."""
    return output.with_name(output.name + ".lock")


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold the output's lock for the ``with`` block; :class:`OutputLocked` names the holder if taken."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(descriptor)
            os.close(descriptor)
            raise OutputLocked(
                f"-o: {output} is being written by another grrm score ({holder}); wait for it to end, or stop it "
                "and rerun this command to continue its output"
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(descriptor)  # the previous holder removed the file as we opened it: take the new one
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before the lock goes: a waiting writer then re-opens the path afresh
        os.close(descriptor)


def _read(descriptor: int) -> str:
    """Who holds the lock, as its file says."""
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return "holder unknown"
    if not isinstance(holder, dict) or "pid" not in holder:
        return "holder unknown"
    return f"pid {holder['pid']} on {holder.get('host', '?')} since {holder.get('since', '?')}"
