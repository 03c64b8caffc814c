"""A real local Ray cluster and Serve instance on 127.0.0.1 for the serving tests."""

from __future__ import annotations

import socket

import pytest
import ray
from ray import serve


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def serve_instance():
    """Ray (no dashboard) and Serve with HTTP on a free loopback port; yields the base URL."""
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()
