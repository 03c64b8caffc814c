"""The pre-flight: can this machine run this config's replicas? Each check names what it found, and a
problem names its fix.

``grrm check CONFIG`` runs every check for the node (:func:`check_node`) before ``serve run``; a scorer
replica runs the checks of its own share (:func:`ensure_replica_can_start`) before it builds its engine,
so a bad node fails in seconds, with the same words, instead of minutes into an engine's start. The
judging (:func:`judge`) is pure: it reads :class:`~deployments.node_facts.NodeFacts`, which
``deployments/node_facts.py`` reads off the machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cluster.engines.gpu_devices import Gpu
from cluster.engines.memory import GIB, MemoryPlan, ModelShape, plan_memory, shared_memory_bytes
from cluster.engines.model_source import ModelSource, Weights
from cluster.engines.versions import (DRIVER_FLOORS, ENGINE_PACKAGES, GPU_INSTALL, GPU_INSTALL_CUDA_MAJOR,
                                      driver_branch)
from cluster.protocol.schema import DEFAULT_TOKEN_ENV
from deployments.config import AppConfig
from deployments.http.auth import LOOPBACK_HOSTS, token_variables
from deployments.node_facts import NodeFacts, gather_facts

__all__ = ["Finding", "PreflightError", "Scope", "check_node", "ensure_replica_can_start", "judge", "report"]

Scope = Literal["node", "replica"]
Status = Literal["ok", "problem", "skipped"]
# A vLLM or SGLang engine claims gpu_memory_utilization of each GPU's memory at start.
_CLAIMING_ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Finding:
    """One check's verdict: what it found, and for a problem, what to do."""

    check: str
    status: Status
    found: str
    fix: str = ""

    @property
    def problem(self) -> bool:
        """Whether this finding stops a start."""
        return self.status == "problem"


