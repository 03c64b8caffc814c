"""The client's options of the commands that send to a running service (``grrm score``, ``grrm profile``):
declared once here, with :class:`~grrm_client.config.ClientConfig`'s defaults unless a command says why not."""

from __future__ import annotations

import argparse

from grrm_client.config import ClientConfig

CLIENT_DEFAULTS = ClientConfig()


def add_token_option(group: argparse._ArgumentGroup, *, used_with: str) -> None:
    """``--token-env``: where the bearer token is, for the HTTP transport (``used_with``: its flag)."""
    group.add_argument("--token-env", default=CLIENT_DEFAULTS.token_env, metavar="VAR",
                       help=f"environment variable holding the service's bearer token, for {used_with} "
                            "(default: %(default)s)")


def add_retry_options(group: argparse._ArgumentGroup, *, max_attempts: int = CLIENT_DEFAULTS.max_attempts,
                      deadline_s: float = CLIENT_DEFAULTS.deadline_s) -> None:
    """``--max-attempts`` and ``--deadline-s``: a trainer client's by default; a command that needs others
    passes them, derived from these, with its reason."""
    group.add_argument("--max-attempts", type=int, default=max_attempts, metavar="N",
                       help="sends per group on 503, back pressure or a lost replica, with backoff "
                            "(default: %(default)s)")
    group.add_argument("--deadline-s", type=float, default=deadline_s, metavar="S",
                       help="per group, every attempt included (default: %(default)s)")
