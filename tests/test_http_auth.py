"""Who a request acts for and what it may see, as pure functions (deployments/http/auth.py,
deployments/http/tenant_views.py); tests/reliability/test_hostile_tenants.py checks the same through
HTTP on the real service."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster.autoscaling import Demand
from cluster.engines import EngineConfig
from deployments.config import AppConfig, HTTPSettings, TenantSettings
from deployments.http.auth import (
    CALLER,
    Caller,
    OpenServiceRefused,
    authenticate,
    bearer_credential,
    refuse_open_service,
    tenant_of,
)
from deployments.http.errors import HTTPProblem
from deployments.http.tenant_views import demand_view, tenants_view


def config(**http) -> AppConfig:
    return AppConfig(engine=EngineConfig(kind="scripted"), http=HTTPSettings(**{
        "auth_token_env": "SHARED", "operator_token_env": "OPERATOR",
        "tenants": [TenantSettings(name="alpha", token_env="ALPHA"), TenantSettings(name="beta", token_env="BETA")],
        **http}))


ALL = {"SHARED": "s", "OPERATOR": "o", "ALPHA": "a", "BETA": "b"}


def test_each_token_names_its_caller_and_a_wrong_one_nobody():
    assert authenticate(config(), "o", ALL) == Caller("operator")
    assert authenticate(config(), "a", ALL) == Caller("tenant", "alpha")
    assert authenticate(config(), "s", ALL) == Caller("shared")
    assert authenticate(config(), "", ALL) is None
    assert authenticate(config(), "nope", ALL) is None


def test_closed_once_any_token_is_set():
    # Only tenant tokens set (the shared variable unset): a request without a token is refused, where
    # it used to act as any unlisted tenant.
    only_tenants = {"ALPHA": "a"}
    assert authenticate(config(), "", only_tenants) is None
    assert authenticate(config(), "a", only_tenants) == Caller("tenant", "alpha")
    assert authenticate(config(), "", {"OPERATOR": "o"}) is None
    # No token anywhere: open.
    assert authenticate(config(), "", {}) == Caller("open")


def test_the_bearer_scheme_is_case_insensitive_and_other_schemes_carry_nothing():
    for header in ("Bearer a", "bearer a", "BEARER a", "  Bearer   a "):
        assert bearer_credential(header) == "a", header
    for header in ("Basic a", "a", "Bearera", ""):
        assert bearer_credential(header) == "", header


def state(caller: Caller) -> SimpleNamespace:
    return SimpleNamespace(**{CALLER: caller})


def test_who_may_act_for_whom():
    app = config()
    env_tokens = pytest.MonkeyPatch()
    for name, value in ALL.items():
        env_tokens.setenv(name, value)
    try:
        assert tenant_of(state(Caller("tenant", "alpha")), "default", app) == "alpha"
        with pytest.raises(HTTPProblem, match="acts for 'alpha', not 'beta'"):
            tenant_of(state(Caller("tenant", "alpha")), "beta", app)
        # The shared token acts for tenants without a token of their own; the operator for anyone.
        assert tenant_of(state(Caller("shared")), "carol", app) == "carol"
        with pytest.raises(HTTPProblem, match="own token only"):
            tenant_of(state(Caller("shared")), "beta", app)
        assert tenant_of(state(Caller("operator")), "beta", app) == "beta"
    finally:
        env_tokens.undo()


def test_an_open_api_off_loopback_refuses_to_start_unless_the_config_says_so():
    app = config()
    with pytest.raises(OpenServiceRefused, match="binds 0.0.0.0 and no token is set"):
        refuse_open_service(app, "0.0.0.0", {})
    refuse_open_service(app, "127.0.0.1", {})  # this machine only
    refuse_open_service(app, None, {})  # outside Serve
    refuse_open_service(app, "0.0.0.0", {"BETA": "b"})  # a tenant's token closes it
    refuse_open_service(config(allow_unauthenticated=True), "0.0.0.0", {})


def work(in_flight: int, tokens: float) -> dict[str, float]:
    return {"groups_in_flight": in_flight, "waiting_for_engine": 0, "at_engine": 0, "recent_groups": 1,
            "recent_tokens": tokens}


def test_a_tenant_sees_its_own_row_and_totals_for_the_rest():
    totals = {"alpha": work(1, 100), "beta": work(5, 300), "carol": work(0, 600)}
    view = tenants_view(totals, Caller("tenant", "alpha"), top=50)
    assert list(view["tenants"]) == ["alpha"]
    assert view["tenants"]["alpha"]["recent_share"] == pytest.approx(0.1)
    assert view["other"]["tenants"] == 2 and view["other"]["groups_in_flight"] == 5
    assert view["other"]["recent_share"] == pytest.approx(0.9)
    # A tenant with nothing on the replicas still gets its (empty) row, and no other name.
    assert tenants_view(totals, Caller("tenant", "zed"), top=50)["tenants"] == {
        "zed": {"groups_in_flight": 0, "members_waiting": 0, "waiting_for_engine": 0, "at_engine": 0, "recent_groups": 0,
                "recent_tokens": 0, "recent_share": 0.0}}


def test_the_shared_and_operator_tokens_see_the_busiest_by_name_and_the_rest_summed():
    totals = {f"t{i:04}": work(i % 7, float(i)) for i in range(2000)}
    for caller in (Caller("shared"), Caller("operator"), Caller("open")):
        view = tenants_view(totals, caller, top=50)
        assert len(view["tenants"]) == 50 and view["other"]["tenants"] == 1950
        assert all(row["groups_in_flight"] == 6 for row in view["tenants"].values())  # the busiest first
        shares = sum(row["recent_share"] for row in view["tenants"].values()) + view["other"]["recent_share"]
        assert shares == pytest.approx(1.0)
    assert tenants_view({"a": work(1, 1)}, Caller("shared"), top=50)["other"] is None


def test_demand_view_is_scoped_and_bounded():
    demands = [Demand(f"t{i}", groups=i, starts_at=110.0, ends_at=200.0, announced_at=90.0) for i in range(100)]
    demands.append(Demand("gone", groups=0, starts_at=100.0, ends_at=100.0, announced_at=95.0))  # a withdrawal
    everyone = demand_view(demands, 100.0, Caller("operator"), top=10)
    assert [entry["tenant"] for entry in everyone["announcements"]] == [f"t{i}" for i in range(99, 89, -1)]
    assert everyone["announcements"][0] == {"tenant": "t99", "groups": 99, "starts_in_s": 10.0, "ends_in_s": 100.0,
                                            "announced_s_ago": 10.0}
    assert everyone["other"] == {"tenants": 89, "groups": sum(range(1, 90))}  # t0 withdrew nothing: 0 groups
    own = demand_view(demands, 100.0, Caller("tenant", "t5"), top=10)
    assert [entry["tenant"] for entry in own["announcements"]] == ["t5"] and own["other"]["tenants"] == 98


# -- the guard, as Serve's proxy would drive it (ASGI messages) -------------------------------------

def run_guard(messages: list[dict], headers: dict[str, str]) -> tuple[list[dict], list[str]]:
    """Drive RequestGuard with ``messages`` as the client's body; what it sent, and what reached the app."""
    import asyncio

    from deployments.http.guard import RequestGuard

    reached: list[str] = []

    async def inner(scope, receive, send):
        reached.append(scope["path"])

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    app_config = config()
    scope = {"type": "http", "path": "/v1/score", "method": "POST", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "app": SimpleNamespace(state=SimpleNamespace(config=app_config))}
    env = pytest.MonkeyPatch()
    env.setenv("ALPHA", "a")
    try:
        asyncio.run(RequestGuard(inner)(scope, receive, send))
    finally:
        env.undo()
    return sent, reached


