"""The opt-in step-metrics plugin: the bridge's counters in verl's own step metrics.

verl 0.9.1 computes rewards in reward-loop worker processes and logs step metrics in its trainer
process, where nothing reads ``reward_extra_info`` during training. Every row's ``reward_extra_info``
does reach the trainer, though: in the v1 trainer's TransferQueue (``extra_fields["reward_extra_info"]``,
all three v1 modes), and in the batch of the legacy trainer and of the two experimental recipes,
``one_step_off_policy`` and ``fully_async_policy`` (their non-tensor columns). The plugin wraps the
one place each trainer computes a step's metrics so that, for steps whose rows carry the bridge's keys
(:data:`~grrm_client.adapters.verl.extra_info.EXTRA_INFO_KEYS`), the step also logs ``grrm/rewards``,
``grrm/valid``, ``grrm/failed``, ``grrm/default/<reason>``, ``grrm/component/<name>/mean`` ...
(:func:`grrm_client.adapters.verl.metrics.step_metrics`) for exactly that step's rollouts. Steps without
them are untouched, and a failure to compute the counters is logged and never reaches the step.

Opt-in: nothing here runs unless a verl process imports ``trainer_bridge.verl_plugin`` (verl imports
every module named in ``VERL_USE_EXTERNAL_MODULES`` on ``import verl``, docs/trainers/verl.md), which
calls :func:`install`. It wraps private verl code, so it refuses a verl it was not written against
(:data:`KNOWN_VERL_VERSIONS`) with an error naming both. The reward manager works without it.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from grrm_client.adapters.verl.extra_info import EXTRA_INFO_KEYS
from grrm_client.adapters.verl.metrics import step_metrics

__all__ = ["KNOWN_VERL_VERSIONS", "check_verl_version", "install", "install_step_metrics"]

logger = logging.getLogger(__name__)

# The verl versions whose trainers' step-metric code (below) this plugin was read against.
KNOWN_VERL_VERSIONS = ("0.9.1",)

V1_TRAINER = "verl.trainer.ppo.v1.trainer_base"  # PPOTrainer._compute_metrics(batch, metrics, ...)
LEGACY_TRAINER = "verl.trainer.ppo.ray_trainer"  # fit() calls compute_data_metrics(batch=...)
# one_step_off_policy and fully_async_policy: SeparateRayPPOTrainer._fit_collect_metrics calls
# compute_data_metrics(batch=...), imported by name into this module.
SEPARATION_TRAINER = "verl.experimental.separation.ray_trainer"
TRAINER_MODULES = (V1_TRAINER, LEGACY_TRAINER, SEPARATION_TRAINER)
_WRAPPED = "_grrm_step_metrics"


def check_verl_version(version: str) -> None:
    """A RuntimeError naming ``version`` and the known ones, unless the plugin knows it."""
    if version not in KNOWN_VERL_VERSIONS:
        raise RuntimeError(
            f"trainer_bridge.verl_plugin: verl {version} is not a version this plugin knows "
            f"({', '.join(KNOWN_VERL_VERSIONS)}); it wraps verl's trainers' own step-metric code, which "
            f"may differ in {version}. Remove trainer_bridge.verl_plugin from VERL_USE_EXTERNAL_MODULES "
            "(the reward manager does not need it) or run a verl it knows."
        )


def install() -> None:
    """Opt in (idempotent): check verl's version, then wrap each trainer's step metrics when it creates
    its logger.

    Called while ``import verl`` runs, before any trainer module exists: every verl trainer creates its
    :class:`verl.utils.tracking.Tracking` in its own process before its first step, and by then its
    module is imported, so the wrapping waits for that (no import hook).
    """
    import verl  # during verl's own import: the partly initialised package, __version__ already set

    check_verl_version(verl.__version__)
    from verl.utils import tracking  # light: no torch, Ray or trainer

    _wrap(tracking.Tracking, "__init__", _installing_step_metrics)


def _installing_step_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self, *args, **kwargs):
        try:
            install_step_metrics()
        except Exception:  # noqa: BLE001 - metrics must never stop the trainer's logger
            logger.exception("grrm: could not add the bridge's counters to verl's step metrics")
        original(self, *args, **kwargs)

    return __init__


def install_step_metrics() -> list[str]:
    """Wrap the step-metric computation of each verl trainer imported in this process; returns their names."""
    wrapped = []
    for name in TRAINER_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if name == V1_TRAINER:
            done = _wrap(module.PPOTrainer, "_compute_metrics", _v1_compute_metrics)
        else:
            done = _wrap(module, "compute_data_metrics", _legacy_compute_data_metrics)
        if done:
            wrapped.append(name)
    return wrapped


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
