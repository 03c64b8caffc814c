"""``grrm serve [CONFIG]``: start the reward service and score a demo group (``scripts/serve_local.sh``).

Runs ``serve run CONFIG`` (the embedded default ``deployments/local.yaml`` when no config is
given: CPU vLLM on the tiny local model), waits until the HTTP API answers, posts one demo group
and prints the result, then keeps serving until Ctrl-C. All of it is
:mod:`deployments.local_demo`; this is its command line.
"""

from __future__ import annotations

import argparse
from typing import Any

from deployments import local_demo

DEFAULT_CONFIG = local_demo.PROJECT_ROOT / "deployments" / "local.yaml"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``grrm serve``."""
    parser = subparsers.add_parser(
        "serve",
        help="start the reward service (serve run CONFIG) and score a demo group",
        description=(
            "Start the reward service with `serve run CONFIG`, wait until its HTTP API answers, score a "
            "demo group, then keep serving until Ctrl-C. Without CONFIG: deployments/local.yaml (the CPU "
            "build of vLLM on a tiny random-weight model, whose scores are meaningless; 2 replicas on "
            "http://127.0.0.1:8000)."
        ),
    )
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG), metavar="CONFIG", help="a Serve config file")
    parser.add_argument("--demo-only", action="store_true", help="stop the service after the demo request")
    parser.add_argument("--url", help="where the service answers (default: from the config's http_options)")
    parser.add_argument("--timeout-s", type=float, default=600, metavar="S", help="how long to wait for it (default: %(default)s)")
    parser.set_defaults(handler=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run ``grrm serve``."""
    argv = ["--config", args.config, "--timeout-s", str(args.timeout_s)]
    argv += ["--url", args.url] if args.url else []
    argv += ["--demo-only"] if args.demo_only else []
    return local_demo.main(argv)
