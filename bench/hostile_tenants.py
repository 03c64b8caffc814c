"""A careless or hostile tenant on a shared pool: what it costs the others, and what it costs the service.

SIMULATED engine (scripted), real Ray Serve, real HTTP. Three cases, each on an application of its own:

* ``stall``: a tenant whose groups never complete (a trainer with the wrong ``group_size``: 1,100 members,
  one of each group of 8) beside another tenant's whole groups, on 2 replicas of 256 request slots each
  (members waiting for group-mates hold one each), every request over raw HTTP without retries (as the
  attacker sent them) and given up at 180 s (OpenRLHF's client limit). ``fifo``: first come first served
  and no bound on a tenant's waiting members (as before the bound); ``defaults``: the fair queue and
  ``max_waiting_members`` unset (half a replica's slots). Reported: alpha's ``/v1/score`` of one group alone
  (median of 5), the first one sent 2 s into the flood, and the slowest of 5 sent once the flood's refusals
  were answered; beta's members refused (503), timed out (504) and unanswered at 180 s.
* ``announcements``: 500 tenant names announce demand with 64-slice profiles, then all withdraw.
  Reported after each: ``GET /v1/info``'s slowest of 3, the keys the ingress reports to the autoscaling
  policy (and the keys the earlier format, 4 + profile length per tenant, would have held: computed), and
  Serve's controller CPU share over 10 s.
* ``refusals``: 30 uploads of 60 MB: unauthenticated (a ``401`` after at most 64 KiB, then the connection
  closed), and with the token but over ``limits.max_request_bytes`` (a ``413`` after the body is read and
  dropped, up to ``limits.max_discard_bytes``, 64 MiB). Reported: the resident memory of Serve's proxy and
  the ingress before, and after each series has ended; both start with ``deployments/process_env.py``'s
  environment, as the shipped configurations start them.

    .venv/bin/python -m bench.hostile_tenants          # bench/results/hostile_tenants.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx

from bench.common import local_serve, machine, print_table, results_dir, write_json
from cluster.engines import EngineConfig, ScriptedEngineOptions
from deployments.process_env import BODY_MEMORY_ENV

APP = "hostile-bench"
CASES = ("stall", "announcements", "refusals")
STALL_COLUMNS = ["mode", "slots", "flood_members", "alpha_solo_s", "alpha_first_s", "alpha_beside_s",
                 "beside_over_solo", "flood_refused", "flood_timed_out", "flood_unanswered"]
ANNOUNCEMENT_COLUMNS = ["phase", "tenants", "info_s", "report_keys", "report_keys_per_tenant_format",
                        "controller_cpu_percent", "controller_rss_mib"]
REFUSAL_COLUMNS = ["refusal", "uploads", "upload_mb", "answered", "closed_early", "proxy_growth_mib",
                   "ingress_growth_mib", "growth_mib"]
TOKEN = "bench-hostile-token"
MIB = 1024 * 1024


def deploy(serve, *, slots: int = 2048, bounded: bool = True, assembly_timeout_s: float = 60.0,
           autoscaling: bool = False, token: bool = False) -> None:
    """The scripted engine on 2 replicas of ``slots`` request slots (``autoscaling``: the project's policy,
    1 to 2 replicas, so that the ingress reports announcements); ``bounded``: the defaults, else first come
    first served with no bound on a tenant's waiting members; ``token``: a shared token is set."""
    from deployments.app import build_app
    from deployments.config import (
        AppConfig,
        AutoscalingSettings,
        HTTPSettings,
        ReplicaSettings,
        TenantDefaults,
        TenantsSettings,
    )

    scaling = AutoscalingSettings(min_replicas=1, max_replicas=2) if autoscaling else None
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.05)),
        replicas=ReplicaSettings(num_replicas=None if autoscaling else 2, autoscaling=scaling, num_cpus=0.25,
                                 gpus_per_rank=0, max_ongoing_requests=slots, max_queued_requests=1024),
        http=HTTPSettings(auth_token_env="GRRM_BENCH_HOSTILE_TOKEN" if token else None,
                          env_vars={"GRRM_BENCH_HOSTILE_TOKEN": TOKEN} if token else {}),
        tenants=TenantsSettings(fair_share=bounded,
                                default=TenantDefaults(max_waiting_members=None if bounded else 10**9)),
        assembly_timeout_s=assembly_timeout_s,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")


