"""A replica's view of its deployment's running replicas: the set the routers build their ring from.

Serve's controller broadcasts each deployment's running replicas to every router by long poll
(starting replicas are not in it: routers send them nothing yet). A scorer replica subscribes to
the same broadcast, so that when the set changes (scaling, a death, a redeploy) it learns which of
the groups it collects now belong to another replica, and hands them off at once
(``deployments/replica.py``) instead of holding their members until the assembly timeout.

It uses Serve's long-poll client, an internal API pinned with Ray 2.60 like the router's base
class (``deployments/router.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("ray.serve")

__all__ = ["ReplicaSetWatch"]


class ReplicaSetWatch:
    """Calls ``on_change(replica ids)`` with the running replicas now, and again on every change."""

    def __init__(self, deployment_id: Any, on_change: Callable[[list[str]], None], client_id: str):
        import ray
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
        from ray.serve._private.long_poll import LongPollClient, LongPollNamespace

        self._on_change = on_change
        self._last: list[str] | None = None
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        self._client = LongPollClient(
            controller,
            {(LongPollNamespace.DEPLOYMENT_TARGETS, deployment_id): self._update},
            call_in_event_loop=asyncio.get_running_loop(),
            client_id=f"replica-set-watch:{client_id}",
        )

    def _update(self, targets: Any) -> None:
        replicas = sorted(info.replica_id.unique_id for info in getattr(targets, "running_replicas", ()) or ())
        if not replicas or replicas == self._last:  # an empty set is a deployment going away: nothing to hand to
            return
        self._last = replicas
        try:
            self._on_change(replicas)
        except Exception:  # noqa: BLE001 - a failed hand-off leaves groups to the assembly timeout, as before
            logger.exception("replica set change: hand-off failed")

    def stop(self) -> None:
        """Stop following the broadcast."""
        self._client.stop()
