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

from cluster.engines.memory import GIB, ModelShape, plan_memory, shared_memory_bytes
from cluster.engines.versions import ENGINE_PACKAGES
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
    if shown < need:
        return Finding(
            "gpus", "problem", f"this machine shows {shown} GPU(s) ({facts.gpu_note}); one replica needs "
            f"{math.ceil(need)} ({layout})",
            f"run on a node with {math.ceil(need)} or more NVIDIA GPUs visible (`nvidia-smi` lists them; "
            "CUDA_VISIBLE_DEVICES must not hide them), or lower engine.tensor_parallel_size")
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
    return Finding("gpus", "ok", f"{shown} GPU(s) ({', '.join(names)}); one replica takes {need:g} ({layout})")


def _gpu_memory(context: _Context) -> Finding:
    config, facts, shape = context.config, context.facts, context.shape
    engine = config.engine
    if not context.uses_gpus or engine.kind == "scripted":
        return Finding("gpu_memory", "skipped", "no GPU engine")
    if not facts.gpus:
        return Finding("gpu_memory", "skipped", "no GPU to measure (see gpus)")
    if shape is None or context.context_tokens is None:
        return Finding("gpu_memory", "skipped", "the model's config.json was not read (see model)")
    batch_tokens = engine.max_num_batched_tokens or context.context_tokens
    for gpu in facts.gpus:
        plan = plan_memory(shape, dtype=engine.dtype, max_model_len=context.context_tokens,
                           tensor_parallel_size=engine.tensor_parallel_size,
                           pipeline_parallel_size=engine.pipeline_parallel_size, max_num_batched_tokens=batch_tokens,
                           gpu_bytes=gpu.total_bytes, gpu_memory_utilization=engine.gpu_memory_utilization)
        if not plan.fits:
            return Finding(
                "gpu_memory", "problem",
                f"GPU {gpu.index} ({gpu.name}, {_gib(gpu.total_bytes)}): gpu_memory_utilization "
                f"{engine.gpu_memory_utilization:g} allows {_gib(plan.budget_bytes)}; one rank needs ~"
                f"{_gib(plan.weights_bytes)} of weights and ~{_gib(plan.activation_bytes)} of activations and "
                f"overhead, which leaves {_gib(max(plan.kv_cache_bytes, 0))} for a KV cache, and one sequence of "
                f"{context.context_tokens} tokens needs {_gib(plan.kv_bytes_per_sequence)} (an estimate from "
                "config.json)",
                "raise engine.tensor_parallel_size, lower engine.max_model_len (with scoring.max_prompt_tokens + "
                "max_answer_tokens), or use GPUs with more memory")
        claim = engine.gpu_memory_utilization * gpu.total_bytes
        if engine.kind in _CLAIMING_ENGINES and gpu.free_bytes < claim:
            return Finding(
                "gpu_memory", "problem",
                f"GPU {gpu.index} ({gpu.name}) has {_gib(gpu.free_bytes)} free of {_gib(gpu.total_bytes)}; the "
                f"engine claims gpu_memory_utilization {engine.gpu_memory_utilization:g} = {_gib(claim)} at start "
                f"and refuses less: another process holds {_gib(gpu.used_bytes)}",
                "find it with `nvidia-smi` (an engine left behind by a dead replica shows as VLLM::EngineCore) "
                "and stop it, or lower engine.gpu_memory_utilization")
    return Finding(
        "gpu_memory", "ok",
        f"one rank: ~{_gib(plan.weights_bytes)} of weights, a KV cache of ~{_gib(plan.kv_cache_bytes)} = "
        f"{plan.full_sequences:.0f} sequences of {context.context_tokens} tokens on {facts.gpus[-1].name} "
        f"(estimated from config.json; engine.max_num_seqs {engine.max_num_seqs or 'default'})")


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
    where = {"directory": "a local directory", "hub_cache": "in the hub cache", "hub": "on the hub (downloaded "
             "at the engine's start)"}[facts.model.kind]
    return Finding("model", "ok", f"{context.config.engine.model}: {where} ({facts.model.location})")


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
    variable = http.auth_token_env or "GRRM_API_TOKEN"
    return Finding("auth", "problem", f"HTTP binds {host} and no token is set here ({variable} is not set): the "
                                      "ingress refuses to start an API open to whoever reaches the port",
                   f"export {variable}=$(openssl rand -hex 32) where `serve run` starts (callers send it as "
                   "`Authorization: Bearer ...`), bind http_options.host to 127.0.0.1, or set "
                   "http.allow_unauthenticated: true")


_CHECKS: dict[Scope, tuple[Callable[[_Context], Finding], ...]] = {
    "node": (_gpus, _gpu_memory, _shared_memory, _engine_package, _model, _token_budget, _auth),
    # A replica checks its own share: its GPUs, their memory, /dev/shm, the package and the model.
    "replica": (_gpus, _gpu_memory, _shared_memory, _engine_package, _model, _token_budget),
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
