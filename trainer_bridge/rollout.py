"""Reading one verl rollout row: its group, its position, its source, its translation.

A row is a ``DataProtoItem`` (``data[i]``): ``batch["responses"]`` (right-padded token ids),
``batch["attention_mask"]`` (prompt + response), and ``non_tensor_batch`` (``uid``, the dataset's
``extra_info``, verl's ``priority``, ...). Everything here is a plain function of the row and the
:class:`~trainer_bridge.config.BridgeConfig`.

The rollout's index within its group (the member API needs one) is derived, not assigned:
verl 0.9.1 repeats each prompt ``n`` times with ``interleave=True`` and then numbers the rows
``0..N-1`` in ``non_tensor_batch["priority"]`` (``AgentLoopManager.generate_sequences``, before
it splits the batch over agent-loop workers). The ``n`` rollouts of prompt ``k`` thus hold
priorities ``k*n .. k*n+n-1`` and ``priority % n`` is the rollout's position ``j``: unique within
the ``uid`` group, the same on every worker and every retry, and the same order the whole-batch
path sees the rows in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster import gqm, schema
from trainer_bridge.config import BridgeConfig, lookup
from trainer_bridge.rewards import INVALID_EXTRACTION, INVALID_TEXT

__all__ = ["Rollout", "group_size_of", "read_rollout", "response_length", "rollout_index", "row_field"]

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Rollout:
    """What the bridge needs from one row."""

    uid: str
    source: str
    src_lang: str
    trg_lang: str
    response: str  # decoded response (special tokens skipped)
    length: int  # response tokens (valid, i.e. unpadded)
    extracted: bool  # the extractor found a translation
    candidate: str | None  # the text to show the reward model; None = invalid rollout
    invalid_reason: str | None  # why candidate is None (invalid_extraction, invalid_text)


def row_field(non_tensor: Mapping[str, Any], dotted: str, default: Any = _MISSING) -> Any:
    """``non_tensor["a"]["b"]`` for ``"a.b"``; ``default`` (or a KeyError naming the key) if absent."""
    value = lookup(non_tensor, dotted)
    if value is None:
        if default is _MISSING:
            raise KeyError(
                f"row has no {dotted!r} (non_tensor_batch keys: {sorted(non_tensor)}); "
                "set the bridge's *_key options to where your dataset keeps it"
            )
        return default
    return value.item() if hasattr(value, "item") and getattr(value, "shape", None) == () else value


def response_length(item: Any) -> int:
    """Valid response tokens of a row: the response part of its attention mask."""
    responses = item.batch["responses"]
    width = responses.shape[-1]
    return int(item.batch["attention_mask"][-width:].sum())


def group_size_of(non_tensor: Mapping[str, Any], config: BridgeConfig) -> int:
    """The row's group size: its own override (``group_size_key``), else the configured one."""
    if config.group_size_key:
        override = row_field(non_tensor, config.group_size_key, None)
        if override is not None:
            return int(override)
    if config.group_size is None:
        raise ValueError("group_size: not configured (set it, or actor_rollout_ref.rollout.n in the trainer config)")
    return config.group_size


def rollout_index(non_tensor: Mapping[str, Any], group_size: int, key: str = "priority") -> int:
    """The rollout's position in its group: ``int(row[key]) % group_size`` (see the module docstring)."""
    value = row_field(non_tensor, key)
    return int(value) % group_size


def _or_missing(value: Any) -> Any:
    return _MISSING if value is None else value


def _sendable(text: str, max_chars: int) -> bool:
    """Whether the service takes this text as a candidate (the schema's own checks: valid
    Unicode, no control characters, not blank), within the configured length."""
    if len(text) > max_chars:
        return False
    try:
        schema._check_not_blank(schema._check_text(text))
    except ValueError:
        return False
    return True


def read_rollout(item: Any, config: BridgeConfig, tokenizer: Any) -> Rollout:
    """Decode, measure and extract one row (a ``DataProtoItem``)."""
    non_tensor = item.non_tensor_batch
    length = response_length(item)
    response_ids = item.batch["responses"][:length]
    response = tokenizer.decode(response_ids, skip_special_tokens=True)
    translation = gqm.extract_translation(response, config.extractor)
    candidate, reason = translation, None
    if translation is None:
        reason = INVALID_EXTRACTION
    elif not _sendable(translation, config.max_text_chars):
        candidate, reason = None, INVALID_TEXT
    return Rollout(
        uid=str(row_field(non_tensor, config.uid_key)),
        source=str(row_field(non_tensor, config.source_key)),
        src_lang=str(row_field(non_tensor, config.src_lang_key, _or_missing(config.src_lang))),
        trg_lang=str(row_field(non_tensor, config.trg_lang_key, _or_missing(config.trg_lang))),
        response=response,
        length=length,
        extracted=translation is not None,
        candidate=candidate,
        invalid_reason=reason,
    )
