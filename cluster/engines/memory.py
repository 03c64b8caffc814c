"""How much GPU memory one engine rank needs: weights, a KV cache for ``max_model_len``, activations.

Estimated from the model's ``config.json`` (a dense decoder: Qwen2, Llama, Mistral and the like),
without loading it, so ``grrm check`` and a replica's start can refuse a GPU that cannot hold the
engine before the engine tries (vLLM fails minutes in when the KV cache cannot hold one sequence of
``max_model_len`` tokens). An estimate: vLLM's own profiling decides the final KV cache. Pure
arithmetic: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GIB", "MemoryPlan", "ModelShape", "dtype_bytes", "plan_memory", "shared_memory_bytes"]

GIB = 1024**3
# Per rank, besides weights, KV cache and activations: the CUDA context, NCCL buffers, CUDA graphs
# and the allocator's slack (vLLM's non-torch memory is typically 1-2 GiB).
RANK_OVERHEAD_BYTES = 2 * GIB
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "float8": 1}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a dense decoder-only transformer, from its ``config.json``."""

    layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    torch_dtype: str | None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape | None:
        """The shape in a ``config.json`` (a multimodal one's ``text_config``); None when it lacks the sizes."""
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        try:
            heads = int(text["num_attention_heads"])
            hidden = int(text["hidden_size"])
            return cls(
                layers=int(text["num_hidden_layers"]),
                hidden_size=hidden,
                intermediate_size=int(text["intermediate_size"]),
                vocab_size=int(text["vocab_size"]),
                attention_heads=heads,
                kv_heads=int(text.get("num_key_value_heads") or heads),
                head_dim=int(text.get("head_dim") or hidden // heads),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
                max_position_embeddings=_optional_int(text.get("max_position_embeddings")),
                torch_dtype=config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype"),
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None

    def parameters(self) -> int:
        """Parameters: embeddings, attention (biases included) and gated MLP per layer, norms, the LM head."""
        kv_width = self.kv_heads * self.head_dim
        q_width = self.attention_heads * self.head_dim
        attention = self.hidden_size * (q_width + 2 * kv_width) + (q_width + 2 * kv_width) + q_width * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attention + mlp + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embeddings
        return embeddings + self.layers * per_layer + self.hidden_size + head

    def kv_bytes_per_token(self, element_bytes: int, tensor_parallel_size: int = 1,
                           pipeline_parallel_size: int = 1) -> int:
        """KV cache bytes one token takes on one rank (keys and values of its layers and KV heads; a KV
        head is replicated on ranks where TP exceeds the KV heads)."""
        layers = -(-self.layers // pipeline_parallel_size)
        kv_heads = -(-self.kv_heads // tensor_parallel_size)
        return 2 * layers * kv_heads * self.head_dim * element_bytes


def _optional_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def dtype_bytes(dtype: str, shape: ModelShape) -> int:
    """Bytes per weight for an engine ``dtype`` (``auto``: the checkpoint's, where it says; else 2)."""
    name = (shape.torch_dtype or "bfloat16") if dtype == "auto" else dtype
    return _DTYPE_BYTES.get(str(name).lower().removeprefix("torch."), 2)


@dataclass(frozen=True)
class MemoryPlan:
    """What one rank of an engine needs and can keep for its KV cache on a GPU of ``gpu_bytes``."""

    weights_bytes: int  # this rank's share
    activation_bytes: int  # a prefill step of max_num_batched_tokens, and the overhead
    kv_bytes_per_sequence: int  # this rank's share of one max_model_len sequence
    budget_bytes: int  # gpu_memory_utilization x the GPU's memory
    max_model_len: int

    @property
    def kv_cache_bytes(self) -> int:
        """What is left for the KV cache (negative: not even the weights fit)."""
        return self.budget_bytes - self.weights_bytes - self.activation_bytes

    @property
    def full_sequences(self) -> float:
        """How many max_model_len sequences the KV cache holds (vLLM needs at least one)."""
        return self.kv_cache_bytes / self.kv_bytes_per_sequence if self.kv_bytes_per_sequence else float("inf")

    @property
    def fits(self) -> bool:
        """Whether the engine can start: its KV cache holds at least one max_model_len sequence."""
        return self.full_sequences >= 1


def plan_memory(shape: ModelShape, *, dtype: str, max_model_len: int, tensor_parallel_size: int,
                pipeline_parallel_size: int, max_num_batched_tokens: int, gpu_bytes: int,
                gpu_memory_utilization: float) -> MemoryPlan:
    """One rank's memory on a GPU of ``gpu_bytes``: weights and KV heads split over the TP ranks, layers
    over the PP ranks (evenly, as an estimate)."""
    element = dtype_bytes(dtype, shape)
    split = tensor_parallel_size * pipeline_parallel_size
    # A prefill step's largest live tensors: the MLP's gate and up projections of every token in it.
    activations = max_num_batched_tokens * (2 * shape.intermediate_size + 4 * shape.hidden_size) * element
    return MemoryPlan(
        weights_bytes=shape.parameters() * element // split,
        activation_bytes=activations // tensor_parallel_size + RANK_OVERHEAD_BYTES,
        kv_bytes_per_sequence=shape.kv_bytes_per_token(element, tensor_parallel_size, pipeline_parallel_size)
        * max_model_len,
        budget_bytes=int(gpu_bytes * gpu_memory_utilization),
        max_model_len=max_model_len,
    )


# vLLM's mp executor passes each step's scheduler output to its ranks through one shared-memory queue
# (10 chunks of VLLM_MQ_MAX_CHUNK_BYTES_MB = 16 MiB) and gets each rank's output back through one of its
# own (10 chunks of 24 MiB): vllm/v1/executor/multiproc_executor.py, distributed/device_communicators/
# shm_broadcast.py (0.32). NCCL's intra-node transport keeps buffers there too: a margin per rank.
_MIB = 1024**2
_BROADCAST_QUEUE_BYTES = 10 * 16 * _MIB
_RANK_QUEUE_BYTES = 10 * 24 * _MIB
_NCCL_MARGIN_BYTES_PER_RANK = 256 * _MIB


def shared_memory_bytes(ranks: int) -> int:
    """The ``/dev/shm`` one engine with ``ranks`` parallel rank processes needs (one rank: none of its own)."""
    if ranks <= 1:
        return 0
    return _BROADCAST_QUEUE_BYTES + ranks * (_RANK_QUEUE_BYTES + _NCCL_MARGIN_BYTES_PER_RANK)
