"""The reference pages (docs/reference/) are generated from the code and committed: they must match it,
and every public config and request field must describe itself for them (and for the OpenAPI page);
``scripts/reference.py --check`` checks both."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/reference.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_committed_pages_match_the_code_and_every_public_field_has_a_description():
    result = check()
    assert result.returncode == 0, result.stderr


def test_a_field_without_a_description_is_reported(monkeypatch):
    reference = runpy.run_path(str(ROOT / "scripts" / "reference.py"))  # not as __main__: nothing is written
    from grrm_client.config import ClientConfig

    assert reference["undescribed"]() == []
    monkeypatch.setattr(ClientConfig.model_fields["app_name"], "description", None)
    assert reference["undescribed"]() == ["ClientConfig.app_name"]
