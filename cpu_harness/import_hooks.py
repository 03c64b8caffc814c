"""TEST SUPPORT: run a function on a module right after it is first imported (or now, if it already is).

The CPU harness applies its upstream workarounds this way (:mod:`cpu_harness.verl_platform` is loaded
while ``verl`` itself is being imported, before the vLLM and verl modules it patches exist).
Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable

__all__ = ["after_import"]

Patch = Callable[[types.ModuleType], None]


class _PostImportPatcher(importlib.abc.MetaPathFinder):
    """Lets the normal import find a module, then runs the patches registered for it once it has executed."""

    def __init__(self) -> None:
        self.patches: dict[str, list[Patch]] = {}

    def find_spec(self, name, path, target=None):
        patches = self.patches.get(name)
        if not patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            for patch in patches:
                patch(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(module_name: str, patch: Patch) -> None:
    """Apply ``patch`` to ``module_name`` now if it is imported, else as soon as it is (once per patch)."""
    if module_name in sys.modules:
        patch(sys.modules[module_name])
        return
    patcher = next((finder for finder in sys.meta_path if isinstance(finder, _PostImportPatcher)), None)
    if patcher is None:
        patcher = _PostImportPatcher()
        sys.meta_path.insert(0, patcher)
    patches = patcher.patches.setdefault(module_name, [])
    if patch not in patches:
        patches.append(patch)