class PreflightError(RuntimeError):
    """This machine cannot run the config's replica; the message lists each problem with its fix."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("pre-flight failed (grrm check names the same problems):\n" + report(findings, problems_only=True))


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


@dataclass(frozen=True)
class _Context:
    config: AppConfig
    facts: NodeFacts
    scope: Scope
    gpu_nodes: int
    http_host: str | None

    @property
    def uses_gpus(self) -> bool:
        return self.config.replicas.gpus_per_rank > 0

    @property
    def gpus_for_one_replica(self) -> float:
        """GPUs of one replica on this node (the Ray executor's further ranks may be on other nodes)."""
        if self.config.placement.executor == "ray":
            return self.config.replicas.gpus_per_rank
        return self.config.gpus_per_replica

    @property
    def min_replicas(self) -> int:
        replicas = self.config.replicas
        return replicas.autoscaling.min_replicas if replicas.autoscaling is not None else replicas.num_replicas or 1

    @property
    def ranks_here(self) -> int:
        """GPUs one replica holds on this node."""
        return max(1, math.ceil(self.gpus_for_one_replica))

    @property
    def gpu_engine(self) -> bool:
        """Whether an engine that runs on GPUs is asked for (GPUs per rank, and not the scripted one)."""
        return self.uses_gpus and self.config.engine.kind != "scripted"

    @property
    def replicas_here(self) -> int:
        """Replicas this node holds at most (a replica checks its own share: one)."""
        if self.scope == "replica" or not self.uses_gpus:
            return 1
        return int(len(self.facts.gpus) // self.gpus_for_one_replica) if self.gpus_for_one_replica else 1

    @property
    def shape(self) -> ModelShape | None:
        return ModelShape.from_config(self.facts.model.config) if self.facts.model is not None else None

    @property
    def context_tokens(self) -> int | None:
        """The engine's context: engine.max_model_len, else the model's own."""
        shape = self.shape
        return self.config.engine.max_model_len or (shape.max_position_embeddings if shape else None)


def _gpus(context: _Context) -> Finding:
    config, facts = context.config, context.facts
    if not context.uses_gpus:
        return Finding("gpus", "ok", "CPU replicas (replicas.gpus_per_rank 0): no GPU needed")
    if config.engine.kind == "scripted":
        return Finding("gpus", "skipped", "the scripted engine (tests) uses no GPU, whatever its replicas ask Ray for")
    if context.scope == "replica" and config.placement.executor == "ray":
        return Finding("gpus", "skipped", "the Ray executor's ranks hold the GPUs, in the replica's placement group")
    need = context.gpus_for_one_replica
    shown = len(facts.gpus)
    layout = (f"engine.tensor_parallel_size {config.engine.tensor_parallel_size} x pipeline_parallel_size "
              f"{config.engine.pipeline_parallel_size} x replicas.gpus_per_rank {config.replicas.gpus_per_rank:g}")
    if shown < need and facts.gpu_failure is not None:
        return Finding(
            "gpus", "problem", f"nvidia-smi fails here ({facts.gpu_failure}): the NVIDIA driver does not answer, and "
            f"one replica needs {math.ceil(need)} GPU(s) ({layout})",
            "repair the node's NVIDIA driver until `nvidia-smi` lists the GPUs (a 'Driver/library version mismatch' "
            "follows a driver upgrade without a reboot: reboot the node, or reload the nvidia kernel modules)")
    if shown < need:
        return Finding(
            "gpus", "problem", f"this machine shows {shown} GPU(s) ({facts.gpu_note}); one replica needs "
            f"{math.ceil(need)} ({layout})",
            f"run on a node with {math.ceil(need)} or more NVIDIA GPUs visible (`nvidia-smi` lists them; "
            "CUDA_VISIBLE_DEVICES must not hide them), or lower engine.tensor_parallel_size")
    migs = sorted({gpu.mig_profile for gpu in facts.gpus if gpu.mig_profile})
    if migs and context.ranks_here > 1:
        return Finding(
            "gpus", "problem", f"the CUDA devices here are MIG devices ({', '.join(migs)}; {facts.gpu_note}); one "
            f"replica runs {context.ranks_here} ranks ({layout}), and MIG devices do not run ranks together (a CUDA "
            "process enumerates one MIG device; MIG devices have no peer-to-peer)",
            "give the replicas whole GPUs (MIG off: `nvidia-smi -i <gpu> -mig 0`, as root, with the GPU idle), or "
            "run engine.tensor_parallel_size 1 on a MIG profile that holds the model")
    if context.scope == "node":
        fit = context.replicas_here * context.gpu_nodes
        wanted = context.min_replicas
        if fit < wanted:
            nodes = f"{context.gpu_nodes} node(s) like this one" if context.gpu_nodes > 1 else "this node"
            return Finding(
                "gpus", "problem", f"min_replicas / num_replicas asks for {wanted} replicas of {need:g} GPU(s) "
                f"each at start; {nodes} hold(s) {fit} ({shown} GPUs here)",
                f"lower replicas.autoscaling.min_replicas (or num_replicas) to {fit}, or add GPU nodes to the Ray "
                "cluster and say how many with `grrm check --gpu-nodes N`")
    names = sorted({gpu.name for gpu in facts.gpus})
    found = f"{shown} GPU(s) ({', '.join(names)}; {facts.gpu_note}); one replica takes {need:g} ({layout})"
    named = any(item.strip().startswith("MIG-") for item in (facts.visible_devices or "").split(","))
    if migs and context.scope == "node" and not named:
        # Ray counts whole GPUs (NVML's device count) and hands a replica a GPU, not a MIG device.
        found += ("; Ray counts whole GPUs: a replica it places here runs on its GPU's first MIG device. To give "
                  "every MIG device a replica, start Ray with CUDA_VISIBLE_DEVICES=<their MIG uuids, from "
                  "`nvidia-smi -L`> and --num-gpus=<their number>")
    return Finding("gpus", "ok", found)


def _driver(context: _Context) -> Finding:
    """The NVIDIA driver against the CUDA major torch is built for (:data:`DRIVER_FLOORS`)."""
    facts = context.facts
    if not context.gpu_engine:
        return Finding("driver", "skipped", "no GPU engine")
    branch = driver_branch(facts.driver_version)
    if branch is None:
        return Finding("driver", "skipped", "no NVIDIA driver read (see gpus)")
    build = facts.torch_build
    if build is not None and build.cuda_major is not None:
        major, source = build.cuda_major, build.describe()
    else:  # a CPU build or none (see torch_build): judged for the build the GPU install brings
        here = build.describe() if build is not None else "torch is not installed"
        major, source = GPU_INSTALL_CUDA_MAJOR, f"the GPU install's torch (CUDA {GPU_INSTALL_CUDA_MAJOR}; here {here})"
    floor = DRIVER_FLOORS.get(major)
    if floor is None:
        return Finding("driver", "skipped", f"NVIDIA driver {facts.driver_version}; no driver floor is known for "
                                            f"CUDA {major} ({source})")
    if branch < floor:
        return Finding(
            "driver", "problem", f"NVIDIA driver {facts.driver_version} (R{branch}); {source} needs R{floor} or "
            "later: under an older driver torch finds no CUDA device and the engine cannot start",
            f"upgrade this node's NVIDIA driver to R{floor} or later (Kubernetes: the GPU operator's driver version, "
            f"or the node image's driver); the image and the GPU install are built for CUDA "
            f"{GPU_INSTALL_CUDA_MAJOR} only (docs/operations/node-checks.md)")
    return Finding("driver", "ok", f"NVIDIA driver {facts.driver_version}; {source} needs R{floor} or later")


def _torch_build(context: _Context) -> Finding:
    """torch's build: a GPU replica needs one built for CUDA, with its CUDA libraries installed."""
    build, rank_gpus = context.facts.torch_build, context.config.replicas.gpus_per_rank
    if context.config.engine.kind == "scripted":
        return Finding("torch_build", "skipped", "the scripted engine (tests) runs no torch")
    if not context.uses_gpus:
        return Finding("torch_build", "ok", "CPU replicas (replicas.gpus_per_rank 0): "
                       + (build.describe() if build is not None else "torch is not installed (see engine_package)"))
    if build is not None and build.cuda_major is not None:
        return Finding("torch_build", "ok", build.describe())
    listed = f"; nvidia-smi lists {len(context.facts.gpus)} GPU(s) here" if context.facts.gpus else ""
    found = f"{build.describe()} runs on no NVIDIA GPU" if build is not None else "torch is not installed"
    return Finding("torch_build", "problem", f"{found}, and replicas.gpus_per_rank {rank_gpus:g} asks for GPUs{listed}",
                   GPU_INSTALL)


def _plan(context: _Context, gpu: Gpu) -> MemoryPlan:
    engine, shape, tokens = context.config.engine, context.shape, context.context_tokens
    assert shape is not None and tokens is not None
    return plan_memory(shape, dtype=engine.dtype, max_model_len=tokens, tensor_parallel_size=engine.tensor_parallel_size,
                       pipeline_parallel_size=engine.pipeline_parallel_size,
                       max_num_batched_tokens=engine.max_num_batched_tokens or tokens, gpu_bytes=gpu.total_bytes,
                       gpu_memory_utilization=engine.gpu_memory_utilization)


def _too_small(context: _Context, gpu: Gpu, plan: MemoryPlan) -> Finding:
    engine = context.config.engine
    larger = ", a larger MIG profile or whole GPUs" if gpu.mig_profile else ""
    return Finding(
        "gpu_memory", "problem",
        f"GPU {gpu.index} ({gpu.name}, {_gib(gpu.total_bytes)}): gpu_memory_utilization "
        f"{engine.gpu_memory_utilization:g} allows {_gib(plan.budget_bytes)}; one rank needs ~"
        f"{_gib(plan.weights_bytes)} of weights and ~{_gib(plan.activation_bytes)} of activations and "
        f"overhead, which leaves {_gib(max(plan.kv_cache_bytes, 0))} for a KV cache, and one sequence of "
        f"{context.context_tokens} tokens needs {_gib(plan.kv_bytes_per_sequence)} (an estimate from "
        "config.json)",
        "raise engine.tensor_parallel_size, lower engine.max_model_len (with scoring.max_prompt_tokens + "
        f"max_answer_tokens), or use GPUs with more memory{larger}")


_FREE_THEM = ("find the processes with `nvidia-smi` (an engine left behind by a dead replica shows as "
              "VLLM::EngineCore) and stop them, or lower engine.gpu_memory_utilization")


def _held(gpus: list[Gpu]) -> str:
    return ", ".join(f"GPU {gpu.index} ({_gib(gpu.used_bytes)} used)" for gpu in gpus)


def _gpu_memory(context: _Context) -> Finding:
    config, facts, shape = context.config, context.facts, context.shape
    engine = config.engine
    if not context.uses_gpus or engine.kind == "scripted":
        return Finding("gpu_memory", "skipped", "no GPU engine")
    if not facts.gpus:
        return Finding("gpu_memory", "skipped", "no GPU to measure (see gpus)")
    if shape is None or context.context_tokens is None:
        return Finding("gpu_memory", "skipped", "the model's config.json was not read (see model)")
    plans = {gpu.uuid: _plan(context, gpu) for gpu in facts.gpus}
    claim = {gpu.uuid: engine.gpu_memory_utilization * gpu.total_bytes for gpu in facts.gpus}
    # A vLLM or SGLang engine refuses to start where less than its claim is free.
    held = [gpu for gpu in facts.gpus if engine.kind in _CLAIMING_ENGINES and gpu.free_bytes < claim[gpu.uuid]]
    if context.scope == "replica":
        # The GPUs Ray gave this replica (CUDA_VISIBLE_DEVICES), in rank order; with the Ray executor its
        # ranks hold theirs in the replica's placement group, unknown here: their size only.
        ray_ranks = context.config.placement.executor == "ray"
        mine = list(facts.gpus) if ray_ranks else list(facts.gpus[:context.ranks_here])
        for gpu in mine:
            if not plans[gpu.uuid].fits:
                return _too_small(context, gpu, plans[gpu.uuid])
            if gpu in held and not ray_ranks:
                return Finding(
                    "gpu_memory", "problem",
                    f"GPU {gpu.index} ({gpu.name}) has {_gib(gpu.free_bytes)} free of {_gib(gpu.total_bytes)}; the "
                    f"engine claims gpu_memory_utilization {engine.gpu_memory_utilization:g} = "
                    f"{_gib(claim[gpu.uuid])} at start and refuses less: another process holds "
                    f"{_gib(gpu.used_bytes)}", _FREE_THEM)
        return Finding("gpu_memory", "ok", _memory_found(context, mine[-1], plans[mine[-1].uuid]))
    usable = [gpu for gpu in facts.gpus if plans[gpu.uuid].fits and gpu not in held]
    fit_here = len(usable) // context.ranks_here
    wanted = max(1, context.min_replicas)  # min_replicas 0 still starts one when work comes
    if fit_here * context.gpu_nodes < wanted:
        small = [gpu for gpu in facts.gpus if not plans[gpu.uuid].fits]
        if small and not held:
            return _too_small(context, small[0], plans[small[0].uuid])
        fewer = (f", or lower replicas.autoscaling.min_replicas (or num_replicas) to {fit_here * context.gpu_nodes}"
                 if fit_here else "")
        return Finding(
            "gpu_memory", "problem",
            f"{len(held)} of {len(facts.gpus)} GPUs have less free than the engine claims at start "
            f"(gpu_memory_utilization {engine.gpu_memory_utilization:g} of each) and refuses less; other processes "
            f"hold them: {_held(held)}. The {len(usable)} free GPU(s) hold {fit_here} replica(s) of "
            f"{context.ranks_here} GPU(s) here, and the config needs {wanted} at start (min_replicas / num_replicas, "
            "one at least)",
            _FREE_THEM + fewer)
    found = _memory_found(context, usable[0], plans[usable[0].uuid])
    if held:
        found += (f"; {len(held)} of {len(facts.gpus)} GPUs are taken by other processes ({_held(held)}): replicas "
                  f"fit only on the {len(usable)} free ones ({fit_here} replica(s) of {context.ranks_here} GPU(s) here)")
    return Finding("gpu_memory", "ok", found)


def _memory_found(context: _Context, gpu: Gpu, plan: MemoryPlan) -> str:
    """The estimate for one rank, for an ok finding."""
    mig = ("; nvidia-smi's query reports no memory use per MIG device: the engine measures its own at start"
           if gpu.mig_profile else "")
    return (f"one rank: ~{_gib(plan.weights_bytes)} of weights, a KV cache of ~{_gib(plan.kv_cache_bytes)} = "
            f"{plan.full_sequences:.0f} sequences of {context.context_tokens} tokens on {gpu.name} (estimated from "
            f"config.json; engine.max_num_seqs {context.config.engine.max_num_seqs or 'default'}){mig}")


def _shared_memory(context: _Context) -> Finding:
    config, facts = context.config, context.facts
    ranks = config.engine.ranks
    if config.placement.executor != "mp":
        return Finding("shm", "ok", f"{ranks} rank(s) without the multiprocess executor: no shared-memory queues")
    # Every replica this node can hold has queues of its own there.
    need = shared_memory_bytes(ranks) * max(1, context.replicas_here)
    if facts.shm_bytes is None:
        found = "this machine has no /dev/shm"
    elif facts.shm_bytes < need:
        found = f"/dev/shm has {_gib(facts.shm_bytes)} free"
    else:
        return Finding("shm", "ok", f"/dev/shm has {_gib(facts.shm_bytes)} free; {ranks} ranks per replica need "
                                    f"~{_gib(need)} here")
    size = math.ceil(need / GIB)
    return Finding(
        "shm", "problem", f"{found}; {ranks} parallel ranks per replica pass messages through it and need "
        f"~{_gib(need)} here (vLLM's multiprocess executor queues and NCCL)",
        f"mount a memory-backed volume of {size} GiB or more at /dev/shm (Kubernetes: an emptyDir with medium: "
        f"Memory and sizeLimit: {size}Gi; docker: --shm-size={size}g or --ipc=host)")


def _engine_package(context: _Context) -> Finding:
    engine = context.config.engine
    package = ENGINE_PACKAGES.get(engine.kind)
    if package is None:
        return Finding("engine_package", "ok", f"the {engine.kind} engine needs no package")
    installed = context.facts.engine_package
    if installed is None:
        return Finding("engine_package", "problem",
                       f"engine.kind {engine.kind}: none of {', '.join(package.distributions)} is installed",
                       package.install)
    found = f"{installed.distribution} {installed.version}"
    if context.uses_gpus and installed.distribution in package.cpu_builds:
        return Finding("engine_package", "problem", f"{found} is the CPU build of {engine.kind}, and replicas.gpus_per_rank "
                       f"{context.config.replicas.gpus_per_rank:g} asks for GPUs: the replicas would hold GPUs and run "
                       "the model on the CPU", GPU_INSTALL)
    tested = package.tested_version
    if tested is None or installed.version == tested:
        return Finding("engine_package", "ok", found + (" (the tested version)" if tested else ""))
    if engine.allow_untested_version:
        return Finding("engine_package", "ok", f"{found}; tested with {tested}, allowed by "
                                               "engine.allow_untested_version")
    return Finding("engine_package", "problem", f"{found} is installed; the project is tested with {tested}",
                   f"{package.install}, or set engine.allow_untested_version: true to run {installed.version} anyway")


def _model(context: _Context) -> Finding:
    facts = context.facts
    if facts.model_error is not None:
        return Finding("model", "problem", facts.model_error,
                       "give engine.model a local checkpoint directory, or a hub id that is in the hub cache "
                       "(HF_HOME) or that the hub serves to this machine")
    if context.config.engine.kind == "scripted":
        return Finding("model", "ok", "the scripted engine loads no model")
    if facts.model is None:
        return Finding("model", "ok", f"{context.config.engine.model}: not there yet, the tiny test model is built "
                                      "there at the replica's start (build_tiny_model_if_missing)")
    source, model = facts.model, context.config.engine.model
    weights = source.weights
    if weights is not None and not weights.complete:
        return _incomplete(context, source, weights)
    where = {"directory": "a local directory", "hub_cache": "in the hub cache", "hub": "on the hub (downloaded "
             "at the engine's start)"}[source.kind]
    files = f", {len(weights.listed)} weight file(s) ({weights.how}), all there" if weights and weights.listed else ""
    return Finding("model", "ok", f"{model}: {where} ({source.location}){files}")


def _incomplete(context: _Context, source: ModelSource, weights: Weights) -> Finding:
    """A model whose weights are not all on this machine."""
    model, cache = context.config.engine.model, context.facts.hub_cache
    if weights.listed:
        lack = (f"{len(weights.missing)} of the {len(weights.listed)} weight files {weights.how} lists are not there "
                f"({', '.join(weights.missing)})")
    else:
        lack = f"it holds {weights.how}"
    if source.kind == "directory":
        return Finding("model", "problem", f"engine.model: the directory {source.location}: {lack}: an interrupted "
                                           "copy or download",
                       f"complete the checkpoint in {source.location}: copy the missing files there, or download it "
                       f"again (`hf download <hub id> --local-dir {source.location}`)")
    offline = cache is not None and cache.offline
    if not weights.listed and not offline:  # only config.json cached: the engine downloads the rest, as from the hub
        return Finding("model", "ok", f"{model}: its config.json is in the hub cache ({source.location}), its "
                                      "weights are not: downloaded at the engine's start")
    why = ("HF_HUB_OFFLINE is set: the engine cannot start" if offline else "an interrupted download, which every "
           "replica would resume at its start, all into the same cache at once")
    home = Path(cache.path).parent if cache is not None and Path(cache.path).name == "hub" else None
    same = f"HF_HOME={home} " if home is not None else ""
    return Finding("model", "problem", f"engine.model: {model!r} is in the hub cache ({source.location}), but {lack}: "
                                       f"{why}",
                   f"finish the download before the replicas start: `{same}hf download {model}` (the same HF_HOME "
                   "as the replicas), where the hub can be reached")


def _hub_cache(context: _Context) -> Finding:
    """Whether the engine's start can write what it must into the hub cache."""
    facts, model = context.facts, context.config.engine.model
    cache = facts.hub_cache
    if context.config.engine.kind == "scripted" or cache is None:
        return Finding("hub_cache", "skipped", "engine.model is no hub id: the hub cache is not used")
    if cache.writable:
        return Finding("hub_cache", "ok", f"{cache.path} can be written by {cache.user}")
    source = facts.model
    complete = source is not None and source.weights is not None and source.weights.complete
    if complete and cache.offline:
        return Finding("hub_cache", "ok", f"{cache.path} is read-only for {cache.user} ({cache.why_not}); the model is "
                                          "complete there and HF_HUB_OFFLINE is set: nothing is written")
    owner = f"make it writable by {cache.user} (chown it; Kubernetes: the pod's securityContext.fsGroup)"
    if complete:
        why, fix = ("HF_HUB_OFFLINE is not set: the engine's start asks the hub and downloads a newer revision into it",
                    f"set HF_HUB_OFFLINE=1 here (the model is complete in the cache), or {owner}")
    else:
        why, fix = ("the model is not complete there: the engine's start downloads into it",
                    f"download it where the cache can be written (`hf download {model}`) and set HF_HUB_OFFLINE=1 "
                    f"here, or {owner}")
    return Finding("hub_cache", "problem", f"{cache.path} cannot be written by {cache.user} ({cache.why_not}), and "
                                           f"{why}", fix)


def _token_budget(context: _Context) -> Finding:
    config, shape = context.config, context.shape
    own = shape.max_position_embeddings if shape is not None else None
    if own is None:
        return Finding("token_budget", "skipped", "the model's context length is not known here (see model)")
    scoring = config.scoring
    if config.engine.max_model_len is not None and config.engine.max_model_len > own:
        return Finding("token_budget", "problem", f"engine.max_model_len ({config.engine.max_model_len}) exceeds "
                                                  f"the model's context ({own} tokens, config.json)",
                       f"lower engine.max_model_len to {own} or less")
    if scoring.sequence_tokens() > own:
        return Finding("token_budget", "problem", f"{scoring.sequence_tokens_text()} exceeds the model's context "
                                                  f"({own} tokens, config.json)",
                       "lower scoring.max_prompt_tokens or max_answer_tokens")
    return Finding("token_budget", "ok", f"{scoring.sequence_tokens_text()} fits {context.context_tokens} tokens")


def _auth(context: _Context) -> Finding:
    """What the ingress will do about tokens (:func:`deployments.http.auth.refuse_open_service` at its start)."""
    host, http = context.http_host, context.config.http
    if host is None or host in LOOPBACK_HOSTS:
        return Finding("auth", "ok", f"HTTP binds {host or '127.0.0.1'}: this machine only")
    environment = {**context.facts.environment, **http.env_vars}
    set_here = [name for name in token_variables(context.config) if environment.get(name)]
    if set_here:
        return Finding("auth", "ok", f"HTTP binds {host}; {', '.join(set_here)} set: /v1 requests need a bearer token")
    if http.allow_unauthenticated:
        return Finding("auth", "ok", f"HTTP binds {host} with no token, as http.allow_unauthenticated allows: every "
                                     "/v1 route is open to whoever reaches the port")
    variable = http.auth_token_env or DEFAULT_TOKEN_ENV
    return Finding("auth", "problem", f"HTTP binds {host} and no token is set here ({variable} is not set): the "
                                      "ingress refuses to start an API open to whoever reaches the port",
                   f"export {variable}=$(openssl rand -hex 32) where `serve run` starts (callers send it as "
                   "`Authorization: Bearer ...`), bind http_options.host to 127.0.0.1, or set "
                   "http.allow_unauthenticated: true")


_CHECKS: dict[Scope, tuple[Callable[[_Context], Finding], ...]] = {
    "node": (_gpus, _driver, _torch_build, _gpu_memory, _shared_memory, _engine_package, _model, _hub_cache,
             _token_budget, _auth),
    # A replica checks its own share: its GPUs, the driver and torch, their memory, /dev/shm, the package,
    # the model and its cache.
    "replica": (_gpus, _driver, _torch_build, _gpu_memory, _shared_memory, _engine_package, _model, _hub_cache,
                _token_budget),
}


def judge(config: AppConfig, facts: NodeFacts, *, scope: Scope, gpu_nodes: int = 1,
          http_host: str | None = None) -> list[Finding]:
    """Every check of ``scope`` on these facts (pure). ``gpu_nodes``: nodes like this one the Ray cluster
    will have; ``http_host``: the Serve config's ``http_options.host``."""
    context = _Context(config, facts, scope, max(1, gpu_nodes), http_host)
    return [check(context) for check in _CHECKS[scope]]


def report(findings: list[Finding], *, problems_only: bool = False) -> str:
    """The findings as lines: ``[ok]``/``[PROBLEM]``/``[skipped]``, the check, what it found, the fix."""
    lines = []
    for finding in findings:
        if problems_only and not finding.problem:
            continue
        mark = {"ok": "ok", "problem": "PROBLEM", "skipped": "skipped"}[finding.status]
        lines.append(f"[{mark}] {finding.check}: {finding.found}")
        if finding.problem:
            lines.append(f"    fix: {finding.fix}")
    return "\n".join(lines)


def _facts(config: AppConfig) -> NodeFacts:
    model = config.engine.model
    if config.engine.kind == "scripted" or (config.build_tiny_model_if_missing and not Path(model).exists()):
        model = ""  # nothing to find: no model, or one the replica builds
    return gather_facts(config.engine.kind, model, environment_names=tuple(token_variables(config)))


def check_node(config: AppConfig, *, http_host: str | None, gpu_nodes: int = 1) -> list[Finding]:
    """Read this machine and judge it for ``config`` (``grrm check``)."""
    return judge(config, _facts(config), scope="node", gpu_nodes=gpu_nodes, http_host=http_host)


def ensure_replica_can_start(config: AppConfig) -> list[Finding]:
    """A replica's checks of its own share, before its engine starts; raises :class:`PreflightError`."""
    findings = judge(config, _facts(config), scope="replica")
    if any(finding.problem for finding in findings):
        raise PreflightError(findings)
    return findings
