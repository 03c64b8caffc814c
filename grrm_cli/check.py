"""``grrm check CONFIG``: the pre-flight a user runs on a node before ``serve run CONFIG``.

It validates the config as ``serve run`` would, then checks the machine for it: GPUs against the ranks
per replica and min_replicas (MIG devices and CUDA_VISIBLE_DEVICES as CUDA reads them), the NVIDIA
driver against the CUDA torch is built for, torch's build itself (a GPU replica needs CUDA), GPU memory
against weights and a KV cache for max_model_len and the GPUs free of other processes, ``/dev/shm``
against the ranks, the engine package at its tested version (not its CPU build for GPU replicas), the
model and whether its weights are all there, the hub cache's write access, and an auth token when HTTP
is not bound to loopback (``deployments/preflight.py``; docs/operations/node-checks.md). Every problem is named with its fix, and the
exit status is 1 when there is one (2: the config itself is wrong). A scorer replica runs the same
checks of its own share when it starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from deployments.config import AppConfig, find_application

EXIT_PROBLEMS = 1
EXIT_BAD_CONFIG = 2
# Serve's own default when a config names no http_options.host.
SERVE_DEFAULT_HOST = "127.0.0.1"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm check``."""
    parser = subparsers.add_parser(
        "check",
        help="pre-flight: can this machine run CONFIG? (run it before serve run)",
        description=(
            "Validate a Serve config file as `serve run` would, then check this machine for it: GPUs against "
            "the ranks per replica and min_replicas, the NVIDIA driver against the CUDA torch is built for, "
            "torch's build (GPU replicas need CUDA), GPU memory against the weights and a KV cache for "
            "max_model_len (estimated from the model's config.json) and against what other processes hold, "
            "/dev/shm against the parallel ranks, the engine package at its tested version, the model (a "
            "directory, the hub cache, or the hub) with all its weight files, the hub cache's write access, "
            "and an auth token when HTTP is not bound to loopback. Each problem is printed with its fix; the "
            "exit status is 1 when there is one, 2 when the config itself is invalid."
        ),
    )
    parser.add_argument("config", metavar="CONFIG", type=Path, help="a Serve config file (e.g. deployments/grrm.yaml)")
    parser.add_argument("--app-name", metavar="NAME", help="the application to check (default: the first)")
    parser.add_argument("--gpu-nodes", type=int, default=1, metavar="N",
                        help="GPU nodes like this one the Ray cluster will have, for min_replicas (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(handler=main)
    return parser


def load(path: Path, app_name: str | None) -> tuple[AppConfig, str]:
    """The application's validated config (relative model paths made absolute as the builder makes them)
    and the HTTP host; raises ValueError with a readable message."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from error
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not YAML ({error})") from error
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a Serve config (a mapping with `applications`)")
    application = find_application(document, app_name)
    try:
        config = AppConfig.model_validate(application.get("args") or {})
    except ValidationError as error:
        lines = [f"  {'.'.join(str(part) for part in item['loc']) or 'args'}: {item['msg']}" for item in error.errors()]
        raise ValueError(f"{path}: the application's args are invalid:\n" + "\n".join(lines)) from error
    from deployments.app import resolve_model_path  # imports Ray Serve: only once the config is valid

    host = (document.get("http_options") or {}).get("host") or SERVE_DEFAULT_HOST
    return resolve_model_path(config), str(host)


def main(args: argparse.Namespace) -> int:
    """Run ``grrm check``; the exit status."""
    from deployments.preflight import check_node, report

    if args.gpu_nodes < 1:
        print("grrm check: --gpu-nodes: must be 1 or more", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        config, host = load(args.config, args.app_name)
    except ValueError as error:
        print(f"grrm check: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    findings = check_node(config, http_host=host, gpu_nodes=args.gpu_nodes)
    problems = sum(finding.problem for finding in findings)
    if args.json:
        print(json.dumps({"config": str(args.config), "problems": problems,
                          "findings": [asdict(finding) for finding in findings]}, indent=2))
    else:
        print(f"grrm check {args.config}: {config.engine.kind} engine, {config.engine.model or 'no model'}")
        print(report(findings))
        print(f"{problems} problem(s): fix them before `serve run`" if problems else "all checks passed")
    return EXIT_PROBLEMS if problems else 0
