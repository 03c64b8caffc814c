"""Reading one verl rollout row: its group, its position, its source, reference and notes, its translation.

A row is a ``DataProtoItem`` (``data[i]``): ``batch["responses"]`` (right-padded token ids),
``batch["attention_mask"]`` (prompt + response), and ``non_tensor_batch`` (``uid``, the dataset's
``extra_info``, verl's ``session_id`` or ``priority``, ...). Everything here is a plain function of the row and the
:class:`~grrm_client.adapters.verl.config.BridgeConfig`.

The rollout's index within its group (the member API needs one) is derived, not assigned, from
what each of verl 0.9.1's trainers puts in the row (:func:`rollout_index`):

* the default (v1) trainer runs the ``n`` rollouts of a prompt as sessions ``0..n-1`` that share
  the prompt's ``uid`` and gives each row its ``session_id``
  (``verl/trainer/ppo/v1/agent_loop_tq.py``, ``_run_prompt``): the index is ``session_id``;
* the legacy trainer (``trainer.use_v1=False``, ``experimental/agent_loop``) repeats each prompt
  ``n`` times with ``interleave=True`` (the ``uid`` is set before, so the copies share it) and then
  numbers the rows ``0..N-1`` in ``priority`` (``AgentLoopManager.generate_sequences``, before it
  splits the batch over agent-loop workers): the ``n`` rollouts of prompt ``k`` hold priorities
  ``k*n .. k*n+n-1`` and the index is ``priority % n``.

Either way the index is unique within the ``uid`` group, the same on every worker and every retry.
``BridgeConfig.index_key`` names another key instead (its value modulo the group size).

A row may carry no position at all: ``experimental/fully_async_policy`` repeats each sample ``n``
times itself (``detach_utils.prepare_single_generation_data``) and calls the agent-loop worker
directly, so its rows have neither ``session_id`` nor ``priority``, and their ``index`` (the
dataset row) is the same for all ``n`` copies. :func:`rollout_index` then returns None and the
member is sent with an id of its own instead (``MemberRequest.member_id``): the service orders such
a group's candidates by their texts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cluster.rewards import Completion, read_completion
from cluster.protocol.members import NO_CONTEXT, RowContext
from grrm_client.adapters.verl.config import BridgeConfig, lookup

__all__ = [
    "PRIORITY_KEY",
    "Rollout",
    "SESSION_KEY",
    "group_size_of",
    "read_rollout",
    "response_length",
    "rollout_index",
    "row_field",
]

_MISSING = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class Rollout(Completion):
    """One row as the bridge reads it: its completion (what the pipeline sends and rewards) and where
    its group, source, languages, reference and notes are."""

    uid: str
    source: str
    src_lang: str
    trg_lang: str
    response: str  # decoded response (special tokens skipped)
    context: RowContext = NO_CONTEXT  # the row's reference and notes (ref_text_key, ref_lang_key, notes_key)


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


# Where each verl trainer keeps the rollout's position (see the module docstring), in lookup order.
SESSION_KEY = "session_id"  # default (v1) trainer: the position itself
PRIORITY_KEY = "priority"  # legacy agent loop: position = priority % group size


def rollout_index(non_tensor: Mapping[str, Any], group_size: int, key: str | None = None) -> int | None:
    """The rollout's position in its group (see the module docstring), or None when the row has none.

    ``key`` None: ``session_id`` when the row has one (it must be below ``group_size``), else
    ``priority % group_size``, else None (fully_async_policy's rows). A named ``key``:
    ``int(row[key]) % group_size``; a row without it raises a KeyError naming what it has.
    """
    if key is None:
        session = row_field(non_tensor, SESSION_KEY, None)
        if session is not None:
            index = _integer(SESSION_KEY, session)
            if not 0 <= index < group_size:
                raise ValueError(
                    f"{SESSION_KEY}: {index} is not a position in a group of {group_size} rollouts "
                    "(is the group size the trainer's rollout.n? set reward_kwargs.group_size or index_key)"
                )
            return index
        key = PRIORITY_KEY
        if row_field(non_tensor, key, None) is None:
            return None
    return _integer(key, row_field(non_tensor, key)) % group_size


def _integer(key: str, value: Any) -> int:
    """An integral row value (numpy or Python, int or whole float) as an int; else a ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
    if value != int(value):
        raise ValueError(f"{key}: expected an integer, got {value!r}")
    return int(value)


def _or_missing(value: Any) -> Any:
    return _MISSING if value is None else value


def read_rollout(item: Any, config: BridgeConfig, tokenizer: Any) -> Rollout:
    """Decode, measure and extract one row (a ``DataProtoItem``)."""
    non_tensor = item.non_tensor_batch
    length = response_length(item)
    response_ids = item.batch["responses"][:length]
    response = tokenizer.decode(response_ids, skip_special_tokens=True)
    completion = read_completion(response, config.extractor, config.max_text_chars, length)
    return Rollout(
        uid=str(row_field(non_tensor, config.uid_key)),
        source=str(row_field(non_tensor, config.source_key)),
        src_lang=str(row_field(non_tensor, config.src_lang_key, _or_missing(config.src_lang))),
        trg_lang=str(row_field(non_tensor, config.trg_lang_key, _or_missing(config.trg_lang))),
        response=response,
        context=RowContext.of(*(row_field(non_tensor, key, None)
                                for key in (config.ref_text_key, config.ref_lang_key, config.notes_key))),
        length=length,
        extracted=completion.extracted,
        candidate=completion.candidate,
        invalid_reason=completion.invalid_reason,
    )
