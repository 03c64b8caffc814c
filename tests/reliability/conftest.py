"""Reliability tests share the serving tests' local Ray + Serve instance."""

from tests.serving.conftest import free_port, serve_instance  # noqa: F401
