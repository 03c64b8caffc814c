"""The bridge as a verl plugin: the bridge's counters in every trainer's step metrics.

This package declares it as an entry point of the ``verl.plugins`` group (``pyproject.toml``), and
verl 0.9.1 loads every such plugin when ``verl`` is imported (``verl/__init__.py``, unless
``VERL_USE_EXTERNAL_PLUGINS`` says otherwise), that is in each of its processes: the trainer, its
workers, the reward-loop workers, fully_async_policy's trainer actor. Loading it installs an import
hook that, when one of verl's trainer modules is imported in that process, wraps the module's step
metrics (:func:`grrm_client.adapters.verl.verl_metrics.wrap_trainer_module`); nothing else changes, and steps
whose rows do not carry the bridge's ``reward_extra_info`` are left as they are.

With plugins turned off (``VERL_USE_EXTERNAL_PLUGINS=none``) or the package not installed (only on
``PYTHONPATH``), name the module yourself: ``VERL_USE_EXTERNAL_MODULES=grrm_client.adapters.verl.plugin``.

It runs inside ``import verl``: neither it nor what it imports may import verl.
"""

from __future__ import annotations

import logging
from typing import Any

from grrm_client.adapters.verl.import_hooks import after_import
from grrm_client.adapters.verl.verl_metrics import TRAINER_MODULES, wrap_trainer_module  # no verl import there

__all__ = ["install"]


def _wrap(module: Any) -> None:
    try:
        wrap_trainer_module(module)
    except Exception:  # noqa: BLE001 - metrics must never break the trainer's import
        logging.getLogger(__name__).exception("grrm: could not add the bridge's counters to %s", module.__name__)


def install() -> None:
    """Wrap the trainer modules already imported, and every one imported from now on (idempotent)."""
    for name in TRAINER_MODULES:
        after_import(name, _wrap)


install()
