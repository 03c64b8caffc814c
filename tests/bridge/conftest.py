"""Fixtures of the bridge tests: the tiny model's tokenizer, and one Ray + Serve for this folder.

``ray_serve`` is package-scoped (this folder is a package): it starts a local Ray cluster and
Serve on 127.0.0.1 the first time a test here needs it and shuts both down when the last test of
the folder has run, so ``tests/serving``'s session fixture can start its own afterwards. If Ray
is already initialised in this process (another folder's fixture ran first), it is reused and
left running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import free_port


@pytest.fixture(scope="package")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight model (its byte-level tokenizer is a real HF tokenizer with ChatML)."""
    from cluster.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-grrm", seed=0)


@pytest.fixture(scope="package")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="package")
def ray_serve():
    """A local Ray cluster (no dashboard) and Serve with HTTP on a free loopback port; yields the URL."""
    import ray
    from ray import serve

    if ray.is_initialized():
        from ray.serve.context import _get_global_client

        port = _get_global_client().http_config.port
        yield f"http://127.0.0.1:{port}"
        return
    port = free_port()
    ray.init(num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
