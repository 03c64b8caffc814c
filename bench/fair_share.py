"""Fair share: many tenants on one pool, first come first served against the fair queue, in one run.

SIMULATED engine (scripted: a fixed time per group, a bounded number of generations at once per
replica, so that complete groups wait for the engine as they would on a busy GPU), real Ray Serve,
real HTTP: every request goes through the ingress as a trainer's would, with the client of
``grrm_client`` under its tenant. The same cases run with ``tenants.fair_share`` off (FIFO) and on:

* ``flood``: a small run's groups alone, then the same groups sent 3 s after another tenant sent a
  flood of 20x their work. Members are sent as the trainer bridge sends rollouts (one HTTP request
  each). Reported: the small run's last reward after sending, beside the flood / alone.
  ``engine_bound`` (0.4 s per group, one at a time) and ``http_bound`` (0.1 s, two at a time:
  the ingress's CPU, shared on a 2-core machine, is the bottleneck); in the HTTP-bound case also
  with the flood held to ``max_groups_in_flight`` per replica (its excess answered 503 and retried
  by its client with back-off), and with the flood's client sending at most 32 groups at once.
* ``weights``: three backlogged tenants weighted 1:1:2 on one replica; each one's share of the groups
  scored while all three still had work.
* ``alone``: one tenant, fair queue against FIFO: throughput (the queue must not cost any); the
  median of 3 rounds that alternate the modes.
* ``verl``: verl's real trainer (sync mode, on the CPU harness, the bridge as its reward manager)
  trains alone, then while ``grrm score`` floods the same service as tenant ``nightly-eval`` at
  priority -1: with the fair queue, with it and one slot per replica reserved for the higher class
  (``tenants.reserved_slots``), and with FIFO. Reported: its reward wait per step (the bridge's
  ``grrm/exposed_reward_s``: the last reward after the last rollout), beside the flood / alone.
  Minutes of verl start-up per run; ``--no-verl`` skips it.

    .venv/bin/python -m bench.fair_share          # bench/results/fair_share.json, docs/plots/fair_share.png
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.common import local_serve, machine, print_table, plot_path, results_dir, write_json
from cluster.engines import EngineConfig, ScriptedEngineOptions
from cluster.protocol.schema import GroupRequest, MemberRequest

APP = "fair-share"
MEMBERS_PER_GROUP = 4
FLOOD_TENANT = "nightly-eval"
CASES = ("flood", "weights", "alone", "verl")
VERL_COLUMNS = ["run", "mode", "steps", "reward_wait_s", "wait_over_alone", "step_s", "step_over_alone",
                "flood_recent_share", "valid_rewards", "not_valid_by_reason"]


@dataclass(frozen=True)
class Load:
    """One case's engine and traffic."""

    per_group_s: float
    engine_slots: int
    small_groups: int
    flood_groups: int
    replicas: int = 2


def group(tenant: str, tag: str, index: int) -> GroupRequest:
    candidates = [f"{tag} {index} candidate {k} [q={(index + 3 * k) % 10}]" for k in range(MEMBERS_PER_GROUP)]
    return GroupRequest(tenant=tenant, group_id=f"{tag}-{index}", source=f"Source sentence {tag} {index}.",
                        candidates=candidates, src_lang="en", trg_lang="de")


def members(request: GroupRequest) -> list[MemberRequest]:
    return [MemberRequest(tenant=request.tenant, group_id=request.group_id, group_size=len(request.candidates),
                          index=index, source=request.source, candidate=candidate, src_lang=request.src_lang,
                          trg_lang=request.trg_lang)
            for index, candidate in enumerate(request.candidates)]


def client_for(url: str, tenant: str, *, patient: bool = False):
    from grrm_client import ClientConfig, RewardClient

    return RewardClient(ClientConfig(transport="http", http_url=url, tenant=tenant, token_env=None, deadline_s=900,
                                     max_attempts=10_000 if patient else 8, backoff_s=0.2, max_backoff_s=2.0))


