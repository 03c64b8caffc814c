"""What ``pip install grrm-cluster`` installs: the product's packages, not the test support.

``simulated`` and ``cpu_harness`` (test support), ``tests`` and ``bench`` run from a checkout; a
wheel that carried them would put packages with such generic names into every user's
site-packages, and the product imports none of them. The demo model (``cluster/tiny_model.py``)
ships: the local demo builds it from an installed wheel. docs/development/architecture.md
("Layout") says which package is which and why.
"""

from __future__ import annotations

import ast
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


def checkout_imports(source: Path, root: Path = ROOT) -> list[str]:
    """``path:line: module`` (the path from ``root``) for each import in ``source`` (a function's lazy
    ones too) of a package that only a checkout has."""
    tree = ast.parse(source.read_text(), str(source))
    named = [(node.lineno, alias.name) for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    named += [(node.lineno, node.module) for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level]
    return [f"{source.relative_to(root)}:{line}: {module}" for line, module in sorted(named)
            if module.split(".", 1)[0] in CHECKOUT_ONLY]


def test_no_product_module_imports_what_only_a_checkout_has() -> None:
    """The wheel leaves the test support out, so the product must run without it (the scripted
    engine is named by a registry string, outside a checkout a clear error: the test below)."""
    sources = [path for package in sorted(PRODUCT) for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(sources) > 100, "the walk found too few product modules"
    offenders = [line for source in sources for line in checkout_imports(source)]
    assert not offenders, "the product imports test support:\n" + "\n".join(offenders)


def test_the_walk_sees_a_lazy_import_of_test_support(tmp_path: Path) -> None:
    module = tmp_path / "cluster" / "probe.py"
    module.parent.mkdir()
    module.write_text("import json\ndef lazy():\n    from simulated.scripted_engine import ScriptedEngine\n"
                      "    import bench.common\n")
    assert checkout_imports(module, tmp_path) == ["cluster/probe.py:3: simulated.scripted_engine",
                                                  "cluster/probe.py:4: bench.common"]