# -- stall ------------------------------------------------------------------------------------------

SOURCE = {"source": "A sentence.", "src_lang": "en", "trg_lang": "de"}


async def stall_case(url: str, members: int, client_limit_s: float, tag: str, samples: int = 5,
                     lead_s: float = 2.0) -> dict:
    """alpha's whole groups alone, then beside ``members`` never-completing members of beta (``samples``
    groups each time, the first beside them sent ``lead_s`` into the flood)."""

    async def alpha(http: httpx.AsyncClient, index: int) -> float:
        started = time.monotonic()
        answer = await http.post(f"{url}/v1/score", json={"groups": [{
            **SOURCE, "tenant": "alpha", "group_id": f"{tag}-alpha-{index}",
            "candidates": [f"good {index} [q=8]", f"bad {index} [q=2]"]}]})
        if answer.status_code != 200 or not answer.json()["results"][0]["valid"]:
            raise RuntimeError(f"alpha's group {index}: {answer.status_code} {answer.text[:200]}")
        return time.monotonic() - started

    async def beta(http: httpx.AsyncClient, index: int) -> str:
        try:
            answer = await http.post(f"{url}/v1/score/member", json={
                **SOURCE, "tenant": "beta", "group_id": f"{tag}-never-{index}", "group_size": 8, "index": 0,
                "candidate": f"c{index}"})
        except httpx.TimeoutException:
            return "unanswered"
        return {503: "refused", 504: "timed_out"}.get(answer.status_code, str(answer.status_code))

    async with httpx.AsyncClient(timeout=client_limit_s, limits=httpx.Limits(max_connections=members + 16)) as http:
        await alpha(http, -1)  # connections and replicas warm
        solo = [await alpha(http, i) for i in range(samples)]
        flood = [asyncio.create_task(beta(http, i)) for i in range(members)]
        await asyncio.sleep(lead_s)
        first = await alpha(http, samples)
        settled, done = time.monotonic() + client_limit_s, -1
        while time.monotonic() < settled:  # the refusals come back at once; the admitted members wait
            now_done = sum(task.done() for task in flood)
            if now_done == done:
                break
            done = now_done
            await asyncio.sleep(1.0)
        beside = [await alpha(http, samples + 1 + i) for i in range(samples)]
        outcomes = await asyncio.gather(*flood)
    solo_s = statistics.median(solo)
    known = ("refused", "timed_out", "unanswered")
    return {"alpha_solo_s": solo_s, "alpha_first_s": first, "alpha_beside_s": max(beside),
            "beside_over_solo": max(beside) / solo_s, "flood_refused": outcomes.count("refused"),
            "flood_timed_out": outcomes.count("timed_out"), "flood_unanswered": outcomes.count("unanswered"),
            "flood_other": len(outcomes) - sum(outcomes.count(kind) for kind in known)}


# -- processes of the service -------------------------------------------------------------------------

def service_process(marker: str):
    """The process of this Ray cluster's Serve actor whose name holds ``marker`` (``SERVE_CONTROLLER_ACTOR``,
    ``SERVE_PROXY_ACTOR``, ``<app>#GRRMIngress``): asked of the actor itself, since a process name
    (``ray::ServeController``) is also another cluster's on a machine that runs several."""
    import psutil
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == "serve" and marker in actor["name"]:
            handle = ray.get_actor(actor["name"], namespace="serve")
            return psutil.Process(ray.get(handle.__ray_call__.remote(lambda _: os.getpid()), timeout=60))
    raise RuntimeError(f"no Serve actor of this cluster is named like {marker!r}")