def test_a_client_that_leaves_mid_body_gets_nothing_and_reaches_no_route():
    part = {"type": "http.request", "body": b"{" * 1000, "more_body": True}
    gone = {"type": "http.disconnect"}
    # Authenticated, within the limit: the route never sees a body that ended in a disconnect (it would
    # fail reading it, logged as an internal error).
    sent, reached = run_guard([dict(part), dict(gone)], {"Authorization": "Bearer a", "Content-Length": "100000"})
    assert (sent, reached) == ([], [])
    # Refused (no token): the client left while its body was being dropped; no answer is written to it.
    sent, reached = run_guard([dict(part), dict(gone)], {"Content-Length": "20000"})
    assert (sent, reached) == ([], [])
    # Still there: the 401 goes out, and only 64 KiB of an unauthenticated body is read for it.
    big = [{"type": "http.request", "body": b"x" * 16384, "more_body": True} for _ in range(1000)]
    sent, reached = run_guard(big, {"Content-Length": str(16384 * 1000)})
    assert sent[0]["status"] == 401 and reached == []
    assert (b"connection", b"close") in sent[0]["headers"]
    assert len(big) == 1000  # declared beyond the bound: answered at once, nothing read
    sent, reached = run_guard(big, {})  # chunked, no length: read up to the bound, then closed
    assert sent[0]["status"] == 401 and 1000 - len(big) <= 65536 // 16384 + 1
