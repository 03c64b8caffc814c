"""Fixtures shared across test folders."""

from __future__ import annotations

import pytest

from bench.common import free_port


@pytest.fixture(scope="session")
def serve_instance():
    """A local Ray cluster (no dashboard) and Serve with HTTP on a free loopback port.

    Yields the base URL. Started once for every folder that asks for it (a second ray.init in
    one process fails); stopped at the end of the session.
    """
    import ray
    from ray import serve

    port = free_port()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    if started_ray:
        ray.shutdown()