async def send_members(client, requests: list[GroupRequest], concurrency: int | None = None) -> float:
    """Every member of every group at once (``concurrency``: of at most that many groups at once, as
    ``grrm score --concurrency`` sends); seconds until the last answer. Raises if one has no reward."""
    started = time.monotonic()
    gate = asyncio.Semaphore(concurrency or len(requests) or 1)

    async def one_group(request: GroupRequest) -> list:
        async with gate:
            return await asyncio.gather(*(client.score_member(one) for one in members(request)))

    outcomes = [outcome for answers in await asyncio.gather(*(one_group(request) for request in requests))
                for outcome in answers]
    missing = [outcome for outcome in outcomes if outcome.result is None or not outcome.result.valid]
    if missing:
        raise RuntimeError(f"{len(missing)} members got no valid reward, e.g. {missing[0].failure}: {missing[0].error}")
    return time.monotonic() - started


def deploy(serve, load: Load, *, fair: bool, limits: dict[str, int] | None = None, weights: dict[str, float] | None = None):
    from deployments.app import build_app
    from deployments.config import AppConfig, HTTPSettings, ReplicaSettings, TenantSettings, TenantsSettings

    tenants = [TenantSettings(name=name, weight=(weights or {}).get(name, 1.0), max_groups_in_flight=limit)
               for name, limit in (limits or {}).items()]
    tenants += [TenantSettings(name=name, weight=weight) for name, weight in (weights or {}).items()
                if name not in (limits or {})]
    config = AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(
            per_prompt_s=load.per_group_s, max_concurrent_prompts=load.engine_slots)),
        replicas=ReplicaSettings(num_replicas=load.replicas, num_cpus=0.25, gpus_per_rank=0,
                                 max_ongoing_requests=4096, max_queued_requests=-1),
        http=HTTPSettings(auth_token_env=None, tenants=tenants),
        tenants=TenantsSettings(fair_share=fair),
        assembly_timeout_s=300,
    )
    serve.run(build_app(config), name=APP, route_prefix=f"/{APP}")


async def flood_case(url: str, load: Load, tag: str, flood_concurrency: int | None = None,
                     flood_lead_s: float = 3.0) -> dict:
    """The small run alone, then beside a flood sent 3 s before it. The small run's groups have the same
    ids both times (its tenant differs, "small-alone" then "small"), so they land on the same replicas."""
    alone, small, flood = client_for(url, "small-alone"), client_for(url, "small"), client_for(url, "flood", patient=True)
    try:
        await send_members(alone, [group("small-alone", f"{tag}-warm", 0)])  # connections and replicas warm
        alone_s = await send_members(alone, [group("small-alone", tag, i) for i in range(load.small_groups)])
        flood_started = time.monotonic()
        flooding = asyncio.create_task(send_members(flood, [group("flood", f"{tag}-flood", i)
                                                            for i in range(load.flood_groups)], flood_concurrency))
        await asyncio.sleep(flood_lead_s)
        beside_s = await send_members(small, [group("small", tag, i) for i in range(load.small_groups)])
        await flooding
        flood_s = time.monotonic() - flood_started
    finally:
        for client in (alone, small, flood):
            await client.aclose()
    return {"small_alone_s": alone_s, "small_beside_flood_s": beside_s, "beside_over_alone": beside_s / alone_s,
            "flood_s": flood_s, "flood_groups_per_s": load.flood_groups / flood_s}


