"""The client stands alone: no module of ``grrm_client`` imports the service (``deployments``), at
module level or lazily inside a function, so the client can be installed and reasoned about on
its own (the service may use the client's modules, never the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

CLIENT = Path(__file__).resolve().parent.parent / "grrm_client"
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


def imports_service(module: str) -> bool:
    return module == SERVICE or module.startswith(f"{SERVICE}.")


def test_no_client_module_imports_the_service():
    sources = sorted(CLIENT.glob("*.py"))
    assert len(sources) > 5, "the walk found no client modules"
    offenders = [
        f"{path.relative_to(CLIENT.parent)}:{line}: {module}"
        for path in sources
        for line, module in imported_modules(ast.parse(path.read_text(), str(path)))
        if imports_service(module)
    ]
    assert not offenders, "grrm_client imports deployments:\n" + "\n".join(offenders)


def test_the_walk_sees_every_form_of_import():
    source = (
        "import deployments\n"
        "def lazy():\n"
        "    from deployments.client import ScorerClient\n"
        "    import deployments.ingress as ingress\n"
        "    importlib.import_module('deployments.replica')\n"
        "    __import__('deployments')\n"
        "from grrm_client import handle_send\n"
        "import deploymentsfoo\n"
    )
    modules = [module for _, module in sorted(imported_modules(ast.parse(source)))]
    assert [imports_service(module) for module in modules] == [True, True, True, True, True, False, False]
