"""A client's run trace, kept in its file for ``grrm plan --trace`` (``ClientConfig.trace_path``).

:class:`TraceFile` turns what :class:`~grrm_client.reward_client.RewardClient` sends and gets back into
:class:`~cluster.planning.recorder.TraceRecorder` calls (a member's or a whole group's first send, in
Unix seconds; a group's engine tokens from its answer's ``usage``) and writes the trace when a step ends
(the steps ended so far), once sends have paused for the phase gap (every step: the last has ended by
the same rule, so a trainer that never closes its client still leaves it), and at close (every step).
A write is atomic (a temporary file beside it, then ``os.replace``): a reader never sees half a trace. Recording is advisory: nothing here raises into a reward call; the first failure to write
is logged as a warning, later ones are only counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path

from cluster.planning.recorder import TraceRecorder
from cluster.protocol.schema import GroupRequest, GroupResult, MemberRequest, MemberResult
from grrm_client.config import ClientConfig

__all__ = ["TraceFile", "write_atomically"]

logger = logging.getLogger(__name__)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once: written to a temporary file in its folder first."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class TraceFile:
    """Records one client's sends and keeps its trace in ``path``."""

    def __init__(self, path: str, *, phase_gap_s: float, max_steps: int) -> None:
        """``path``: where the trace goes (``{pid}`` in it becomes this process's id)."""
        self.path = Path(path.replace("{pid}", str(os.getpid())))
        self._phase_gap_s = phase_gap_s
        self._max_steps = max_steps
        # Made at the first send: the run is named after the tenant its requests are for, as the
        # service knows it (an adapter may send for a tenant of its own, e.g. verl's run).
        self.recorder: TraceRecorder | None = None
        self._unnamed = itertools.count()  # keys of whole groups sent without a group_id
        self.writes = 0
        self.write_failures = 0
        self._quiet: asyncio.TimerHandle | None = None  # the write due once sends pause for phase_gap_s

    @classmethod
    def of(cls, config: ClientConfig) -> TraceFile | None:
        """The trace file a client's config asks for (None: no ``trace_path``, nothing is recorded)."""
        if config.trace_path is None:
            return None
        return cls(config.trace_path, phase_gap_s=config.phase_gap_s, max_steps=config.trace_max_steps)

    def member_sent(self, member: MemberRequest) -> Hashable:
        """Note a member's send (its ``sent_at`` when the caller gave one, else now); returns its group's key."""
        # The key is the trace's group_id: "tenant:group_id", the same in every process of a run, so the
        # parts its processes record merge (cluster.planning.recorder.one_per_run).
        key = f"{member.tenant}:{member.group_id}"
        at = member.sent_at if member.sent_at is not None else time.time()
        self._noted(self._recorder(member.tenant).member_sent(key, member.group_size, at, member=member.key))
        return key

    def group_sent(self, group: GroupRequest) -> Hashable:
        """Note a whole group's send (now); returns its key."""
        key = f"{group.tenant}:{group.group_id if group.group_id is not None else f'#{next(self._unnamed)}'}"
        self._noted(self._recorder(group.tenant).group_sent(key, len(group.candidates), time.time()))
        return key

    def _noted(self, step_ended: bool) -> None:
        """After a send: write the ended steps when one just ended, and the whole trace once nothing more
        comes for ``phase_gap_s`` (the step has ended then, by the same rule): a trainer that never closes
        its client (verl's reward workers, TRL, slime) still leaves its last step."""
        if step_ended:
            self.write(ended_only=True)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a direct caller): the step's end or close writes it
            return
        if self._quiet is not None:
            self._quiet.cancel()
        self._quiet = loop.call_later(self._phase_gap_s, self.write)

    def answered(self, key: Hashable, result: MemberResult | GroupResult | None) -> None:
        """Note the engine tokens of the group ``key`` from its answer (a member's answer carries none)."""
        if self.recorder is None or not isinstance(result, GroupResult):
            return
        self.recorder.group_answered(key, result.usage.prompt_tokens + result.usage.completion_tokens)

    def close(self) -> bool:
        """Write the whole trace (the client closes): no write is due after it."""
        if self._quiet is not None:
            self._quiet.cancel()
            self._quiet = None
        return self.write()

    def write(self, *, ended_only: bool = False) -> bool:
        """Write the trace so far (nothing before the first send; ``ended_only``: its ended steps, as a
        step ends); whether it was written. Never raises."""
        trace = self.recorder.trace(ended_only=ended_only) if self.recorder is not None else None
        if trace is None:
            return False
        try:
            write_atomically(self.path, trace.model_dump_json(exclude_none=True))
        except Exception as error:  # noqa: BLE001 - a trace is advisory: rewards go on without it
            self.write_failures += 1
            if self.write_failures == 1:
                logger.warning("run trace not written to %s (rewards go on; later failures are not logged): "
                               "%s: %s", self.path, type(error).__name__, error)
            return False
        self.writes += 1
        return True

    def _recorder(self, tenant: str) -> TraceRecorder:
        if self.recorder is None:
            self.recorder = TraceRecorder(tenant, phase_gap_s=self._phase_gap_s, max_steps=self._max_steps)
        return self.recorder
