"""Where the handle path's time goes: the product's Serve handle path against a bare Ray Serve
deployment doing the same engine work, one layer added at a time, at high concurrency.

Paths, each a closed loop of ``--concurrency`` groups in flight through a Serve handle to one replica:

- ``bare_serve``: a bare deployment (a ``GroupScorer`` on the same engine, nothing else) behind
  Serve's default router, called with ``handle.run_group.remote(group)``, as the product's replica is;
- ``bare_serve_group_router``: the same bare deployment behind our group-aware router;
- ``replica_serve_router``: the product's ``GRRMReplica`` (metrics, outstanding-work accounting,
  assembler) behind Serve's default router, raw handle calls;
- ``replica_group_router``: ``GRRMReplica`` behind the group-aware router, raw handle calls;
- ``replica_client``: the product path the ingress uses for whole groups: ``ScorerClient``
  (retry on replica death, availability check, a request id per call) over the group-aware router;
- ``replica_client_members``: the trainer bridge's path: each group's members sent one call each
  through ``ScorerClient.member_result`` and assembled on the replica (4 calls per group).

Besides throughput, each row gives the CPU milliseconds per group each kind of process spent
(``psutil`` CPU times before and after): the driver (the caller and the handle's router loop), the
replica, the ledger replicas, and everything else (controller, proxy, raylet, GCS). On a 2-core
machine the path is CPU-bound, so CPU per group is where the time goes. Paths run interleaved,
``--rounds`` times, each round starting at the next path; ratios are to ``bare_serve`` in the same
round.

SIMULATED ENGINE: the scripted engine (``zero`` answers at once: pure overhead; ``realistic``
takes per-prompt and per-token time), so the figures measure Serve and this project's layers.

    .venv/bin/python -m bench.handle_path            # writes bench/results/handle_path.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from dataclasses import dataclass
from typing import Any

import psutil

from bench.common import local_serve, machine, print_table, write_json
from bench.serving import ENGINES, closed_loop, make_group
from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, make_engine
from cluster.protocol.schema import GroupRequest, GroupResult, MemberRequest
from cluster.scorer import GroupScorer
from deployments.config import AppConfig, ReplicaSettings, RoutingSettings


@dataclass(frozen=True)
class Path:
    name: str
    bare: bool  # the bare deployment instead of GRRMReplica
    router: str  # "serve_default" or "group_aware"
    client: bool  # through ScorerClient instead of raw handle calls
    members: bool = False  # one call per member (the bridge's path) instead of one per group


PATHS = (
    Path("bare_serve", bare=True, router="serve_default", client=False),
    Path("bare_serve_group_router", bare=True, router="group_aware", client=False),
    Path("replica_serve_router", bare=False, router="serve_default", client=False),
    Path("replica_group_router", bare=False, router="group_aware", client=False),
    Path("replica_client", bare=False, router="group_aware", client=True),
    Path("replica_client_members", bare=False, router="group_aware", client=True, members=True),
)


LEDGER_PROCESS = f":{AppConfig.model_fields['ledger_deployment_name'].default}"


class BareScorer:
    """The reference: a Serve deployment that only scores groups on the engine."""

    async def __init__(self, config: AppConfig):
        self.engine = make_engine(config.engine)
        await self.engine.start()
        self.scorer = GroupScorer(self.engine, config.scoring)

    async def run_group(self, group: GroupRequest) -> GroupResult:
        return await self.scorer.score_group(group)

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid()}


def members_of(group: GroupRequest) -> list[MemberRequest]:
    """The group as the bridge sends it: one request per candidate, numbered by position."""
    return [
        MemberRequest(group_id=group.group_id, group_size=len(group.candidates), index=index, source=group.source,
                      candidate=candidate, src_lang=group.src_lang, trg_lang=group.trg_lang)
        for index, candidate in enumerate(group.candidates)
    ]


def app_config(engine: str, router: str, concurrency: int) -> AppConfig:
    # Room for every call in flight (4 per group on the member path): none waits in a queue.
    return AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ENGINES[engine]),
        scoring=ScoringConfig(),
        routing=RoutingSettings(router=router),
        replicas=ReplicaSettings(num_replicas=1, num_cpus=1, gpus_per_rank=0, max_ongoing_requests=8 * concurrency),
    )


def deploy(path: Path, config: AppConfig):
    """Run the path's application; returns a handle to its scorer deployment."""
    from ray import serve

    from deployments.app import build_app, replica_options

    if path.bare:
        options = replica_options(config) | {"name": "BareScorer"}
        app = serve.deployment(BareScorer).options(**options).bind(config)
        serve.run(app, name="handle-path", route_prefix=None)
        return serve.get_deployment_handle("BareScorer", app_name="handle-path")
    serve.run(build_app(config), name="handle-path", route_prefix="/handle-path")
    return serve.get_deployment_handle(config.replica_deployment_name, app_name="handle-path")


