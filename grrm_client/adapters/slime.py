"""GRRM rewards for slime, as its custom group reward model::

    GRRM_URL=http://grrm-head:8000 python train.py ... \
        --custom-rm-path grrm_client.adapters.slime.group_rm --group-rm

slime (``slime/rollout/rm_hub``, ``sglang_rollout.py``) gathers the ``n_samples_per_prompt``
generations of a prompt and, with ``--group-rm``, awaits ``group_rm(args, samples)`` once per group;
it wants one float per sample. A ``Sample`` carries ``group_index`` (shared by the group), ``index``,
``prompt``, ``response``, ``label`` and ``metadata``.

The adapter's settings come from the environment of slime's rollout process, as
``GRRM_<FIELD>`` for every field of :class:`SlimeRewardConfig` (``GRRM_URL`` or ``GRRM_APP_NAME``
says where the service is; ``GRRM_EXTRACTOR``, ``GRRM_DEFAULT_REWARD``, ...). A sample's source text,
languages, reference and notes come from its ``metadata`` (keys ``source``, ``src_lang``, ``trg_lang``,
``ref_text``, ``ref_lang``, ``notes`` by default; the last three optional), else from its ``label``
when that is a JSON object with those keys; its ``response_length`` goes with it for the recipe's
``overlong`` part. The group is one whole-group request under ``{run_id}:{group_index}:{call}``
(``call`` counts this process's calls, so a group asked for again is scored again, never read from
an earlier verdict); its samples go as members when one holds no translation.

The reward is the one the service's recipe composed (``docs/recipes.md``); its parts go into the
sample's ``metadata["grrm_components"]``. slime logs them per rollout step as
``grrm/component/<name>/mean`` with ``--custom-rollout-log-function-path
grrm_client.adapters.slime.log_rollout`` (:func:`rollout_metrics` for a log function of your own).
slime takes floats only: a reward that got no answer is ``default_reward``, flagged in the sample's
``metadata["grrm_failure"]`` (the reason) and logged once per reason; never a hang past
``GRRM_DEADLINE_S``.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import model_validator

from cluster.rewards import read_completion
from grrm_client.adapters import AdapterConfig
from cluster.protocol.members import FailureLog, RowContext, component_means, components_of
from grrm_client.adapters.pipeline import reward_group
from grrm_client.adapters.verl.metrics import RewardCounters
from grrm_client.reward_client import RewardClient

__all__ = ["SlimeRewardConfig", "group_rm", "log_rollout", "reset", "rollout_metrics", "sample_context",
           "sample_languages"]

logger = logging.getLogger(__name__)

ENV_PREFIX = "GRRM_"


class SlimeRewardConfig(AdapterConfig):
    """The slime adapter's settings (``GRRM_<FIELD>`` in the environment; ``GRRM_URL`` is ``http_url``)."""

    @model_validator(mode="before")
    @classmethod
    def _transport_from_where(cls, values: Any) -> Any:
        # GRRM_URL means HTTP, GRRM_APP_NAME alone a Serve handle on this Ray cluster.
        if isinstance(values, dict) and "transport" not in values:
            values = {**values, "transport": "http" if "http_url" in values else "handle"}
        return values

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SlimeRewardConfig:
        """Read ``GRRM_<FIELD>`` variables (``GRRM_URL`` for ``http_url``); other ``GRRM_`` variables
        (the bearer token, the tiny model's directory, ...) are not settings and are left alone."""
        environ = os.environ if environ is None else environ
        names = {f"{ENV_PREFIX}{name.upper()}": name for name in cls.model_fields}
        names[f"{ENV_PREFIX}URL"] = "http_url"
        values: dict[str, Any] = {}
        for variable, value in environ.items():
            if variable in names:
                values[names[variable]] = value
        if "http_url" not in values and "app_name" not in values:
            raise ValueError("GRRM_URL: set it to the reward service's URL (or GRRM_APP_NAME to a Serve app "
                             "on this Ray cluster)")
        return cls.model_validate(values)


_state: dict[str, Any] = {}  # this process's config, client, run id and call count


def reset() -> None:
    """Forget the settings read from the environment (the next call reads them again)."""
    _state.clear()


def _adapter() -> tuple[SlimeRewardConfig, RewardClient]:
    if "client" not in _state:
        config = SlimeRewardConfig.from_env()
        _state.update(config=config, client=RewardClient(config), calls=0, failures=FailureLog(),
                      run_id=config.run_id or f"slime-{uuid.uuid4().hex[:12]}")
    return _state["config"], _state["client"]


def _places(sample: Any) -> list[Mapping[str, Any]]:
    """Where a slime sample keeps its row's fields: its metadata, then its label (a mapping or JSON text)."""
    places: list[Mapping[str, Any]] = []
    if isinstance(getattr(sample, "metadata", None), Mapping):
        places.append(sample.metadata)
    label = getattr(sample, "label", None)
    if isinstance(label, Mapping):
        places.append(label)
    elif isinstance(label, str) and label.lstrip().startswith("{"):
        try:
            places.append(json.loads(label))
        except ValueError:
            pass
    return [place for place in places if isinstance(place, Mapping)]


