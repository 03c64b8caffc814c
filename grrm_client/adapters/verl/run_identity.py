"""Which training run a rollout belongs to, so that group ids never collide across runs.

verl's group ids (``uid``) are unique within one run at best. fully_async_policy names its groups
``uid_sample_{epoch}_{step}``, the same names in every run; a resumed v1 run re-issues the uids of
its unfinished groups with newly generated texts. The reward service keeps every scored group's
verdict for ``completed_ttl_s`` to answer re-sent members, so two runs (or a run and its resumption)
sharing one service would read each other's verdicts or have their members refused as conflicts.

The bridge therefore sends ``{run_id}:{uid}`` as the group id. The run id must be the same in every
reward-loop worker of one training run (members of a group come from different workers) and differ
between runs: it is derived from the Ray job that runs the trainer (every actor verl creates for a
run, its reward-loop workers included, belongs to the driver's job) and the Ray cluster's session
(job ids restart at 1 on a new cluster). Outside Ray there is one process: a random id per process.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from cluster.protocol.schema import DEFAULT_TENANT, TENANT_PATTERN

__all__ = ["current_run_id", "namespaced_group_id", "run_tenant"]

# Outside Ray: every manager of this process is one run.
_PROCESS_RUN_ID = f"run-{uuid.uuid4().hex[:12]}"


def current_run_id() -> str:
    """This process's training run: ``run-`` and 12 hex digits."""
    try:
        import ray

        if not ray.is_initialized():
            return _PROCESS_RUN_ID
        context = ray.get_runtime_context()
        identity = f"{context.get_session_name()}/{context.get_job_id()}"
    except Exception:  # noqa: BLE001 - no Ray, or a Ray without a runtime context: one process, one run
        return _PROCESS_RUN_ID
    return f"run-{hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()}"


def namespaced_group_id(run_id: str, uid: str) -> str:
    """The group id the service sees for verl's ``uid`` in training run ``run_id``."""
    return f"{run_id}:{uid}" if run_id else uid


def run_tenant(configured: str, run_id: str) -> str:
    """The tenant a training run's requests are for: the configured one, else the run itself (its
    groups metered and fairly served as one run's), else the default when the run id cannot name one."""
    if configured != DEFAULT_TENANT:
        return configured
    return run_id if re.fullmatch(TENANT_PATTERN, run_id) else DEFAULT_TENANT

