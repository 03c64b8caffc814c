"""The ``grrm`` console script: ``grrm check``, ``grrm serve``, ``grrm score``, ``grrm eval``, ``grrm plan``,
``grrm profile``."""

from __future__ import annotations

import argparse
from importlib import metadata

from grrm_cli import check, evaluate, plan, profile, score, serve


def build_parser() -> argparse.ArgumentParser:
    """The ``grrm`` parser with one sub-command per module."""
    parser = argparse.ArgumentParser(
        prog="grrm",
        description=(
            "GRRM Cluster: check a machine for a deployment, serve the GRRM group reward model, score whole "
            "datasets of translation groups with it, measure ranking accuracy, size a reward pool before "
            "renting it, and measure a deployed engine's profile for that sizing. `grrm COMMAND --help` explains "
            "each command."
        ),
    )
    try:
        version = metadata.version("grrm-cluster")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"grrm {version}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    check.add_parser(commands)
    serve.add_parser(commands)
    score.add_parser(commands)
    evaluate.add_parser(commands)
    plan.add_parser(commands)
    profile.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the command; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.handler(args)
