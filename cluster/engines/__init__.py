"""Inference engines behind one interface (:class:`~cluster.engines.base.Engine`).

Engines are imported lazily: the vLLM and SGLang packages exist only where they can run, and
the trainer side imports none of them.
"""

from __future__ import annotations

import importlib

from cluster.engines.base import (
    Engine,
    EngineDeadError,
    EngineError,
    EngineUnsupportedError,
    Generation,
    SamplingSettings,
    SleepingEngine,
    apply_chat_template,
    count_tokens,
)
from cluster.engines.config import EngineConfig, EngineKind, ScriptedEngineOptions


# kind -> "module:Class"; each class is built as Class(config: EngineConfig).
ENGINE_CLASSES: dict[str, str] = {
    "vllm": "cluster.engines.vllm:VLLMEngine",
    "sglang": "cluster.engines.sglang:SGLangEngine",
    "transformers": "cluster.engines.transformers:TransformersEngine",
    "scripted": "simulated.scripted_engine:ScriptedEngine",
}


def make_engine(config: EngineConfig) -> Engine:
    """Build (not start) the engine ``config.kind`` names."""
    module_name, class_name = ENGINE_CLASSES[config.kind].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if config.kind == "scripted" and error.name in ("simulated", module_name):
            # Test support is not in the wheel: the scripted engine runs from a checkout only.
            raise EngineError(
                "engine kind 'scripted' is the project's test support (simulated/), which an installed "
                "package does not include: run from a checkout of the project (scripts/setup_env.sh)"
            ) from error
        raise
    return getattr(module, class_name)(config)


__all__ = [
    "ENGINE_CLASSES",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineKind",
    "EngineUnsupportedError",
    "Generation",
    "SamplingSettings",
    "ScriptedEngineOptions",
    "SleepingEngine",
    "apply_chat_template",
    "count_tokens",
    "make_engine",
]
