"""The bridge's counters in verl's own step metrics, so a failing reward service shows in the curve.

verl 0.9.1 computes rewards in reward-loop worker processes and logs step metrics in its trainer
process, where nothing reads ``reward_extra_info`` during training. Every row's
``reward_extra_info`` does reach the trainer, though: in the v1 trainer's TransferQueue
(``extra_fields["reward_extra_info"]``, all three v1 modes), and in the batch of the legacy trainer
and of the two experimental recipes, ``one_step_off_policy`` and ``fully_async_policy`` (their
non-tensor columns). :func:`install_step_metrics` wraps the one place each trainer computes a step's metrics
so that, for steps whose rows carry the bridge's keys (:data:`~grrm_client.adapters.verl.extra_info.EXTRA_INFO_KEYS`),
the step also logs ``grrm/rewards``, ``grrm/valid``, ``grrm/failed``, ``grrm/retried``,
``grrm/retries``, ``grrm/default/<reason>``, each part of the service's recipe as
``grrm/component/<name>/mean`` ... (:func:`grrm_client.adapters.verl.metrics.step_metrics`) for
exactly that step's rollouts. Steps without them are untouched.

The recipes' shared trainer base (``experimental/separation/ray_trainer.py``) imports
``compute_data_metrics`` by name, so its own module attribute is wrapped too. fully_async_policy
trains in an actor that never loads the reward manager, so the wrapping cannot wait for the manager:
:mod:`grrm_client.adapters.verl.plugin`, a verl plugin (the ``verl.plugins`` entry point this package
declares, loaded by ``import verl`` in every verl process), wraps each trainer module as it is
imported. A failure to compute the counters is logged and never reaches the training step.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from grrm_client.adapters.verl.metrics import step_metrics
from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS

__all__ = ["install_step_metrics", "wrap_trainer_module"]

logger = logging.getLogger(__name__)

V1_TRAINER = "verl.trainer.ppo.v1.trainer_base"  # PPOTrainer._compute_metrics(batch, metrics, ...)
LEGACY_TRAINER = "verl.trainer.ppo.ray_trainer"  # fit() calls compute_data_metrics(batch=...)
# one_step_off_policy and fully_async_policy: SeparateRayPPOTrainer._fit_collect_metrics calls
# compute_data_metrics(batch=...), imported by name into this module.
SEPARATION_TRAINER = "verl.experimental.separation.ray_trainer"
TRAINER_MODULES = (V1_TRAINER, LEGACY_TRAINER, SEPARATION_TRAINER)
_WRAPPED = "_grrm_step_metrics"


def install_step_metrics() -> list[str]:
    """Wrap the step-metric computation of each verl trainer already imported here; returns their names."""
    return [name for name in TRAINER_MODULES if name in sys.modules and wrap_trainer_module(sys.modules[name])]


def wrap_trainer_module(module: Any) -> bool:
    """Wrap the step metrics of one of verl's trainer modules (:data:`TRAINER_MODULES`); False if
    it was wrapped already or is not one of them."""
    if module.__name__ == V1_TRAINER:
        return _wrap(module.PPOTrainer, "_compute_metrics", _v1_compute_metrics)
    if module.__name__ in (LEGACY_TRAINER, SEPARATION_TRAINER):
        return _wrap(module, "compute_data_metrics", _legacy_compute_data_metrics)
    return False


def _wrap(owner: Any, name: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    original = getattr(owner, name, None)
    if original is None or getattr(original, _WRAPPED, False):
        return False
    wrapped = functools.wraps(original)(wrapper(original))
    setattr(wrapped, _WRAPPED, True)
    setattr(owner, name, wrapped)
    return True


def _v1_compute_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    def compute_metrics(self, batch, metrics, *args, **kwargs):
        result = original(self, batch, metrics, *args, **kwargs)
        _add(metrics, lambda: step_metrics(_v1_reward_infos(batch)))
        return result

    return compute_metrics


def _v1_reward_infos(batch: Any) -> list[Any]:
    """One ``reward_extra_info`` per rollout of a v1 step (the final output of each session)."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    extra_fields = data["extra_fields"]
    extra_fields = extra_fields.tolist() if hasattr(extra_fields, "tolist") else list(extra_fields)
    final: dict[str, tuple[int, Any]] = {}  # {uid}_{session_id} -> (output index, its reward info)
    for key, tag, fields in zip(batch.keys, batch.tags, extra_fields, strict=True):
        if tag.get("is_padding", False):
            continue
        session, _, output = str(key).rpartition("_")
        fields = getattr(fields, "data", fields)
        info = fields.get("reward_extra_info") if isinstance(fields, Mapping) else None
        index = int(output) if output.isdigit() else 0
        if session not in final or index > final[session][0]:
            final[session] = (index, info)
    return [info for _, info in final.values()]


def _legacy_compute_data_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    def compute_data_metrics(batch, *args, **kwargs):
        metrics = original(batch, *args, **kwargs)
        _add(metrics, lambda: _legacy_metrics(batch))
        return metrics

    return compute_data_metrics


def _legacy_metrics(batch: Any) -> dict[str, float]:
    columns = batch.non_tensor_batch
    if not all(key in columns for key in EXTRA_INFO_KEYS):
        return {}
    values = {key: list(columns[key]) for key in EXTRA_INFO_KEYS}
    return step_metrics([dict(zip(values, row, strict=True)) for row in zip(*values.values(), strict=True)])


def _add(metrics: dict[str, Any], compute: Callable[[], dict[str, float]]) -> None:
    try:
        metrics.update(compute())
    except Exception:  # noqa: BLE001 - counting must never break a training step
        logger.exception("grrm: could not add the bridge's counters to this step's metrics")