def cpu_seconds_by_kind(driver_pid: int, replica_pid: int) -> dict[str, float]:
    """CPU seconds so far of the driver, the replica, the ledger replicas (Ray names their processes
    ``ray::ServeReplica:<app>:<deployment>``) and every other process of this user."""
    totals = {"driver": 0.0, "replica": 0.0, "ledger": 0.0, "other": 0.0}
    user = psutil.Process().username()
    for process in psutil.process_iter(["pid", "username", "cmdline"]):
        if process.info["username"] != user:
            continue
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        kind = {driver_pid: "driver", replica_pid: "replica"}.get(process.info["pid"])
        if kind is None:
            kind = "ledger" if LEDGER_PROCESS in " ".join(process.info["cmdline"] or ()) else "other"
        totals[kind] += times.user + times.system
    return totals


def measure(path: Path, handle, engine: str, concurrency: int, groups: int) -> dict[str, Any]:
    """One closed-loop run of ``groups`` groups through the path (``handle``: to its application's scorer
    deployment); throughput and CPU per group."""
    from deployments.client import ScorerClient

    replica_pid = handle.info.remote().result()["pid"]
    client = ScorerClient(handle) if path.client else None
    calls_per_group = len(make_group(0).candidates) if path.members else 1

    async def send(group: GroupRequest) -> None:
        if path.members:
            results = await asyncio.gather(*(client.member_result(member) for member in members_of(group)))
            assert all(result.valid for result in results), results
            return
        if client is not None:
            result = await client.group_result(group)
        else:
            result = await handle.run_group.remote(group)
        assert result.valid, result

    asyncio.run(closed_loop(send, concurrency, min(groups, 4 * concurrency)))  # warm-up
    before = cpu_seconds_by_kind(os.getpid(), replica_pid)
    latencies, wall = asyncio.run(closed_loop(send, concurrency, groups))
    after = cpu_seconds_by_kind(os.getpid(), replica_pid)
    return {
        "path": path.name,
        "engine": engine,
        "concurrency": concurrency,
        "groups": groups,
        "groups_per_s": len(latencies) / wall,
        "calls_per_s": len(latencies) * calls_per_group / wall,
        "p50_ms": statistics.median(latencies) * 1000,
        **{f"cpu_ms_per_call_{kind}": (after[kind] - before[kind]) * 1000 / (groups * calls_per_group)
           for kind in before},
        **{f"cpu_ms_per_group_{kind}": (after[kind] - before[kind]) * 1000 / groups for kind in before},
        "simulated": True,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--groups", type=int, default=1024, help="groups per run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over all paths")
    parser.add_argument("--engines", default="zero,realistic")
    parser.add_argument("--quick", action="store_true",
                        help="one round, 16 groups, zero engine (CI: that every path runs, not what it costs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.rounds, args.engines = 16, 1, "zero"

    from ray import serve

    runs: list[dict[str, Any]] = []
    with local_serve():
        for engine in args.engines.split(","):
            for round_index in range(args.rounds):
                # Each round starts at another path, so no path always runs first (on a fresh app). Quick:
                # consecutive paths on the same application share one deployment (the group router's three).
                up = None  # (bare, router) of the application running, and a handle to its scorer
                for path in PATHS[round_index % len(PATHS):] + PATHS[:round_index % len(PATHS)]:
                    if up is None or not args.quick or up[0] != (path.bare, path.router):
                        if up is not None:
                            serve.delete("handle-path")
                        up = (path.bare, path.router), deploy(path, app_config(engine, path.router, args.concurrency))
                    row = measure(path, up[1], engine, args.concurrency, args.groups) | {"round": round_index}
                    print(f"[bench] {row}", flush=True)
                    runs.append(row)
                serve.delete("handle-path")

    rows = aggregate(runs)
    print_table(rows, COLUMNS)
    write_json("handle_path", rows, {"machine": machine(), "settings": vars(args),
                                     "engines": {name: ENGINES[name].model_dump() for name in args.engines.split(",")}})
    return 0


COLUMNS = ["engine", "path", "concurrency", "rounds", "groups_per_s", "vs_bare_serve", "calls_per_s",
           "calls_vs_bare_serve", "p50_ms", "cpu_ms_per_call_driver", "cpu_ms_per_call_replica",
           "cpu_ms_per_group_driver", "cpu_ms_per_group_replica", "cpu_ms_per_group_ledger",
           "cpu_ms_per_group_other"]
MEANS = ("groups_per_s", "calls_per_s", "p50_ms", "cpu_ms_per_call_driver", "cpu_ms_per_call_replica",
         "cpu_ms_per_group_driver", "cpu_ms_per_group_replica", "cpu_ms_per_group_ledger", "cpu_ms_per_group_other")


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine and path: means over rounds, and throughput over bare_serve's in the same round."""
    rows = []
    for engine in dict.fromkeys(run["engine"] for run in runs):
        bare = {r["round"]: r for r in runs if r["engine"] == engine and r["path"] == "bare_serve"}
        for path in PATHS:
            mine = [run for run in runs if run["engine"] == engine and run["path"] == path.name]
            if not mine:
                continue
            row = {"engine": engine, "path": path.name, "concurrency": mine[0]["concurrency"], "rounds": len(mine)}
            for key in MEANS:
                row[key] = statistics.fmean(run[key] for run in mine)
            row["vs_bare_serve"] = statistics.fmean(r["groups_per_s"] / bare[r["round"]]["groups_per_s"] for r in mine)
            row["calls_vs_bare_serve"] = statistics.fmean(r["calls_per_s"] / bare[r["round"]]["calls_per_s"] for r in mine)
            row["simulated"] = True
            rows.append(row)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