def rss_mib(process) -> float:
    return process.memory_info().rss / MIB


# -- announcements ------------------------------------------------------------------------------------

async def timed_get(http: httpx.AsyncClient, url: str) -> float:
    started = time.monotonic()
    answer = await http.get(url, timeout=120)
    answer.raise_for_status()
    return time.monotonic() - started


async def ingress_report_keys(serve) -> int:
    handle = serve.get_deployment_handle("GRRMIngress", app_name=APP)
    return len(await handle.record_autoscaling_stats.remote())


async def announcements_case(serve, url: str, tenants: int, window_s: float = 10.0) -> list[dict]:
    """``tenants`` names announce (64-slice profiles), then withdraw; /v1/info, report size, and the
    controller's CPU share over ``window_s`` after each."""
    controller = service_process("SERVE_CONTROLLER_ACTOR")
    profile = [1.0 + (slice_ % 7) for slice_ in range(64)]

    async def measure(http: httpx.AsyncClient, phase: str, announced: int) -> dict:
        controller.cpu_percent(None)
        await asyncio.sleep(window_s)
        cpu = controller.cpu_percent(None)
        info_s = max([await timed_get(http, f"{url}/v1/info") for _ in range(3)])
        return {"phase": phase, "tenants": tenants, "info_s": info_s, "report_keys": await ingress_report_keys(serve),
                "report_keys_per_tenant_format": announced * (4 + len(profile)),
                "controller_cpu_percent": cpu, "controller_rss_mib": rss_mib(controller)}

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=32)) as http:
        rows = [await measure(http, "before", 0)]
        gate = asyncio.Semaphore(32)

        async def announce(index: int, groups: int) -> None:
            async with gate:
                answer = await http.post(f"{url}/v1/demand", json={
                    "tenant": f"sweep-{index:05d}", "groups": groups, "starts_in_s": 30.0, "lasts_s": 600.0,
                    "profile": profile})
                answer.raise_for_status()

        await asyncio.gather(*(announce(index, 1000) for index in range(tenants)))
        rows.append(await measure(http, "announced", tenants))
        await asyncio.gather(*(announce(index, 0) for index in range(tenants)))
        rows.append(await measure(http, "withdrawn", 0))
    return rows


# -- refusals -----------------------------------------------------------------------------------------

