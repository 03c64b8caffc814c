"""GRRM rewards for slime, as its custom group reward model::

    GRRM_URL=http://grrm-head:8000 python train.py ... \
        --custom-rm-path grrm_client.adapters.slime.group_rm --group-rm

slime (``slime/rollout/rm_hub``, ``sglang_rollout.py``) gathers the ``n_samples_per_prompt``
generations of a prompt and, with ``--group-rm``, awaits ``group_rm(args, samples)`` once per group;
it wants one float per sample. A ``Sample`` carries ``group_index`` (shared by the group), ``index``,
``prompt``, ``response``, ``label`` and ``metadata``.

The adapter's settings come from the environment of slime's rollout process, as
``GRRM_<FIELD>`` for every field of :class:`SlimeRewardConfig` (``GRRM_URL`` or ``GRRM_APP_NAME``
says where the service is; ``GRRM_EXTRACTOR``, ``GRRM_DEFAULT_REWARD``, ...). A sample's source text
and languages come from its ``metadata`` (keys ``source``, ``src_lang``, ``trg_lang`` by default),
else from its ``label`` when that is a JSON object with those keys. The group is one whole-group
request under ``{run_id}:{group_index}:{call}`` (``call`` counts this process's calls, so a group
asked for again is scored again, never read from an earlier verdict).

slime takes floats only: a reward that could not be obtained is ``default_reward``, flagged in the
sample's ``metadata["grrm_failure"]`` (the reason) and logged once per reason; never a hang past
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
from grrm_client.adapters.pipeline import FailureLog, reward_group
from grrm_client.reward_client import RewardClient

__all__ = ["SlimeRewardConfig", "group_rm", "reset", "sample_languages"]

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


def sample_languages(sample: Any, config: AdapterConfig) -> tuple[str, str, str]:
    """(source, src_lang, trg_lang) of a slime sample: from its metadata, else its JSON label."""
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


async def group_rm(args: Any, samples: Sequence[Any]) -> list[float]:
    """slime's group reward model: one GRRM comparison of a prompt's samples, one float each."""
    config, client = _adapter()
    if not samples:
        return []
    source, src_lang, trg_lang = sample_languages(samples[0], config)
    for sample in samples[1:]:
        if sample_languages(sample, config) != (source, src_lang, trg_lang):
            raise ValueError(f"{config.source_key}: the samples of group {samples[0].group_index} disagree on "
                             "their source or languages")
    _state["calls"] += 1
    scored = await reward_group(
        client,
        group_id=f"{_state['run_id']}:{samples[0].group_index}:{_state['calls']}",
        source=source,
        src_lang=src_lang,
        trg_lang=trg_lang,
        completions=[read_completion(str(sample.response or ""), config.extractor, config.max_text_chars)
                     for sample in samples],
        settings=config.reward_settings(),
    )
    for sample, outcome in zip(samples, scored.outcomes, strict=True):
        if isinstance(getattr(sample, "metadata", None), dict):
            sample.metadata["grrm_failure"] = outcome.failure or ""
        if _state["failures"].first(outcome):
            call = scored.call
            detail = (call.error if call.result is None else call.result.error) if call is not None else ""
            logger.warning("grrm: default reward %s for %s: %s (logged once per reason; flagged in "
                           "metadata['grrm_failure'])", config.default_reward, outcome.failure, detail or "-")
    return [outcome.reward for outcome in scored.outcomes]
