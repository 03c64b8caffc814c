"""The client and the service stand apart, on the protocol beneath both: no module of ``grrm_client``
imports the service (``deployments``), and no module of the service imports the client, at module
level or lazily inside a function, so either can be installed and reasoned about on its own. What
both speak is the protocol (``cluster/protocol``: the wire models, headers, the OpenRLHF schema, the
one retry loop), which imports neither side, nor Ray or torch.

The handle plumbing both sides use (``grrm_handles``: the one handle sender, a deployment's
availability, handles set up early) is neutral: it imports neither the service nor the client, and
its package import stays light (no Ray: the client imports its modules only when a handle is used)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "grrm_client"
HANDLES = ROOT / "grrm_handles"
PROTOCOL = ROOT / "cluster" / "protocol"
SERVICE = "deployments"


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module a source imports, anywhere in it (a function's lazy imports too), with its line:
    ``import x``, ``from x import y``, and ``importlib.import_module("x")`` / ``__import__("x")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def imports_package(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def imports_service(module: str) -> bool:
    return imports_package(module, SERVICE)


def offending_imports(package: Path, forbidden: tuple[str, ...]) -> list[str]:
    """``path:line: module`` for every import, in any module of ``package`` (its sub-packages too), of
    one of the ``forbidden`` top-level packages."""
    sources = sorted(package.rglob("*.py"))
    assert sources, f"the walk found no modules in {package.name}"
    return [
        f"{path.relative_to(package.parent)}:{line}: {module}"
        for path in sources
        for line, module in imported_modules(ast.parse(path.read_text(), str(path)))
        if any(imports_package(module, name) for name in forbidden)
    ]


def test_no_client_module_imports_the_service():
    assert len(list(CLIENT.glob("*.py"))) > 5, "the walk found no client modules"
    offenders = offending_imports(CLIENT, (SERVICE,))
    assert not offenders, "grrm_client imports deployments:\n" + "\n".join(offenders)


def test_no_service_module_imports_the_client():
    assert len(list((ROOT / SERVICE).glob("*.py"))) > 5, "the walk found no service modules"
    offenders = offending_imports(ROOT / SERVICE, ("grrm_client",))
    assert not offenders, "deployments imports grrm_client:\n" + "\n".join(offenders)


def test_the_protocol_imports_neither_side_nor_ray_or_torch():
    modules = {path.stem for path in PROTOCOL.glob("*.py")}
    assert {"schema", "retry", "calls", "headers", "openrlhf"} <= modules, f"the walk found only {sorted(modules)}"
    offenders = offending_imports(PROTOCOL, (SERVICE, "grrm_client", "grrm_handles", "ray", "torch"))
    assert not offenders, "cluster/protocol imports a side, Ray or torch:\n" + "\n".join(offenders)
    # Nor through what it imports from the rest of the core.
    check = ("import sys, cluster.protocol.schema, cluster.protocol.retry, cluster.protocol.calls, "
             "cluster.protocol.headers, cluster.protocol.members, cluster.protocol.openrlhf; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'torch', 'grrm_client', 'deployments', "
             "'grrm_handles'}))")
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing the protocol imports {done.stdout.strip()}"


def test_the_handle_plumbing_imports_neither_side():
    modules = {path.stem for path in HANDLES.glob("*.py")}
    assert {"send", "availability", "ready"} <= modules, f"the walk found only {sorted(modules)} in grrm_handles"
    offenders = offending_imports(HANDLES, (SERVICE, "grrm_client"))
    assert not offenders, "grrm_handles imports the service or the client:\n" + "\n".join(offenders)


def test_the_handle_package_import_is_light():
    # Ray (Serve) comes with the modules, not with the package: ``import grrm_handles`` loads none of it.
    check = "import sys, grrm_handles; print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing grrm_handles imports Ray: {done.stdout.strip()}"


def test_the_rule_catches_a_handle_module_that_imports_either_side(tmp_path):
    package = tmp_path / "grrm_handles"
    package.mkdir()
    (package / "send.py").write_text("from grrm_handles.ready import ready_handle\nimport grrm_clientele\n")
    (package / "ready.py").write_text("def lazy():\n    from deployments.client import ScorerClient\n")
    (package / "availability.py").write_text("import grrm_client.config\n")
    assert offending_imports(package, (SERVICE, "grrm_client")) == [
        "grrm_handles/availability.py:1: grrm_client.config",
        "grrm_handles/ready.py:2: deployments.client",
    ]


def test_the_walk_sees_every_form_of_import():
    source = (
        "import deployments\n"
        "def lazy():\n"
        "    from deployments.client import ScorerClient\n"
        "    import deployments.ingress as ingress\n"
        "    importlib.import_module('deployments.replica')\n"
        "    __import__('deployments')\n"
        "from grrm_handles import send\n"
        "import deploymentsfoo\n"
    )
    modules = [module for _, module in sorted(imported_modules(ast.parse(source)))]
    assert [imports_service(module) for module in modules] == [True, True, True, True, True, False, False]
