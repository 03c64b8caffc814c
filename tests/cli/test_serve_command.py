"""``grrm serve [CONFIG]``: the README's first command as a console script. It starts `serve run
CONFIG`, finds the service where the config puts it, scores the demo group and (``--demo-only``)
stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.common import free_port
from deployments.local_demo import service_url

ROOT = Path(__file__).resolve().parents[2]


def test_the_service_url_comes_from_the_config(tmp_path):
    assert service_url(ROOT / "deployments" / "local.yaml") == "http://127.0.0.1:8000"
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "http_options": {"host": "0.0.0.0", "port": 8123},
        "applications": [{"name": "grrm", "route_prefix": "/grrm/", "import_path": "deployments.app:build_app"}],
    }))
    assert service_url(config) == "http://127.0.0.1:8123/grrm"


def scripted_config(tmp_path: Path) -> tuple[Path, int]:
    """A Serve config of one scripted replica on a free port, and the port."""
    port = free_port()
    config = tmp_path / "scripted.yaml"
    config.write_text(yaml.safe_dump({
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "grrm", "route_prefix": "/", "import_path": "deployments.app:build_app",
            "args": {
                "engine": {"kind": "scripted"},
                "replicas": {"num_replicas": 1, "num_cpus": 0.5, "gpus_per_rank": 0},
            },
        }],
    }))
    return config, port


# A Ray instance of its own (not one another test or user started on this machine).
OWN_RAY = {"RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.mark.slow
@pytest.mark.own_cluster
@pytest.mark.timeout(300)
def test_grrm_serve_starts_a_config_scores_the_demo_group_and_stops(tmp_path):
    config, port = scripted_config(tmp_path)
    env = {**os.environ, **OWN_RAY}
    completed = subprocess.run(
        [sys.executable, "-m", "grrm_cli", "serve", str(config), "--demo-only", "--timeout-s", "240"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"POST http://127.0.0.1:{port}/v1/score" in completed.stdout
    body = completed.stdout[completed.stdout.index("{"):completed.stdout.rindex("}") + 1]
    (result,) = json.loads(body)["results"]
    assert result["valid"] and len(result["scores"]) == 4 and result["group_id"] == "demo-frog"
    # A clean stop, as on Ctrl-C: nothing that reads like a crash (Ray's answer to SIGTERM is a
    # "*** SIGTERM received ... PC: @" stack dump).
    output = completed.stdout + completed.stderr
    assert "Got KeyboardInterrupt, shutting down" in output
    assert "SIGTERM received" not in output and "Traceback" not in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.own_cluster
@pytest.mark.timeout(300)
def test_grrm_serve_stopped_by_sigterm_takes_down_everything_it_started(tmp_path):
    """A process manager stops a service with SIGTERM: `serve run` and the Ray cluster it started
    must go too (they were left running, and the next `serve run` on the machine joined them)."""
    import psutil

    config, _port = scripted_config(tmp_path)
    current_cluster = Path("/tmp/ray/ray_current_cluster")
    before = current_cluster.read_text() if current_cluster.exists() else None
    service = subprocess.Popen([sys.executable, "-m", "grrm_cli", "serve", str(config), "--timeout-s", "240"],
                               cwd=ROOT, env={**os.environ, **OWN_RAY}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        for line in service.stdout:
            if "[demo] still serving" in line:
                break
        started = psutil.Process(service.pid).children(recursive=True)
        assert any("gcs_server" in " ".join(child.cmdline()) for child in started), [c.name() for c in started]
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=120) == 0
        _, alive = psutil.wait_procs(started, timeout=60)
        assert not alive, [(process.pid, process.name()) for process in alive]
    finally:
        if service.poll() is None:
            service.kill()
        if before is None:
            current_cluster.unlink(missing_ok=True)
        else:
            current_cluster.write_text(before)

