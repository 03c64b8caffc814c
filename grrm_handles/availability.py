"""Whether a deployment can serve at all: its running replicas and, when none runs, why not.

Serve holds a call to a deployment without a running replica until one starts. When no replica
can be placed (the deployment asks for resources that no node of the cluster has, such as GPUs on
a CPU-only cluster) that wait never ends, and Serve explains it only in its controller's log (and,
after 30 s, in the deployment's status message). The callers of the replicas
(:class:`grrm_handles.send.HandleSender`: the client's handle transport, the HTTP ingress,
the replicas' hand-offs) ask :class:`DeploymentAvailability` first, and fail at once with
:class:`ReplicasUnschedulableError`, which names the missing resources.

:func:`assess` and :func:`missing_resources` are pure (Serve's deployment details and the nodes'
resources in, a verdict out); :class:`DeploymentAvailability` fetches those facts from Serve's
controller and Ray's GCS, off the event loop and at most once per refresh period. A call never
waits for them (:meth:`DeploymentAvailability.peek`): while the GCS is down a fetch blocks until it
is back, and replicas, proxies and handles go on serving without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.serve.exceptions import DeploymentUnavailableError, RayServeException

logger = logging.getLogger("ray.serve")

# Serve's own word (deployment status message, after RAY_SERVE_SLOW_STARTUP_WARNING_S) for replicas
# that found no node with free resources.
SERVE_SCHEDULING_MESSAGE = "to be scheduled"
# How stale a verdict may be: short while no replica runs (callers wait on it), longer otherwise.
REFRESH_NOT_READY_S = 2.0
REFRESH_READY_S = 10.0

Resources = dict[str, float]


@dataclass(frozen=True)
class Availability:
    """One look at a deployment: its replicas by state and, when none runs and none can be placed, why."""

    deployment: str
    running: int
    replica_states: dict[str, int] = field(default_factory=dict)
    required: list[Resources] = field(default_factory=list)  # one replica: its bundles (one if no placement group)
    missing: Resources = field(default_factory=dict)  # what the closest node lacks for one replica
    unschedulable: str | None = None  # why no replica can be placed; None while one runs or may start

    @property
    def ready(self) -> bool:
        """At least one replica runs."""
        return self.running > 0

    def describe(self) -> str:
        """One line for an error body or a log."""
        states = ", ".join(f"{state}: {count}" for state, count in sorted(self.replica_states.items())) or "none"
        if self.ready:
            return f"{self.deployment}: {self.running} replica(s) running ({states})"
        reason = self.unschedulable or "replicas are starting"
        return f"{self.deployment}: no replica is running ({states}); {reason}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "running": self.running,
            "replica_states": self.replica_states,
            "required_per_replica": self.required,
            "missing": self.missing,
            "unschedulable": self.unschedulable,
        }


class ReplicasUnschedulableError(DeploymentUnavailableError):
    """No replica of the deployment runs and none can be placed; the message names the missing resources."""

    def __init__(self, deployment_id: Any, reason: str, availability: dict[str, Any] | None = None):
        RayServeException.__init__(self, deployment_id, reason, availability)  # args survive pickling
        self._deployment_id = deployment_id
        self.reason = reason
        self.availability = availability or {}

    @property
    def message(self) -> str:
        return self.reason

    def __str__(self) -> str:
        return self.message


def _positive(resources: Mapping[str, Any]) -> Resources:
    return {name: float(amount) for name, amount in resources.items() if amount and float(amount) > 0}


def _fmt(resources: Mapping[str, float]) -> str:
    return json.dumps({name: round(amount, 4) for name, amount in sorted(resources.items())})


def missing_resources(bundles: Sequence[Mapping[str, float]], strategy: str | None,
                      nodes: Sequence[Mapping[str, float]]) -> Resources:
    """What one replica lacks on the node closest to holding it; ``{}`` when some node can hold it.

    ``bundles`` are the replica's resource bundles (one without a placement group); ``nodes`` the
    total resources of each live node. ``STRICT_PACK`` (and a single bundle) needs all bundles on
    one node; other strategies need each bundle to fit some node (the first that fits none is
    reported).
    """
    bundles = [_positive(bundle) for bundle in bundles] or [{}]
    if strategy == "STRICT_PACK" or len(bundles) == 1:
        demand: Resources = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                demand[name] = demand.get(name, 0.0) + amount
        demands = [demand]
    else:
        demands = bundles
    for demand in demands:
        shortfalls = [
            {name: amount - float(node.get(name, 0.0)) for name, amount in demand.items()
             if float(node.get(name, 0.0)) + 1e-9 < amount}
            for node in nodes
        ] or [dict(demand)]
        if not any(not shortfall for shortfall in shortfalls):
            return min(shortfalls, key=lambda shortfall: (len(shortfall), sum(shortfall.values())))
    return {}


def assess(deployment: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> Availability:
    """The verdict on one deployment from Serve's details of it (the fields :func:`fetch_facts` keeps
    of ``DeploymentDetails``) and ``ray.nodes()``."""
    name = str(deployment.get("name", "?"))
    states: dict[str, int] = {}
    for replica in deployment.get("replicas") or []:
        state = str(replica.get("state"))
        states[state] = states.get(state, 0) + 1
    running = states.get("RUNNING", 0)
    config = deployment.get("deployment_config") or {}
    bundles = config.get("placement_group_bundles")
    if not isinstance(bundles, list) or not bundles:
        bundles = [deployment.get("required_resources") or {}]
    required = [_positive(bundle) for bundle in bundles]
    verdict = Availability(deployment=name, running=running, replica_states=states, required=required)
    if running:
        return verdict
    capacities = [_positive(node.get("Resources") or {}) for node in nodes if node.get("Alive", True)]
    missing = missing_resources(required, config.get("placement_group_strategy"), capacities)
    if missing:
        reason = (
            f"each replica needs {_fmt(_sum(required))} and no node of the Ray cluster has that "
            f"(missing on the closest node: {_fmt(missing)}); add such a node or lower the "
            "deployment's resources (replicas.num_cpus, replicas.gpus_per_rank, replicas.resources, "
            "engine.tensor_parallel_size)"
        )
        return Availability(deployment=name, running=0, replica_states=states, required=required,
                            missing=missing, unschedulable=reason)
    message = str(deployment.get("message") or "")
    if SERVE_SCHEDULING_MESSAGE in message:  # the resources exist but are held by others
        return Availability(deployment=name, running=0, replica_states=states, required=required,
                            unschedulable=f"Serve cannot place its replicas: {message}")
    return verdict


def _sum(bundles: Sequence[Resources]) -> Resources:
    total: Resources = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def fetch_facts(app_name: str, deployment_name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Serve's details of one deployment (None if it does not exist) and ``ray.nodes()``; blocking.

    Serve's details come from its controller, as ``serve.status()`` reads them (a private client
    call, Ray 2.60 pinned): the public status lacks the resources a replica needs.
    """
    import ray
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeInstanceDetails

    details = ServeInstanceDetails(**_get_global_client().get_serve_details())
    application = details.applications.get(app_name)
    deployment = application.deployments.get(deployment_name) if application else None
    if deployment is None:
        return None, ray.nodes()
    config = deployment.deployment_config
    # Unset options hold Serve's DEFAULT sentinel, not None: keep only real values.
    bundles = config.placement_group_bundles
    strategy = config.placement_group_strategy
    facts = {
        "name": deployment.name,
        "message": deployment.message,
        "required_resources": dict(deployment.required_resources or {}),
        "deployment_config": {
            "placement_group_bundles": bundles if isinstance(bundles, list) else None,
            "placement_group_strategy": strategy if isinstance(strategy, str) else None,
        },
        "replicas": [{"state": str(getattr(replica.state, "value", replica.state))} for replica in deployment.replicas],
    }
    return facts, ray.nodes()


