"""Where an engine's model comes from, found before the engine starts.

An engine given a model it cannot find fails deep in its start, minutes in, with an error about a
file or a connection. :func:`resolve_model` answers first, in seconds: a local directory holding a
``config.json``; a Hugging Face hub id already in the hub cache; or a hub id the hub serves (one
request for its ``config.json``, which the memory estimate of ``grrm check`` reads too). Anything
else raises :class:`ModelNotFoundError` naming ``engine.model`` and what to do. Where the model is on
this machine, it also says whether its weights are all there (:func:`find_weights`: the shards
``model.safetensors.index.json`` lists), so that an interrupted download is seen before every replica
resumes it into a shared cache at once.

``huggingface_hub`` (a dependency of every engine) is imported inside the functions: the client
side of the project imports this package without it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from cluster.engines.base import EngineError

__all__ = ["HUB_TIMEOUT_S", "ModelNotFoundError", "ModelSource", "Weights", "find_weights", "hub_cache_dir",
           "hub_offline", "is_hub_id", "resolve_model"]

# One request to the hub, no retries: a pre-flight answers in seconds (huggingface_hub's own download
# retries for ~25 s where the hub cannot be reached).
HUB_TIMEOUT_S = 10.0
_CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
_SINGLE_FILE = "model.safetensors"
# A sharded checkpoint's files: model-00001-of-00004.safetensors.
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<number>\d+)-of-(?P<total>\d+)\.safetensors$")


class ModelNotFoundError(EngineError):
    """``engine.model`` names no model this machine can load; the message says why and what to do."""


@dataclass(frozen=True)
class Weights:
    """A checkpoint's weight files: those it lists (its safetensors index, or its shards' names), and
    those of them that are not there."""

    listed: tuple[str, ...]
    missing: tuple[str, ...]
    complete: bool
    how: str  # where the list came from, or what was found instead


@dataclass(frozen=True)
class ModelSource:
    """Where the model was found, its ``config.json`` (its architecture: layers, heads, sizes), and its
    weights there (None: on the hub, nothing on this machine yet)."""

    kind: Literal["directory", "hub_cache", "hub"]
    location: str  # the directory, the cached config file's snapshot, or the hub id
    config: dict[str, Any]
    weights: Weights | None = None


def find_weights(directory: Path) -> Weights:
    """Which weight files the checkpoint in ``directory`` lists, and which of them are missing (a file
    counts where it opens: a hub-cache link to a blob never downloaded does not)."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            listed = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            return Weights((), (), False, f"{INDEX_FILE} cannot be read ({type(error).__name__}: {error})")
        missing = tuple(name for name in listed if not (directory / name).is_file())
        return Weights(tuple(listed), missing, not missing, INDEX_FILE)
    if (directory / _SINGLE_FILE).is_file():
        return Weights((_SINGLE_FILE,), (), True, _SINGLE_FILE)
    shards = [match for path in sorted(directory.glob("*.safetensors")) if (match := _SHARD.match(path.name))]
    if shards:
        first = shards[0]
        width, total = len(first["number"]), first["total"]
        listed = [f"{first['stem']}-{number:0{width}d}-of-{total}.safetensors" for number in range(1, int(total) + 1)]
        missing = tuple(name for name in listed if not (directory / name).is_file())
        return Weights(tuple(listed), missing, not missing, f"the shards' names (no {INDEX_FILE})")
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        return Weights((), (), True, "PyTorch weight files (not checked one by one)")
    return Weights((), (), False, "no weight files (*.safetensors)")