def sample_languages(sample: Any, config: AdapterConfig) -> tuple[str, str, str]:
    """(source, src_lang, trg_lang) of a slime sample: from its metadata, else its JSON label."""
    places = _places(sample)

    def find(key: str, default: str | None) -> str:
        for place in places:
            if place.get(key) is not None:
                return str(place[key])
        if default is None:
            raise ValueError(f"{key}: the sample carries none in its metadata or its JSON label (set "
                             f"GRRM_{'SOURCE_KEY' if key == config.source_key else 'SRC_LANG / GRRM_TRG_LANG'})")
        return default

    return (find(config.source_key, None), find(config.src_lang_key, config.src_lang),
            find(config.trg_lang_key, config.trg_lang))


def sample_context(sample: Any, config: AdapterConfig) -> RowContext:
    """A slime sample's reference and notes (none where its metadata and label have none)."""
    places = _places(sample)

    def find(key: str) -> Any:
        return next((place[key] for place in places if place.get(key) is not None), None)

    return RowContext.of(find(config.ref_text_key), find(config.ref_lang_key), find(config.notes_key))


async def group_rm(args: Any, samples: Sequence[Any]) -> list[float]:
    """slime's group reward model: one GRRM comparison of a prompt's samples, one float each."""
    config, client = _adapter()
    if not samples:
        return []
    where = (*sample_languages(samples[0], config), sample_context(samples[0], config))
    for sample in samples[1:]:
        if (*sample_languages(sample, config), sample_context(sample, config)) != where:
            raise ValueError(f"{config.source_key}: the samples of group {samples[0].group_index} disagree on "
                             "their source, languages, reference or notes")
    source, src_lang, trg_lang, context = where
    _state["calls"] += 1
    scored = await reward_group(
        client,
        group_id=f"{_state['run_id']}:{samples[0].group_index}:{_state['calls']}",
        source=source,
        src_lang=src_lang,
        trg_lang=trg_lang,
        completions=[read_completion(str(sample.response or ""), config.extractor, config.max_text_chars,
                                     int(getattr(sample, "response_length", 0) or 0))
                     for sample in samples],
        settings=config.reward_settings(),
        context=context,
    )
    for sample, outcome in zip(samples, scored.outcomes, strict=True):
        if isinstance(getattr(sample, "metadata", None), dict):
            sample.metadata["grrm_failure"] = outcome.failure or ""
            sample.metadata["grrm_failed"] = outcome.failed
            sample.metadata["grrm_valid"] = outcome.valid
            sample.metadata["grrm_components"] = dict(components_of(outcome))
        if _state["failures"].first(outcome):
            logger.warning("grrm: default reward %s for %s: %s (logged once per reason; flagged in "
                           "metadata['grrm_failure'])", outcome.reward, outcome.failure, scored.error or "-")
    return [outcome.reward for outcome in scored.outcomes]


_OUTCOME_COUNTS = ("grrm/rewards", "grrm/valid", "grrm/failed", "grrm/valid_rate", "grrm/failed_rate")


def rollout_metrics(samples: Sequence[Any]) -> dict[str, float]:
    """A rollout step's ``grrm/...`` metrics from its samples (those :func:`group_rm` rewarded): the counts
    by outcome (``grrm/valid``, ``grrm/failed``, ``grrm/default/<reason>``, ...) and each recipe part
    (``grrm/component/<name>/mean``), named as verl's and TRL's are; {} when no sample is ours."""
    ours = [sample.metadata for sample in samples
            if isinstance(getattr(sample, "metadata", None), Mapping) and "grrm_components" in sample.metadata]
    if not ours:
        return {}
    counters = RewardCounters()
    for metadata in ours:
        counters.total += 1
        counters.valid += bool(metadata.get("grrm_valid"))
        counters.failed += bool(metadata.get("grrm_failed"))
        if metadata.get("grrm_failure"):
            counters.defaults[str(metadata["grrm_failure"])] += 1
    # slime's samples carry no transport attempts or worker counts: only the counts by outcome.
    counts = {name: value for name, value in counters.as_metrics().items()
              if name.startswith("grrm/default/") or name in _OUTCOME_COUNTS}
    return {**counts, **component_means(metadata["grrm_components"] for metadata in ours)}


def log_rollout(rollout_id: int, args: Any, samples: Sequence[Any], rollout_extra_metrics: Any,
                rollout_time: float) -> bool:
    """slime's custom rollout log function (``--custom-rollout-log-function-path
    grrm_client.adapters.slime.log_rollout``): adds :func:`rollout_metrics` to the step's metrics and
    returns False, so that slime logs the step as it always does, these included."""
    metrics = rollout_metrics(samples)
    if not metrics:
        return False
    if isinstance(rollout_extra_metrics, dict):
        rollout_extra_metrics.update(metrics)  # slime logs {**rollout_extra_metrics, ...} next
        return False
    # slime passed no dict to add to: log them at the step slime logs its own under.
    from slime.utils import logging_utils
    from slime.utils.metric_utils import compute_rollout_step

    logging_utils.log(args, {**metrics, "rollout/step": compute_rollout_step(args, rollout_id)},
                      step_key="rollout/step")
    return False
