"""Fixtures of the bridge tests: the tiny model's tokenizer, and the session's Ray + Serve."""

from __future__ import annotations

from pathlib import Path

import pytest


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
def ray_serve(serve_instance):
    """The session's Ray cluster and Serve (tests/conftest.py); yields Serve's base URL."""
    return serve_instance