class DeploymentAvailability:
    """Cached :func:`assess` of one deployment, safe to share across threads and event loops."""

    def __init__(self, app_name: str, deployment_name: str,
                 fetch: Callable[[str, str], tuple[dict[str, Any] | None, list[dict[str, Any]]]] = fetch_facts,
                 clock: Callable[[], float] = time.monotonic):
        self.app_name = app_name
        self.deployment_name = deployment_name
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()  # one fetch at a time
        self._pending_lock = threading.Lock()
        self._pending: concurrent.futures.Future | None = None  # the background refresh, while one runs
        self._last: Availability | None = None
        self._fetched_at = float("-inf")
        self._warned = False

    @classmethod
    def for_handle(cls, handle: Any) -> DeploymentAvailability | None:
        """For the deployment a Serve handle calls; None for anything that is not a Serve handle."""
        deployment_id = getattr(handle, "deployment_id", None)
        if deployment_id is None or not getattr(deployment_id, "name", None):
            return None
        return cls(deployment_id.app_name, deployment_id.name)

    @property
    def refresh_s(self) -> float:
        return REFRESH_READY_S if self._last is not None and self._last.ready else REFRESH_NOT_READY_S

    def _fresh(self, max_age_s: float | None) -> bool:
        return self._clock() - self._fetched_at < (self.refresh_s if max_age_s is None else max_age_s)

    async def current(self, max_age_s: float | None = None) -> Availability | None:
        """The latest verdict, refreshed when older than ``max_age_s`` (default :attr:`refresh_s`);
        None when the facts cannot be read (unknown)."""
        if self._fresh(max_age_s):
            return self._last
        return await asyncio.to_thread(self._refresh, max_age_s)

    def _refresh(self, max_age_s: float | None) -> Availability | None:
        with self._lock:
            if self._fresh(max_age_s):
                return self._last
            try:
                deployment, nodes = self._fetch(self.app_name, self.deployment_name)
                self._last = assess(deployment, nodes) if deployment is not None else None
            except Exception as error:  # noqa: BLE001 - unknown is not unavailable: callers go ahead
                if not self._warned:
                    logger.warning("availability of %s/%s unknown: %r", self.app_name, self.deployment_name, error)
                    self._warned = True
                self._last = None
            finally:
                self._fetched_at = self._clock()
            return self._last

    def peek(self) -> tuple[Availability | None, concurrent.futures.Future | None]:
        """The latest verdict at once, and, when it is stale, the refresh this starts in a thread of
        its own (one at a time; its future resolves to the new verdict). The call path reads this:
        a fetch blocks while the GCS is down, and the replicas still answer then."""
        with self._pending_lock:
            if self._fresh(None):
                return self._last, None
            if self._pending is None:
                pending: concurrent.futures.Future = concurrent.futures.Future()
                pending.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it for the others
                self._pending = pending
                threading.Thread(target=self._refresh_into, args=(pending,), daemon=True,
                                 name=f"availability-{self.deployment_name}").start()
            return self._last, self._pending

    def _refresh_into(self, pending: concurrent.futures.Future) -> None:
        try:
            verdict = self._refresh(None)
        finally:
            with self._pending_lock:
                self._pending = None
        pending.set_result(verdict)

    async def settled(self, wait_s: float) -> Availability | None:
        """The latest verdict; with none yet, the first refresh's, if it comes within ``wait_s``
        (``/healthz``: a probe must not hang while the GCS is down)."""
        verdict, refreshing = self.peek()
        if verdict is None and refreshing is not None:
            return await wait_for_refresh(refreshing, wait_s)
        return verdict

    def check(self, deployment_id: Any) -> tuple[Availability | None, concurrent.futures.Future | None]:
        """:meth:`peek`; raises :class:`ReplicasUnschedulableError` when the verdict says no replica can run."""
        verdict, refreshing = self.peek()
        raise_if_unschedulable(verdict, deployment_id)
        return verdict, refreshing


async def wait_for_refresh(refreshing: concurrent.futures.Future, timeout_s: float | None,
                           also: asyncio.Future | None = None) -> Availability | None:
    """Wait up to ``timeout_s`` for a refresh :meth:`DeploymentAvailability.peek` started (or for
    ``also`` to finish first); its verdict, or None if it did not come."""
    refreshed = asyncio.wrap_future(refreshing)
    watched = {refreshed} if also is None else {refreshed, also}
    await asyncio.wait(watched, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not refreshed.done():
        refreshed.cancel()  # only this waiter's view: the refresh itself runs on for the others
        return None
    return refreshed.result()


def raise_if_unschedulable(verdict: Availability | None, deployment_id: Any) -> None:
    """Raise :class:`ReplicasUnschedulableError` when ``verdict`` says no replica of the deployment can run."""
    if verdict is not None and not verdict.ready and verdict.unschedulable:
        raise ReplicasUnschedulableError(deployment_id, verdict.describe(), verdict.as_dict())
