"""Handles for calls between replicas, without Ray: ``fresh_handle`` gives a handle with a router of
its own, where ``serve.get_deployment_handle`` would give the process's cached one."""

from __future__ import annotations

from ray.serve.handle import DeploymentHandle

from grrm_handles.ready import fresh_handle


def test_a_fresh_handle_has_a_router_of_its_own_unlike_serves_cached_handle(monkeypatch):
    """serve.get_deployment_handle hands back the process's cached handle (and its router, the one
    that went stale); a ledger sync's retry must not ask through that again."""
    made = []

    def counted(self, *args, **kwargs):  # ready_handle sets the router up through options()
        made.append(self)
        return self

    monkeypatch.setattr(DeploymentHandle, "options", counted)
    first, second = fresh_handle("GRRMReplica", "app"), fresh_handle("GRRMReplica", "app")
    assert first is not second and made == [first, second]
