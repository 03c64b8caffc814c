"""Who a request acts for: bearer tokens, the caller's role, and the tenant a request may claim.

Closed by default: once any token is configured (the shared one, the operator's, or a tenant's), a
request without a matching one gets 401; only a service with no token at all is open, and one that
binds a non-loopback host that way refuses to start unless ``http.allow_unauthenticated`` says so.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cluster.protocol.schema import DEFAULT_TENANT, DEFAULT_TOKEN_ENV
from deployments.config import AppConfig
from deployments.http.errors import HTTPProblem

__all__ = [
    "CALLER",
    "LOOPBACK_HOSTS",
    "Caller",
    "OpenServiceRefused",
    "authenticate",
    "bearer_credential",
    "caller_of",
    "refuse_open_service",
    "tenant_of",
    "tenant_tokens",
    "token_variables",
]

# Where the guard leaves the request's Caller (``request.state``), read by the routes.
CALLER = "grrm_caller"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

Role = Literal["open", "shared", "operator", "tenant"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom a request's token names. ``open``: no token is configured (every caller is trusted);
    ``shared``: the shared token, which acts for any tenant without a token of its own; ``operator``:
    acts for any tenant and sees every tenant's state; ``tenant``: a token bound to ``tenant``."""

    role: Role
    tenant: str | None = None

    @property
    def sees_all(self) -> bool:
        """Whether this caller sees every tenant's state (``GET /v1/tenants``, ``GET /v1/demand``)."""
        return self.role != "tenant"


def _token(variable: str | None, environ: Mapping[str, str]) -> str:
    return environ.get(variable, "") if variable else ""


def token_variables(config: AppConfig) -> list[str]:
    """The environment variables a token may be configured in: the shared one, the operator's, the tenants'."""
    http = config.http
    return [name for name in (http.auth_token_env, http.operator_token_env,
                              *(tenant.token_env for tenant in http.tenants)) if name]


def tenant_tokens(config: AppConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tenant -> its own bearer token, for the tenants whose token variable is set in this process."""
    environ = os.environ if environ is None else environ
    return {tenant.name: token for tenant in config.http.tenants if (token := _token(tenant.token_env, environ))}


def bearer_credential(authorization: str) -> str:
    """The credential of an ``Authorization: Bearer <credential>`` header ('' for any other scheme);
    the scheme's case does not matter (RFC 7235)."""
    scheme, _, credential = authorization.strip().partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


def _same(credential: str, token: str) -> bool:
    return bool(token) and hmac.compare_digest(credential.encode(), token.encode())


def authenticate(config: AppConfig, credential: str, environ: Mapping[str, str] | None = None) -> Caller | None:
    """The caller ``credential`` names, or None when it must be refused (401): with any token
    configured, a request needs one of them; with none, every request is ``open``."""
    environ = os.environ if environ is None else environ
    operator = _token(config.http.operator_token_env, environ)
    shared = _token(config.http.auth_token_env, environ)
    tenants = tenant_tokens(config, environ)
    if not (operator or shared or tenants):
        return Caller("open")
    if _same(credential, operator):
        return Caller("operator")
    for name, token in tenants.items():
        if _same(credential, token):
            return Caller("tenant", name)
    if _same(credential, shared):
        return Caller("shared")
    return None


def caller_of(request_state: Any) -> Caller:
    """The Caller the guard left on a request (``open`` outside the guard, e.g. a unit call)."""
    return getattr(request_state, CALLER, None) or Caller("open")


def tenant_of(request_state: Any, claimed: str, config: AppConfig) -> str:
    """The tenant a request acts for: its token's, else what its body claims; a 403 (``forbidden``)
    when the body claims another token's tenant, or a tenant that has a token of its own without it
    (only the operator acts for any tenant)."""
    caller = caller_of(request_state)
    if caller.role == "tenant":
        if claimed not in (DEFAULT_TENANT, caller.tenant):
            raise HTTPProblem("forbidden", f"tenant: this token acts for {caller.tenant!r}, not {claimed!r}")
        return caller.tenant
    if caller.role != "operator" and claimed in tenant_tokens(config):
        raise HTTPProblem("forbidden", f"tenant: {claimed!r} acts with its own token only")
    return claimed


class OpenServiceRefused(RuntimeError):
    """A service that would answer anyone on a non-loopback host, where its config did not allow that."""


def refuse_open_service(config: AppConfig, host: str | None, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`OpenServiceRefused` when the HTTP API would bind ``host`` (not loopback) with no
    token configured in ``environ`` and ``http.allow_unauthenticated`` is not set."""
    if host is None or host in LOOPBACK_HOSTS or config.http.allow_unauthenticated:
        return
    if authenticate(config, "", environ) is None:
        return  # some token is configured: closed
    variable = config.http.auth_token_env or DEFAULT_TOKEN_ENV
    raise OpenServiceRefused(
        f"http: the API binds {host} and no token is set (http.auth_token_env {config.http.auth_token_env!r}, "
        f"http.operator_token_env {config.http.operator_token_env!r}, no tenant token): anyone who reaches the port "
        f"could score and announce. Export {variable}=$(openssl rand -hex 32) where the ingress runs (or in "
        f"http.env_vars), bind http_options.host to 127.0.0.1, or set http.allow_unauthenticated: true")