async def weights_case(url: str, weights: dict[str, float], groups_each: int) -> list[dict]:
    """Every tenant sends all its groups at once; shares of the groups finished while all had work."""
    finished: dict[str, list[float]] = {tenant: [] for tenant in weights}
    clients = {tenant: client_for(url, tenant) for tenant in weights}

    async def one(tenant: str, index: int) -> None:
        outcome = await clients[tenant].score_group(group(tenant, "w", index))
        if outcome.result is None or not outcome.result.valid:
            raise RuntimeError(f"{tenant}: group {index} got no valid result ({outcome.failure})")
        finished[tenant].append(time.monotonic())

    try:
        await asyncio.gather(*(one(tenant, i) for i in range(groups_each) for tenant in weights))
    finally:
        for client in clients.values():
            await client.aclose()
    all_busy_until = min(max(times) for times in finished.values())  # the first tenant to run out of work
    counted = {tenant: sum(1 for t in times if t <= all_busy_until) for tenant, times in finished.items()}
    total, weight_sum = sum(counted.values()), sum(weights.values())
    return [{"tenant": tenant, "weight": weight, "groups_while_all_busy": counted[tenant],
             "share": counted[tenant] / total, "weighted_share": weight / weight_sum,
             "share_over_weighted_share": counted[tenant] / total / (weight / weight_sum)}
            for tenant, weight in weights.items()]


def warm_then_alone(url: str, groups: int, warm_groups: int) -> dict:
    """:func:`alone_case` after ``warm_groups`` groups that warm the path."""
    asyncio.run(alone_case(url, warm_groups))
    return asyncio.run(alone_case(url, groups))


async def alone_case(url: str, groups: int) -> dict:
    client = client_for(url, "solo")
    try:
        started = time.monotonic()
        outcomes = await asyncio.gather(*(client.score_group(group("solo", "alone", i)) for i in range(groups)))
        wall = time.monotonic() - started
    finally:
        await client.aclose()
    if not all(outcome.result is not None and outcome.result.valid for outcome in outcomes):
        raise RuntimeError("alone: a group got no valid result")
    return {"groups": groups, "wall_s": wall, "groups_per_s": groups / wall}


def flood_dataset(path: Path, rows: int) -> Path:
    """A test set for ``grrm score``: ``rows`` groups of 4 candidates."""
    with path.open("w") as out:
        for index in range(rows):
            candidates = [f"eval {index} candidate {k} [q={(index + k) % 10}]" for k in range(MEMBERS_PER_GROUP)]
            out.write(json.dumps({"source": f"Evaluation sentence {index}.", "candidates": candidates,
                                  "src_lang": "en", "trg_lang": "de"}) + "\n")
    return path


