"""README's first command: start ``serve run deployments/local.yaml`` and score a demo group.

Runs the real Serve CLI as a child process, waits until the HTTP API answers, posts one group
to ``/v1/score`` and prints the result; then keeps serving until Ctrl-C (or stops at once
with ``--demo-only``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from deployments.process_env import BODY_MEMORY_ENV

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEMO_GROUP = {
    "group_id": "demo-frog",
    "source": "I have a frog in my throat.",
    "candidates": ["我嗓子有点哑。", "我喉咙里有只青蛙。", "我嗓子不太舒服，说话有点沙哑。", "我嗓子眼里好像有只青蛙。"],
    "src_lang": "en",
    "trg_lang": "zh",
}


def service_url(config_path: str | Path) -> str:
    """The base URL a Serve config file serves its (first) application on: host, port, route prefix."""
    document = yaml.safe_load(Path(config_path).read_text()) or {}
    http = document.get("http_options") or {}
    host = http.get("host") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # listening on every interface: reach it on loopback
    applications = document.get("applications") or [{}]
    prefix = (applications[0].get("route_prefix") or "/").rstrip("/")
    return f"http://{host}:{http.get('port') or 8000}{prefix}"


def wait_until_serving(url: str, process: subprocess.Popen, timeout_s: float) -> float:
    """Poll ``/v1/info`` until the replicas run; returns seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"serve run exited with code {process.returncode} before serving")
        try:
            info = httpx.get(f"{url}/v1/info", timeout=5).json()
            if info.get("replicas", {}).get("RUNNING", 0) >= 1:
                return time.monotonic() - started
            if info.get("unschedulable"):  # no replica can ever start here: no point waiting
                raise SystemExit(f"no replica can start: {info['unschedulable']}")
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    raise SystemExit(f"the service did not answer within {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(PROJECT_ROOT / "deployments" / "local.yaml"))
    parser.add_argument("--url", help="where the service answers (default: from the config's http_options)")
    parser.add_argument("--demo-only", action="store_true", help="stop the service after the demo request")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args(argv)
    args.url = args.url or service_url(args.config)

    serve_cli = Path(sys.executable).with_name("serve")
    # Ray installed without its console scripts (pip --target, an unpacked wheel): the same CLI.
    serve_command = [str(serve_cli)] if serve_cli.exists() else [sys.executable, "-m", "ray.serve.scripts"]
    # Serve's proxy starts from this environment (deployments/process_env.py).
    env = {**BODY_MEMORY_ENV, **os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    # A process manager's stop (SIGTERM) takes the Ctrl-C path: without it this process ended at once
    # and left `serve run`'s Ray cluster running, which the next `serve run` on the machine joins.
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"[demo] starting: serve run {args.config}", flush=True)
    # SIGINT at its default in the child (a background shell ignores it, and the child would inherit
    # that): `serve run` then stops on SIGINT as on Ctrl-C, shutting down what it started cleanly.
    process = subprocess.Popen([*serve_command, "run", args.config], cwd=PROJECT_ROOT, env=env,
                               preexec_fn=_default_sigint)
    try:
        waited = wait_until_serving(args.url, process, args.timeout_s)
        print(f"[demo] serving after {waited:.1f} s; POST {args.url}/v1/score", flush=True)
        response = httpx.post(f"{args.url}/v1/score", json={"groups": [DEMO_GROUP]}, timeout=300)
        print(json.dumps(response.json(), ensure_ascii=False, indent=2), flush=True)
        print(
            "[demo] NOTE: the tiny local model has random weights; its scores are meaningless. "
            "Point engine.model at a GRRM checkpoint to score for real (see README).",
            flush=True,
        )
        if response.status_code != 200:
            return 1
        if args.demo_only:
            return 0
        print("[demo] still serving on", args.url, "(docs at /docs); Ctrl-C to stop", flush=True)
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop(process)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """Stop ``serve run`` as Ctrl-C does (a clean shutdown, no stack dump); SIGTERM, then SIGKILL,
    only when it does not end in time. (Ray's core worker answers SIGTERM with a stack dump that
    reads like a crash.)"""
    for send in (lambda: process.send_signal(signal.SIGINT), process.terminate, process.kill):
        if process.poll() is not None:
            return
        send()
        try:
            process.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    raise SystemExit(main())