def hub_cache_dir() -> Path:
    """The hub cache, as the environment says now (``HF_HUB_CACHE``, else ``HF_HOME``/hub), else as
    huggingface_hub read it at its import."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _looks_like_path(model: str) -> bool:
    # A hub id is `name` or `owner/name`; anything else with a slash, or starting like a path, is a path.
    return model.startswith(("/", ".", "~")) or model.count("/") > 1


def is_hub_id(model: str) -> bool:
    """Whether ``model`` is taken as a hub id (it is no directory here and does not read as a path)."""
    return bool(model) and not Path(model).expanduser().exists() and not _looks_like_path(model)


def _read_config(path: Path, model: str, field: str) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"{field}: {model!r}: its {_CONFIG_FILE} cannot be read ({error})") from error
    if not isinstance(config, dict):
        raise ModelNotFoundError(f"{field}: {model!r}: its {_CONFIG_FILE} is not a JSON object")
    return config


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (read now, not at huggingface_hub's import; its truthy spellings)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def resolve_model(model: str, *, field: str = "engine.model", timeout_s: float = HUB_TIMEOUT_S) -> ModelSource:
    """Find ``model`` (a directory or a hub id) without loading it; raise :class:`ModelNotFoundError`.

    ``field`` is the config key the messages name. Honours ``HF_HOME``/``HF_HUB_CACHE`` (the cache),
    ``HF_HUB_OFFLINE`` (no request to the hub), ``HF_ENDPOINT`` and ``HF_TOKEN`` (gated models).
    """
    if not model:
        raise ModelNotFoundError(f"{field}: empty; give a local model directory or a Hugging Face hub id")
    path = Path(model).expanduser()
    if path.is_dir():
        config = path / _CONFIG_FILE
        if not config.is_file():
            raise ModelNotFoundError(f"{field}: the directory {model!r} holds no {_CONFIG_FILE}: not a model "
                                     "checkpoint (save_pretrained writes one)")
        return ModelSource("directory", str(path), _read_config(config, model, field), find_weights(path))
    if _looks_like_path(model) or path.exists():
        raise ModelNotFoundError(f"{field}: {model!r} is not a directory on this machine (a relative path is "
                                 "relative to the project root); copy the checkpoint there or give its hub id")
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    cache = hub_cache_dir()
    try:
        cached = try_to_load_from_cache(model, _CONFIG_FILE, cache_dir=cache)
    except HFValidationError as error:
        raise ModelNotFoundError(f"{field}: {model!r} is neither a directory nor a valid hub id ({error})") from error
    if isinstance(cached, str):
        snapshot = Path(cached).parent
        return ModelSource("hub_cache", str(snapshot), _read_config(Path(cached), model, field), find_weights(snapshot))
    if hub_offline():
        raise ModelNotFoundError(
            f"{field}: {model!r} is not in the hub cache ({cache}) and HF_HUB_OFFLINE is set: download it there "
            f"first (`hf download {model}` where the hub is reachable, with the same HF_HOME), or unset "
            "HF_HUB_OFFLINE")
    return _ask_hub(model, field, cache, timeout_s)


def _ask_hub(model: str, field: str, cache: Path, timeout_s: float) -> ModelSource:
    from huggingface_hub import constants, get_token

    url = f"{constants.ENDPOINT.rstrip('/')}/{model}/resolve/main/{_CONFIG_FILE}"
    token = get_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s, follow_redirects=True)
    except httpx.HTTPError as error:
        raise ModelNotFoundError(
            f"{field}: {model!r} is not in the hub cache ({cache}) and the hub ({constants.ENDPOINT}) cannot be "
            f"reached ({type(error).__name__}: {error}): download it into the cache (HF_HOME) or a directory "
            "first, or give this machine access to the hub") from error
    if response.status_code in (401, 403, 404):
        # The hub answers 401 for a repository that does not exist as for a private one.
        access = "with the token given" if token else "without a token (HF_TOKEN)"
        raise ModelNotFoundError(
            f"{field}: the hub has no model {model!r} that it serves {access} (HTTP {response.status_code}): check "
            "the id (GRRM's checkpoint is double7/Qwen2.5-7B-GRRM), or set HF_TOKEN for a gated or private model")
    if response.status_code != 200:
        raise ModelNotFoundError(f"{field}: the hub answered HTTP {response.status_code} for {model!r}'s "
                                 f"{_CONFIG_FILE}; try again, or download the model into the cache first")
    try:
        config = response.json()
    except ValueError as error:
        raise ModelNotFoundError(f"{field}: the hub's {_CONFIG_FILE} of {model!r} is not JSON") from error
    return ModelSource("hub", model, config if isinstance(config, dict) else {})
