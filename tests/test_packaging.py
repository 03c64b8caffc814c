"""What ``pip install grrm-cluster`` installs: the product's packages, not the test support.

``simulated`` and ``cpu_harness`` (test support), ``tests`` and ``bench`` run from a checkout; a
wheel that carried them would put packages with such generic names into every user's
site-packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cluster.engines import EngineConfig, EngineError, make_engine

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = {"cluster", "deployments", "trainer_bridge", "grrm_cli", "grrm_client", "grrm_handles"}
CHECKOUT_ONLY = {"simulated", "cpu_harness", "tests", "bench", "k8s", "examples", "scripts"}
# Left out of the copy the wheel is built from: environments, caches and earlier builds.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", ".cache", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "models"
)


@pytest.fixture(scope="module")
def wheel_top_levels(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The top-level names in a wheel built from a copy of the checkout (with this environment's
    setuptools, offline; the copy keeps build files out of the checkout)."""
    source = tmp_path_factory.mktemp("source") / "grrm-cluster"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("wheel")
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", build, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("grrm_cluster-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/", 1)[0] for name in archive.namelist()}


def test_wheel_holds_the_product_and_no_test_support(wheel_top_levels: set[str]) -> None:
    assert PRODUCT <= wheel_top_levels
    assert not CHECKOUT_ONLY & wheel_top_levels
    assert {name for name in wheel_top_levels if not name.endswith(".dist-info")} == PRODUCT


def test_scripted_engine_outside_a_checkout_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # As in an installed wheel: no simulated package to import.
    monkeypatch.setitem(sys.modules, "simulated", None)
    monkeypatch.setitem(sys.modules, "simulated.scripted_engine", None)
    with pytest.raises(EngineError, match="checkout"):
        make_engine(EngineConfig(kind="scripted"))