async def upload_series(url: str, uploads: int, size: int, headers: dict[str, str]) -> dict:
    """``uploads`` bodies of ``size`` bytes, 5 at a time; how many got their answer, how many were closed."""
    chunk = b"x" * MIB

    async def body():
        for _ in range(size // MIB):
            yield chunk

    answered = closed = 0
    gate = asyncio.Semaphore(5)
    async with httpx.AsyncClient(timeout=120) as http:
        async def one() -> None:
            nonlocal answered, closed
            async with gate:
                try:
                    answer = await http.post(f"{url}/v1/score", content=body(), headers=headers)
                    answered += answer.status_code in (401, 413)
                except httpx.TransportError:
                    closed += 1  # answered and closed while still sending: the client saw the close first

        await asyncio.gather(*(one() for _ in range(uploads)))
    return {"answered": answered, "closed_early": closed}


async def refusals_case(url: str, uploads: int, size: int, settle_s: float = 5.0) -> list[dict]:
    proxy, ingress = service_process("SERVE_PROXY_ACTOR"), service_process(f"{APP}#GRRMIngress")
    rows = []
    for refusal, headers in (("401 unauthenticated", {}),
                             ("413 over max_request_bytes", {"Authorization": f"Bearer {TOKEN}"})):
        before = rss_mib(proxy), rss_mib(ingress)
        outcome = await upload_series(url, uploads, size, headers)
        await asyncio.sleep(settle_s)  # the series has ended in the proxy and ingress before memory is read
        proxy_growth, ingress_growth = rss_mib(proxy) - before[0], rss_mib(ingress) - before[1]
        rows.append({"refusal": refusal, "uploads": uploads, "upload_mb": size // MIB, **outcome,
                     "proxy_growth_mib": proxy_growth, "ingress_growth_mib": ingress_growth,
                     "growth_mib": proxy_growth + ingress_growth})
        print_table(rows[-1:], REFUSAL_COLUMNS)
    return rows


def kept_rows(cases: set[str]) -> list[dict]:
    """The last results' rows of the cases not run now (none when every case runs)."""
    path = results_dir() / "hostile_tenants.json"
    if set(CASES) <= cases or not path.exists():
        return []
    return [row for row in json.loads(path.read_text()) if row["case"] not in cases]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small floods and short windows (CI: that every case runs, not what it measures)")
    parser.add_argument("--cases", default=",".join(CASES), help="which to run: %(default)s")
    args = parser.parse_args(argv)
    cases = {case.strip() for case in args.cases.split(",")}
    if cases - set(CASES):
        parser.error(f"--cases: unknown {sorted(cases - set(CASES))} (choose from {', '.join(CASES)})")

    from ray import serve

    # Serve's proxy starts with this process's environment: as `grrm serve` and the Kubernetes pods start it.
    for name, value in BODY_MEMORY_ENV.items():
        os.environ.setdefault(name, value)
    rows: list[dict] = []
    with local_serve() as base:
        url = f"{base}/{APP}"
        slots, members = (16, 40) if args.quick else (256, 1100)
        # Quick: one of alpha's groups per sample; the controller's CPU share over 0.5 s, not 10; 2 uploads
        # just over max_request_bytes' default (8 MiB, and past the 401's 64 KiB), memory read 0.5 s after.
        # 50 tenants: enough that the report's fixed keys are fewer than the per-tenant format's would be.
        samples, lead_s = (1, 0.5) if args.quick else (5, 2.0)
        tenants, window_s = (50, 0.5) if args.quick else (500, 10.0)
        uploads, upload_bytes, settle_s = (2, 10 * MIB, 0.5) if args.quick else (30, 60 * MIB, 5.0)
        for mode, bounded in (("fifo", False), ("defaults", True)) if "stall" in cases else ():
            # Quick: the flood's waiting members time out after 3 s (alpha's whole groups never wait for mates).
            deploy(serve, slots=slots, bounded=bounded, assembly_timeout_s=3 if args.quick else 60)
            row = asyncio.run(stall_case(url, members, 30 if args.quick else 180, f"stall-{mode}", samples, lead_s))
            rows.append({"case": "stall", "mode": mode, "slots": slots, "flood_members": members, **row})
            serve.delete(APP)
            print_table(rows[-1:], STALL_COLUMNS)
        if "announcements" in cases:
            deploy(serve, autoscaling=True)
            rows += [{"case": "announcements", **row}
                     for row in asyncio.run(announcements_case(serve, url, tenants, window_s))]
            serve.delete(APP)
            print_table([row for row in rows if row["case"] == "announcements"], ANNOUNCEMENT_COLUMNS)
        if "refusals" in cases:
            deploy(serve, token=True)
            rows += [{"case": "refusals", **row}
                     for row in asyncio.run(refusals_case(url, uploads, upload_bytes, settle_s))]
            serve.delete(APP)

    rows = kept_rows(cases) + rows
    print()
    print_table([row for row in rows if row["case"] == "stall"], STALL_COLUMNS)
    print_table([row for row in rows if row["case"] == "announcements"], ANNOUNCEMENT_COLUMNS)
    print_table([row for row in rows if row["case"] == "refusals"], REFUSAL_COLUMNS)
    write_json("hostile_tenants", rows, {"machine": machine(), "simulated": True, "quick": args.quick,
                                         "settings": vars(args), "pid": os.getpid()})
    print(f"wrote {results_dir() / 'hostile_tenants.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