@contextlib.contextmanager
def grrm_score_flood(url: str, data: Path, output: Path, concurrency: int) -> Iterator[None]:
    """``grrm score`` over ``data`` as the low-priority tenant, running until the block ends."""
    grrm = shutil.which("grrm", path=str(Path(sys.executable).parent)) or "grrm"
    process = subprocess.Popen([grrm, "score", str(data), "-o", str(output), "--url", url, "--tenant", FLOOD_TENANT,
                                "--concurrency", str(concurrency), "--token-env", "GRRM_BENCH_NO_TOKEN"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8.0)  # the flood is under way before the training starts
        if process.poll() is not None:
            raise SystemExit(f"grrm score ended early (exit {process.returncode}): the flood never ran")
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def flood_share(url: str) -> float | None:
    """The flood tenant's share of the tokens the engines served in the last window (GET /v1/tenants)."""
    import httpx

    tenants = httpx.get(f"{url}/v1/tenants", timeout=30).json()["tenants"]
    return tenants.get(FLOOD_TENANT, {}).get("recent_share")


def not_valid_by_reason(measured: list[dict]) -> dict[str, int]:
    """The measured steps' rewards that were not valid, summed by the bridge's metric that counted them."""
    counts: dict[str, int] = {}
    for entry in measured:
        for key, value in entry["data"].items():
            if (key.startswith("grrm/default/") or key == "grrm/failed") and value:
                counts[key] = counts.get(key, 0) + int(value)
    return counts


def verl_beside_flood(steps: int, group_latency_s: float, slots: int, concurrency: int) -> list[dict]:
    """verl's sync trainer alone, then beside a ``grrm score`` flood (fair queue, then FIFO)."""
    from bench.verl_trainer import measured_steps, median, service_config
    from cpu_harness.loop import Harness

    workdir = Path(tempfile.mkdtemp(prefix="grrm-bench-fair-share-"))
    data = flood_dataset(workdir / "flood.jsonl", 20_000)

    def config(mode: str) -> Path:
        extra = {"http": {"tenants": [{"name": FLOOD_TENANT, "priority": -1}]},
                 "tenants": {"fair_share": mode != "fifo", "reserved_slots": 1 if mode == "fair+reserve_1" else 0}}
        return service_config(workdir / f"service-{mode}.yaml", group_latency_s, slots, extra)

    rows: list[dict] = []
    with Harness(workdir, prompts_per_batch=8, rollout_n=4, max_response_length=64, policy_stop_scale=3.0,
                 service_config=config("fair")) as harness:

        def train(run: str, scheduling: str) -> dict:
            report = harness.train(steps=steps, mode="sync")
            if report.returncode != 0:
                print(report.log_tail())
                raise SystemExit(f"verl {run} ({scheduling}): exited {report.returncode}")
            measured = measured_steps(report)
            return {"case": "verl", "run": run, "mode": scheduling, "steps": len(measured),
                    "reward_wait_s": median(measured, "grrm/exposed_reward_s"),
                    "reward_wait_s_each": [entry["data"].get("grrm/exposed_reward_s") for entry in measured],
                    "step_s": median(measured, "timing_s/step"),
                    "valid_rewards": f"{int(sum(e['data'].get('grrm/valid', 0) for e in measured))}/"
                                     f"{int(sum(e['data'].get('grrm/rewards', 0) for e in measured))}",
                    # Why a reward was not valid: the bridge's counts by reason (grrm/default/<reason>, grrm/failed).
                    "not_valid_by_reason": not_valid_by_reason(measured)}

        rows.append(train("alone", "fair"))
        for mode in ("fair", "fair+reserve_1", "fifo"):
            if mode != "fair":
                harness.redeploy(config(mode))
            with grrm_score_flood(harness.service_url, data, workdir / f"flood-{mode}", concurrency):
                row = train("beside_flood", mode)
                row["flood_recent_share"] = flood_share(harness.service_url)
            rows.append(row)
    alone = rows[0]
    for row in rows:
        row["wait_over_alone"] = row["reward_wait_s"] / alone["reward_wait_s"] if alone["reward_wait_s"] else None
        row["step_over_alone"] = row["step_s"] / alone["step_s"]
    return rows


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    verl = [row for row in rows if row["case"] == "verl"]
    figure, axes = plt.subplots(1, 3 if verl else 2, figsize=(13 if verl else 9, 3.4))
    left, right = axes[0], axes[1]
    floods = [row for row in rows if row["case"] in ("engine_bound", "http_bound")]
    short = {"engine_bound": "engine-bound", "http_bound": "HTTP-bound", "fair+flood_limit_8": "fair +\nlimit 8",
             "fair+flood_client_32": "fair +\nclient 32"}
    labels = [f"{short[row['case']]}\n{short.get(row['mode'], row['mode'])}" for row in floods]
    left.bar(range(len(floods)), [row["beside_over_alone"] for row in floods],
             color=["tab:grey" if row["mode"] == "fifo" else "tab:blue" for row in floods])
    left.axhline(1.5, color="tab:red", linestyle=":", label="target 1.5x")
    left.set_xticks(range(len(floods)), labels, fontsize=6)
    left.set_ylabel("small run's last reward:\nbeside a flood / alone")
    left.legend(fontsize=7)
    shares = [row for row in rows if row["case"] == "weights"]
    positions = range(len(shares))
    right.bar([p - 0.2 for p in positions], [row["share"] for row in shares], width=0.4, label="measured")
    right.bar([p + 0.2 for p in positions], [row["weighted_share"] for row in shares], width=0.4, label="weight",
              color="tab:orange")
    right.set_xticks(list(positions), [f"{row['tenant']} (w={row['weight']:g})" for row in shares], fontsize=7)
    right.set_ylabel("share of groups while all backlogged")
    right.legend(fontsize=7)
    if verl:
        axes[2].bar(range(len(verl)), [row["reward_wait_s"] for row in verl],
                    color=["tab:green" if row["run"] == "alone" else "tab:grey" if row["mode"] == "fifo" else "tab:blue"
                           for row in verl])
        axes[2].set_xticks(range(len(verl)), [f"{row['run']}\n{row['mode']}" for row in verl], fontsize=6)
        axes[2].set_ylabel("verl's reward wait per step, s\n(median, grrm/exposed_reward_s)")
    figure.suptitle("Fair share vs first come first served (simulated engine, real Serve + HTTP)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def kept_rows(cases: set[str]) -> list[dict]:
    """The last results' rows of the cases not run now (none when every case runs)."""
    path = results_dir() / "fair_share.json"
    if set(CASES) <= cases or not path.exists():
        return []
    row_case = {"engine_bound": "flood", "http_bound": "flood"}
    return [row for row in json.loads(path.read_text()) if row_case.get(row["case"], row["case"]) not in cases]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few groups per case, no verl run (CI: that it runs)")
    parser.add_argument("--no-verl", action="store_true", help="skip the verl trainer beside a grrm score flood")
    parser.add_argument("--cases", default=",".join(CASES),
                        help="which to run (the others' rows are kept from the last results): %(default)s")
    parser.add_argument("--verl-steps", type=int, default=5, help="training steps per verl run (the first is warm-up)")
    parser.add_argument("--verl-group-latency-s", type=float, default=0.3,
                        help="scripted seconds per group in the verl case (2 replicas, --verl-slots at once each)")
    parser.add_argument("--verl-slots", type=int, default=2)
    parser.add_argument("--flood-concurrency", type=int, default=32, help="grrm score --concurrency of the flood")
    args = parser.parse_args(argv)
    cases = {case.strip() for case in args.cases.split(",")}
    if cases - set(CASES):
        parser.error(f"--cases: unknown {sorted(cases - set(CASES))} (choose from {', '.join(CASES)})")
    if args.quick or args.no_verl:
        cases.discard("verl")
    # Quick proves that every mode runs and writes its rows, not that the fair queue wins (the full run
    # measures that; tests/test_fair_share.py tests the queue's order): a few groups per case, and the flood
    # case under the HTTP-bound load only (the engine-bound one is the same code under another load).
    engine_bound = Load(per_group_s=0.4, engine_slots=1, small_groups=6, flood_groups=120)
    http_bound = Load(per_group_s=0.1, engine_slots=2, small_groups=2 if args.quick else 12,
                      flood_groups=8 if args.quick else 300)
    weights_load = Load(per_group_s=0.1, engine_slots=1, small_groups=0, flood_groups=0, replicas=1)
    alone_load = Load(per_group_s=0.1, engine_slots=4, small_groups=0, flood_groups=0)
    weights = {"run-a": 1.0, "run-b": 1.0, "run-c": 2.0}
    alone_groups, warm_groups = (4, 1) if args.quick else (240, 8)

    from ray import serve

    rows: list[dict] = []
    alone: dict[str, list[dict]] = {"fifo": [], "fair": []}
    # Quick: the alone case runs on the HTTP-bound case's FIFO and fair applications before their floods, not
    # on two of its own (deploys are most of a quick run's time); the full run deploys its own, 3 rounds.
    alone_before_floods = args.quick and {"alone", "flood"} <= cases
    with local_serve() as base:
        url = f"{base}/{APP}"
        flood_loads = [("http_bound", http_bound)] if args.quick else [("engine_bound", engine_bound), ("http_bound", http_bound)]
        for case, load in flood_loads if "flood" in cases else ():
            modes = [("fifo", False, None, None), ("fair", True, None, None)]
            if case == "http_bound":  # where the HTTP path, not the engine, is the queue
                limited = ("fair+flood_limit_8", True, {"flood": 8}, None)
                client_32 = ("fair+flood_client_32", True, None, 32)
                # Quick: the client-held flood right after the fair one, on its application (the same one).
                modes += [client_32, limited] if args.quick else [limited, client_32]
            up = None  # the application running: (fair, limits)
            for mode, fair, limits, flood_concurrency in modes:
                if not (args.quick and up == (fair, limits)):
                    if up is not None:
                        serve.delete(APP)
                    deploy(serve, load, fair=fair, limits=limits)
                    up = fair, limits
                if alone_before_floods and case == "http_bound" and mode in alone:
                    alone[mode].append(warm_then_alone(url, alone_groups, warm_groups))
                row = asyncio.run(flood_case(url, load, f"{case}-{mode}", flood_concurrency,
                                             flood_lead_s=0.5 if args.quick else 3.0))
                rows.append({"case": case, "mode": mode, "small_groups": load.small_groups,
                             "flood_groups": load.flood_groups, "per_group_s": load.per_group_s,
                             "engine_slots": load.engine_slots, **row})
                print_table(rows[-1:], ["case", "mode", "small_alone_s", "small_beside_flood_s", "beside_over_alone",
                                        "flood_groups_per_s"])
            serve.delete(APP)
        if "weights" in cases:
            deploy(serve, weights_load, fair=True, weights=weights)
            for row in asyncio.run(weights_case(url, weights, 3 if args.quick else 60)):
                rows.append({"case": "weights", "mode": "fair", **row})
            serve.delete(APP)
        # Rounds alternate the modes: one run of a few seconds moves by more than the gate could cost.
        for _ in range(0 if "alone" not in cases or alone_before_floods else 1 if args.quick else 3):
            for mode, fair in (("fifo", False), ("fair", True)):
                deploy(serve, alone_load, fair=fair)
                alone[mode].append(warm_then_alone(url, alone_groups, warm_groups))
                serve.delete(APP)
        rates = {mode: statistics.median(run["groups_per_s"] for run in runs) for mode, runs in alone.items() if runs}
        for mode, runs in alone.items() if rates else ():
            rows.append({"case": "alone", "mode": mode, "groups": runs[0]["groups"], "rounds": len(runs),
                         "groups_per_s": rates[mode], "groups_per_s_each": [run["groups_per_s"] for run in runs],
                         "throughput_over_fifo": rates[mode] / rates["fifo"]})

    if "verl" in cases:
        rows += verl_beside_flood(args.verl_steps, args.verl_group_latency_s, args.verl_slots, args.flood_concurrency)

    rows = kept_rows(cases) + rows
    print()
    print_table([row for row in rows if row["case"] in ("engine_bound", "http_bound")],
                ["case", "mode", "small_groups", "flood_groups", "small_alone_s", "small_beside_flood_s",
                 "beside_over_alone", "flood_groups_per_s"])
    print_table([row for row in rows if row["case"] == "weights"],
                ["tenant", "weight", "groups_while_all_busy", "share", "weighted_share", "share_over_weighted_share"])
    print_table([row for row in rows if row["case"] == "alone"], ["mode", "groups", "rounds", "groups_per_s", "throughput_over_fifo"])
    print_table([row for row in rows if row["case"] == "verl"], VERL_COLUMNS)
    write_json("fair_share", rows, {"machine": machine(), "simulated": True, "quick": args.quick,
                                    "settings": {key: value for key, value in vars(args).items()}})
    plot(rows, plot_path("fair_share"))
    print(f"wrote {results_dir() / 'fair_share.json'} and {plot_path('fair_share')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
