"""A careless or hostile tenant on a shared pool, through the real HTTP API (issue: a shared pool that no
tenant can take down or run up).

Tokens: alpha and beta have their own, an operator has one, and the shared token's variable is unset:
closed by default, a request without one of them is refused. Each tenant sees its own row of
``/v1/tenants`` and only totals of the rest; the operator sees every tenant, bounded to
``tenants.list_top`` names, lists every announcement and withdraws any. ``/v1/demand`` is strict.
A client that leaves in the middle of its body is no internal error. Engine: scripted (the tests are
about the API)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import ray
from ray import serve

from cluster.engines import EngineConfig
from deployments.app import build_app
from deployments.config import AppConfig, HTTPSettings, ReplicaSettings, TenantSettings, TenantsSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "hostile"
OPERATOR, ALPHA, BETA = "operator-5e1b", "alpha-0c4d", "beta-9a7f"


@pytest.fixture(scope="module")
def url(serve_instance):
    config = AppConfig(
        engine=EngineConfig(kind="scripted"),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0),
        http=HTTPSettings(
            auth_token_env="GRRM_HOSTILE_SHARED_TOKEN_UNSET",  # named, never set: no shared token
            operator_token_env="GRRM_HOSTILE_OPERATOR_TOKEN",
            env_vars={"GRRM_HOSTILE_OPERATOR_TOKEN": OPERATOR, "GRRM_HOSTILE_ALPHA_TOKEN": ALPHA,
                      "GRRM_HOSTILE_BETA_TOKEN": BETA},
            tenants=[TenantSettings(name="alpha", token_env="GRRM_HOSTILE_ALPHA_TOKEN"),
                     TenantSettings(name="beta", token_env="GRRM_HOSTILE_BETA_TOKEN")],
        ),
        tenants=TenantsSettings(list_top=2),
        assembly_timeout_s=5,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


def bearer(token: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}"}


def group(tag: str, tenant: str | None = None) -> dict:
    body = {"source": f"Sentence {tag}.", "candidates": [f"good {tag} [q=8]", f"bad {tag} [q=2]"],
            "src_lang": "en", "trg_lang": "de"}
    return {**body, "tenant": tenant} if tenant else body


def score(url: str, headers: dict[str, str], tenant: str | None = None, tag: str = "g") -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json={"groups": [group(tag, tenant)]}, headers=headers, timeout=60)


def test_with_only_tenant_and_operator_tokens_a_request_without_one_is_refused(url):
    # The shared token's variable is unset: before, a request with no token acted as any unlisted tenant.
    for headers in ({}, bearer("wrong"), {"Authorization": "Bearer"}, {"Authorization": ALPHA}, bearer(ALPHA, "Basic")):
        answer = score(url, headers, tag="refused")
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.json()["code"] == "unauthorized" and answer.headers["www-authenticate"] == "Bearer"
    # The scheme's case does not matter (RFC 7235).
    for scheme in ("Bearer", "bearer", "BEARER"):
        answer = score(url, bearer(ALPHA, scheme), tag=scheme)
        assert answer.status_code == 200 and answer.json()["results"][0]["valid"], (scheme, answer.text)
    # The operator acts for a tenant without a token of its own, and for one with.
    assert score(url, bearer(OPERATOR), tenant="carol").status_code == 200
    assert score(url, bearer(OPERATOR), tenant="beta").status_code == 200
    assert score(url, bearer(ALPHA), tenant="beta").status_code == 403


def test_the_ingress_knows_the_host_it_is_served_on(url):
    # The start-up refusal of an open API off loopback (tests/test_http_auth.py) reads this host from
    # Serve: the test cluster binds loopback, so the service started.
    assert httpx.get(f"{url}/v1/info", headers=bearer(ALPHA), timeout=30).json()["http_host"] == "127.0.0.1"


@pytest.mark.parametrize("fields, named", [
    ({"lasts_s": "10"}, "lasts_s"),
    ({"lasts_s": True}, "lasts_s"),
    ({"lasts_s": 10, "starts_in_s": "5"}, "starts_in_s"),
    ({"lasts_s": 10, "profile": [1, "2"]}, "profile.1"),
    ({"lasts_s": 10, "profile": [1e308, 1e308]}, "profile"),
])
def test_demand_fields_are_strict(url, fields, named):
    answer = httpx.post(f"{url}/v1/demand", json={"groups": 4, **fields}, headers=bearer(ALPHA), timeout=30)
    assert answer.status_code == 422, answer.text
    assert named in answer.text
    assert httpx.post(f"{url}/v1/demand", json={"groups": 0, "lasts_s": 10}, headers=bearer(ALPHA),
                      timeout=30).status_code == 200  # an int where a float goes is no coercion


def tenants(url: str, token: str) -> dict:
    answer = httpx.get(f"{url}/v1/tenants", headers=bearer(token), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_tenant_sees_its_own_row_and_the_operator_sees_all_bounded(url):
    for tenant, token in (("alpha", ALPHA), ("beta", BETA), ("dave", OPERATOR), ("erin", OPERATOR)):
        assert score(url, bearer(token), tenant=tenant if token == OPERATOR else None, tag=tenant).status_code == 200
    as_alpha = tenants(url, ALPHA)
    assert list(as_alpha["tenants"]) == ["alpha"] and as_alpha["tenants"]["alpha"]["recent_groups"] >= 1
    assert as_alpha["other"]["tenants"] >= 3 and as_alpha["other"]["recent_groups"] >= 3
    assert "beta" not in str(as_alpha) and "erin" not in str(as_alpha)
    assert list(tenants(url, BETA)["tenants"]) == ["beta"]
    # The operator: every tenant, the busiest two (tenants.list_top) by name, the rest summed.
    as_operator = tenants(url, OPERATOR)
    assert len(as_operator["tenants"]) == 2 and as_operator["other"]["tenants"] >= 2
    assert httpx.get(f"{url}/v1/tenants", timeout=30).status_code == 401


def test_the_operator_lists_and_withdraws_any_announcement(url):
    day = {"groups": 10_000_000, "lasts_s": 86_400}
    assert httpx.post(f"{url}/v1/demand", json=day, headers=bearer(BETA), timeout=30).json()["tenant"] == "beta"

    def listed(token: str) -> list[str]:
        answer = httpx.get(f"{url}/v1/demand", headers=bearer(token), timeout=30)
        assert answer.status_code == 200, answer.text
        return [entry["tenant"] for entry in answer.json()["announcements"]]

    assert listed(OPERATOR) == ["beta"] and listed(BETA) == ["beta"] and listed(ALPHA) == []
    # Nobody else withdraws beta's: not alpha's token, not a missing one.
    assert httpx.delete(f"{url}/v1/demand/beta", headers=bearer(ALPHA), timeout=30).status_code == 403
    assert httpx.delete(f"{url}/v1/demand/beta", timeout=30).status_code == 401
    assert listed(OPERATOR) == ["beta"]
    withdrawn = httpx.delete(f"{url}/v1/demand/beta", headers=bearer(OPERATOR), timeout=30)
    assert withdrawn.status_code == 200 and withdrawn.json() == {**withdrawn.json(), "tenant": "beta", "groups": 0}
    assert listed(OPERATOR) == []
    # A tenant withdraws its own.
    httpx.post(f"{url}/v1/demand", json=day, headers=bearer(ALPHA), timeout=30)
    assert httpx.delete(f"{url}/v1/demand/alpha", headers=bearer(ALPHA), timeout=30).status_code == 200
    assert listed(OPERATOR) == []


def ingress_log_lines() -> list[str]:
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    lines = []
    for path in logs.glob(f"replica_{APP}_GRRMIngress_*.log"):
        lines += [line for line in path.read_text(errors="replace").splitlines() if line]
    return lines


def send_part_and_leave(url: str, headers: dict[str, str], declared: int, sent: int) -> None:
    address = urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        head = [f"POST {address.path}/v1/score HTTP/1.1", f"Host: {address.hostname}",
                "Content-Type: application/json", f"Content-Length: {declared}",
                *(f"{name}: {value}" for name, value in headers.items())]
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"{" + b" " * (sent - 1))
        time.sleep(0.5)


def test_a_client_that_leaves_mid_body_is_not_an_internal_error(url):
    before = len(ingress_log_lines())
    send_part_and_leave(url, bearer(ALPHA), declared=200_000, sent=20_000)  # within the limit, then gone
    send_part_and_leave(url, {}, declared=200_000, sent=20_000)  # unauthenticated, then gone
    send_part_and_leave(url, bearer(ALPHA), declared=40_000_000, sent=20_000)  # over the limit, then gone
    time.sleep(2)  # the ingress sees the disconnects
    assert score(url, bearer(ALPHA), tag="after").status_code == 200
    new = ingress_log_lines()[before:]
    assert not [line for line in new if "internal error" in line.lower() or "Traceback" in line
                or "ClientDisconnect" in line], new[-20:]


SLOTS = 40  # max_ongoing_requests of the flooded replica: beta may hold half waiting (max_waiting_members)


def test_a_tenant_whose_groups_never_complete_cannot_take_the_replicas_slots(serve_instance):
    """beta sends one member of each of 60 groups of 8 (a trainer configured with the wrong group_size): they
    never complete. Each waiting member holds one of the replica's 40 request slots; before the per-tenant
    bound they took all of them, and alpha's group waited until beta's timed out. Now beta holds at most
    half (its further groups get 503 ``overloaded`` with Retry-After, naming it), and alpha is answered
    while beta's admitted members still wait."""
    import asyncio

    config = AppConfig(
        engine=EngineConfig(kind="scripted"),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=0.5, gpus_per_rank=0, max_ongoing_requests=SLOTS,
                                 max_queued_requests=-1),
        http=HTTPSettings(auth_token_env=None),
        assembly_timeout_s=20,  # beta's admitted members wait this long; alpha is answered well before
    )
    serve.run(build_app(config), name="flooded", route_prefix="/flooded")
    flooded = f"{serve_instance}/flooded"

    async def scenario():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as http:
            async def beta_member(i: int) -> httpx.Response:
                return await http.post(f"{flooded}/v1/score/member", json={
                    "tenant": "beta", "group_id": f"never-{i}", "group_size": 8, "index": 0, "source": "S.",
                    "candidate": f"c{i}", "src_lang": "en", "trg_lang": "de"})

            flood = [asyncio.create_task(beta_member(i)) for i in range(60)]
            deadline = time.monotonic() + 60
            while sum(task.done() for task in flood) < 60 - SLOTS // 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the refusals come back at once; the admitted ones wait
            alpha = await http.post(f"{flooded}/v1/score", json={"groups": [group("alpha-beside", "alpha")]})
            still_waiting = sum(not task.done() for task in flood)
            return alpha, still_waiting, await asyncio.gather(*flood)

    try:
        alpha, still_waiting, flood = asyncio.run(scenario())
    finally:
        serve.delete("flooded")
    assert alpha.status_code == 200 and alpha.json()["results"][0]["valid"], alpha.text
    assert still_waiting == SLOTS // 2, still_waiting  # alpha was answered while beta's admitted members waited
    refused = [answer for answer in flood if answer.status_code == 503]
    assert len(refused) == 60 - SLOTS // 2
    assert all(answer.json()["code"] == "overloaded" and "tenant beta" in answer.json()["error"]
               and "max_waiting_members" in answer.json()["error"] and "retry-after" in answer.headers
               for answer in refused)
    assert {answer.status_code for answer in flood} == {503, 504}  # the admitted ones timed out, as they must
