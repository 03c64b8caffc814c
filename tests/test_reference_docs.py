"""The reference pages (docs/reference/) are generated from the code and committed: they must match it,
and every public config and request field must describe itself for them (and for the OpenAPI page)."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_reference_pages_match_the_code():
    check = subprocess.run([sys.executable, "scripts/reference.py", "--check"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0, check.stderr


def models_under(root: type[BaseModel]) -> set[type[BaseModel]]:
    found, queue = set(), [root]
    while queue:
        model = queue.pop()
        if model in found:
            continue
        found.add(model)
        for field in model.model_fields.values():
            queue += [argument for argument in _types(field.annotation)
                      if isinstance(argument, type) and issubclass(argument, BaseModel)]
    return found


def _types(annotation: object) -> list[object]:
    return [annotation, *(inner for argument in typing.get_args(annotation) for inner in _types(argument))]


def test_every_public_config_and_request_field_has_a_description():
    from cluster.schema import MemberRequest
    from deployments.config import AppConfig
    from deployments.http.models import ScoreRequest
    from grrm_client.config import ClientConfig
    from trainer_bridge.config import BridgeConfig

    missing = [f"{model.__name__}.{name}"
               for root in (AppConfig, BridgeConfig, ClientConfig, ScoreRequest, MemberRequest)
               for model in models_under(root)
               for name, field in model.model_fields.items() if not field.description]
    assert missing == []
