"""Node chaos: the app on a multi-node Ray cluster on one machine, a node, the GCS or
the whole head lost while members stream through the product's client (``grrm_client.RewardClient``), half over
HTTP and half over the Serve handle.

The cluster is ``ray.cluster_utils.Cluster``: a head with 0 CPUs (the Serve controller and the
HTTP proxy, nothing else, as on KubeRay) and worker nodes of 2 CPUs; the app runs 3 scorer
replicas, 2 ingress and 2 ledger replicas (``num_cpus`` 0.1 each keeps them off the head), spread
over the workers by Serve. SIMULATED ENGINE: the replicas run the scripted engine (a fixed
latency per prompt), because what is measured is how Ray, Serve and the app survive a node, not
the model; engine faults on real vLLM are bench/chaos.py's.

Phases (each a row: members sent, valid, lost, groups duplicated or split, the time from the
fault until every member in flight then was answered, and until Serve ran every replica again):

1. ``baseline``: no fault;
2. ``ingress_kill``, ``ledger_kill``: one ingress or ledger replica's actor is killed;
3. ``scorer_node_kill``: a worker node that holds a scorer replica (and, if possible, no ingress or
   ledger replica) dies without grace: its raylet and every process on it;
4. ``ingress_ledger_node_kill``: a worker node that holds an ingress and a ledger replica (and a
   scorer) dies the same way;
5. with ``--redis``, on a second cluster with GCS fault tolerance on a local ``redis-server``:
   ``gcs_restart``: the GCS is killed 0.8 s into the stream of a fresh app (while at least one scorer
   replica has had no member yet), stays down 5 s (``--head-down-s``) and restarts on the same Redis;
   ``head_restart``: the whole head (GCS, Serve controller, head raylet and proxy) is killed without
   grace, stays down 5 s and a new head starts on the same Redis and GCS port (as KubeRay restarts
   the head pod). On that cluster the members stream from a detached actor on a worker node, over
   that node's own Serve proxy (each worker proxy binds a port of its own,
   ``RAY_SERVE_WORKER_PROXY_HTTP_PORT``) and the handle, so that the client outlives the head; the
   row counts the answers that arrived while the GCS or the head was down, and the scorer replicas
   that gave them. The client is made before the first phase, as a trainer's is.

A dead node is replaced by a fresh one (as KubeRay would start a new pod).

    .venv/bin/python -m bench.node_chaos                  # bench/results/node_chaos.json
    .venv/bin/python -m bench.node_chaos --redis --quick  # what tests/reliability/test_node_faults.py runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.chaos import answers_by_group, stream, tally
from bench.common import free_port, machine, print_table, write_json
from cluster.protocol.schema import MemberRequest

APP = "nodes"
WORKER_CPUS = 2
SCORERS = 3
# Faults that kill one replica's actor, not a node: the deployment whose replica dies.
REPLICA_FAULTS = {"ingress_kill": "GRRMIngress", "ledger_kill": "GRRMLedger"}
# Faults of the head (GCS fault tolerance on): the bench's driver and the client outlive them.
HEAD_FAULTS = ("gcs_restart", "head_restart")
# When a fault strikes, in seconds after its phase's first member is due; a third of the stream
# for those not named. The GCS dies while only the first two groups have been sent: a scorer
# replica that gets its first member while the GCS is down must serve it (the app is fresh).
FAULT_AT_S = {"gcs_restart": 0.8}
# A group whose members were all sent this long before the GCS (or the head) was back had time to be
# scored while it was down (a group takes well under it here, ledger write included, under load), or as
# long as the slowest group the outage did not hold took (:func:`outage_waits`).
OUTAGE_MARGIN_S = 3.0
# How much longer than the slowest group the outage did not hold a group may take before it reads as held.
UNHELD_FACTOR = 1.5
# How long the GCS or the head stays down (``--head-down-s``).
HEAD_DOWN_S = 5.0
HEAD_ARGS = {"num_cpus": 0, "include_dashboard": False}
# Worker nodes' Serve proxies bind a port of their own (Ray 2.60's knob for proxies that share a
# machine): node id -> port.
PROXY_PORT_ENV = "RAY_SERVE_WORKER_PROXY_HTTP_PORT"
WORKER_PROXY_PORTS: dict[str, int] = {}
COLUMNS = [
    "phase", "members_sent", "members_valid", "members_lost", "groups_duplicated", "split_groups",
    "in_flight_at_fault", "recovery_s", "replicas_back_s", "scorers_replaced", "answered_while_down",
    "scorers_answering_while_down", "groups_due_while_down", "groups_waiting_for_the_outage",
    "app_status_after", "victim_held", "max_latency_s", "wall_s",
]


# ------------------------------------------------------------------------------ the cluster


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway ``redis-server`` on a free loopback port (GCS fault tolerance's storage)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server: not installed (bash scripts/setup_env.sh installs it from the system's packages)")
    port = free_port()
    directory = tempfile.mkdtemp(prefix="grrm-redis-")
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", directory], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(port), "ping"],
                                   capture_output=True, text=True)
            if probe.stdout.strip() == "PONG":
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("redis-server did not answer within 20 s")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def start_cluster(workers: int, redis_address: str | None):
    """A head with 0 CPUs and ``workers`` worker nodes; the driver connected to it."""
    from ray.cluster_utils import Cluster

    if redis_address is not None:
        # Read by the head's GCS when it starts (and again when it restarts).
        os.environ["RAY_REDIS_ADDRESS"] = redis_address
        os.environ["RAY_external_storage_namespace"] = f"grrm-{os.getpid()}"
    cluster = Cluster(initialize_head=True, head_node_args=HEAD_ARGS)
    for _ in range(workers):
        add_worker(cluster)
    cluster.wait_for_nodes()
    connect(cluster)
    return cluster


def add_worker(cluster):
    """A worker node of ``WORKER_CPUS`` whose Serve proxy, if it gets one, binds a free port of its own."""
    port = free_port()
    node = cluster.add_node(num_cpus=WORKER_CPUS, env_vars={PROXY_PORT_ENV: str(port)})
    WORKER_PROXY_PORTS[node.node_id] = port
    return node


def connect(cluster) -> None:
    """Attach this process (the bench's driver) to the cluster's head."""
    import ray

    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)


def live_actors(prefix: str) -> dict[str, str]:
    """Name -> node id of the live actors whose name starts with ``prefix`` (read from the GCS)."""
    import ray

    return {actor["Name"]: actor["Address"]["NodeID"] for actor in ray._private.state.actors().values()
            if actor.get("State") == "ALIVE" and (actor.get("Name") or "").startswith(prefix)}


def actor_nodes(app: str) -> dict[str, tuple[str, str]]:
    """Serve replica id -> (deployment, node id) for the app's live replicas (read from the GCS)."""
    placed = {}
    for name, node_id in live_actors(f"SERVE_REPLICA::{app}#").items():
        _, deployment, replica = name.split("::", 1)[1].split("#")
        placed[replica] = (deployment, node_id)
    return placed


def choose_victim(cluster, app: str, fault: str) -> tuple[Any, dict[str, list[str]]]:
    """The worker node to kill for ``fault`` and what it holds (deployment -> replica ids)."""
    holdings: dict[str, dict[str, list[str]]] = {}
    for replica, (deployment, node_id) in actor_nodes(app).items():
        holdings.setdefault(node_id, {}).setdefault(deployment, []).append(replica)
    nodes = {node.node_id: node for node in cluster.worker_nodes}

    def held(node_id: str, deployment: str) -> int:
        return len(holdings.get(node_id, {}).get(deployment, []))

    if fault == "scorer_node_kill":
        wanted = sorted(nodes, key=lambda n: (-held(n, "GRRMReplica"), held(n, "GRRMIngress") + held(n, "GRRMLedger")))
    else:
        wanted = sorted(nodes, key=lambda n: (-(held(n, "GRRMIngress") > 0 and held(n, "GRRMLedger") > 0),
                                              -held(n, "GRRMIngress") - held(n, "GRRMLedger"), -held(n, "GRRMReplica")))
    victim = wanted[0]
    return nodes[victim], holdings.get(victim, {})


# ------------------------------------------------------------------------------ the load


class ClientSender:
    """Members through the product's client: RewardClient over HTTP, and over the handle."""

    def __init__(self, url: str, handle):
        from grrm_client import ClientConfig, HTTPTransport, RewardClient
        from grrm_handles.send import HandleSender

        retries = {"max_attempts": 12, "backoff_s": 0.5, "max_backoff_s": 4.0, "deadline_s": 300}
        http = ClientConfig(transport="http", http_url=url, app_name=APP, token_env=None, **retries)
        by_handle = ClientConfig(transport="handle", app_name=APP, **retries)
        self.clients = {"http": RewardClient(http, HTTPTransport(http)),
                        "handle": RewardClient(by_handle, HandleSender(handle, app=by_handle))}

    async def send(self, member: dict, transport: str) -> dict:
        record: dict[str, Any] = {"group_id": member["group_id"], "index": member["index"], "transport": transport,
                                  "sent_at": time.monotonic()}
        outcome = await self.clients[transport].score_member(MemberRequest(**member))
        result = outcome.result
        record.update(
            valid=bool(result is not None and result.valid),
            replica=None if result is None else result.replica,
            group_scores=None if result is None else result.group_scores,
            failure=outcome.failure or (None if result is None else result.failure),
            error=outcome.error,
            attempts=outcome.attempts,
            answered_at=time.monotonic(),
        )
        return record

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


class LocalStreams:
    """A phase's members streamed from this process, over the Serve proxy at ``url`` and ``handle``,
    by one client made up front (as a trainer's is, long before a fault)."""

    def __init__(self, url: str, handle):
        self.sender = ClientSender(url, handle)

    async def start(self, run: str, groups: int, interval_s: float, spread_s: float) -> tuple[float, Awaitable[list[dict]]]:
        """Start streaming a phase's members: when it began (``time.monotonic()``) and its answers to come."""
        return time.monotonic(), asyncio.ensure_future(stream(self.sender, run, groups, interval_s, spread_s))

    async def aclose(self) -> None:
        await self.sender.aclose()


class StreamRunner:
    """Streams a phase's members from a worker node: a detached actor there outlives the head and
    the bench's driver (which is attached to the head). Writes the answers to a file as JSON."""

    def __init__(self, url: str):
        from ray import serve

        self._streams = LocalStreams(url, serve.get_deployment_handle("GRRMReplica", app_name=APP))

    async def start(self, run: str, groups: int, interval_s: float, spread_s: float, path: str) -> float:
        """Start streaming a phase's members (answers to ``path``); when it began (``time.monotonic()``,
        one clock for every process of this machine)."""
        began, answers = await self._streams.start(run, groups, interval_s, spread_s)
        self._task = asyncio.ensure_future(self._write(answers, Path(path)))
        return began

    @staticmethod
    async def _write(answers, path: Path) -> None:
        try:
            payload = {"answers": await answers}
        except Exception as error:  # the orchestrator reports it; nothing to retry here
            payload = {"error": repr(error)}
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(payload, default=str))
        partial.replace(path)


class RemoteStreams:
    """A phase's members streamed by a :class:`StreamRunner` on a worker node with a Serve proxy,
    over that node's proxy and a handle made there (the head's faults, ``HEAD_FAULTS``)."""

    def __init__(self, timeout_s: float = 60):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        deadline = time.monotonic() + timeout_s
        while not (nodes := [n for n in live_actors("SERVE_PROXY_ACTOR").values() if n in WORKER_PROXY_PORTS]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker node ran a Serve proxy within {timeout_s} s")
            time.sleep(0.5)
        self.url = f"http://127.0.0.1:{WORKER_PROXY_PORTS[nodes[0]]}/{APP}"
        self.directory = Path(tempfile.mkdtemp(prefix="grrm-node-chaos-"))
        self.runner = ray.remote(num_cpus=0)(StreamRunner).options(
            name="node_chaos_stream_runner", namespace="grrm-node-chaos", lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[0], soft=False)).remote(self.url)
        # Running, its client made, before the first phase: a phase times its fault from its start,
        # and a client still being made then would wait out a GCS outage before sending anything.
        ray.get(self.runner.__ray_ready__.remote(), timeout=timeout_s)

    async def start(self, run: str, groups: int, interval_s: float, spread_s: float) -> tuple[float, Awaitable[list[dict]]]:
        """Start streaming a phase's members on the runner: when it began and its answers to come."""
        path = self.directory / f"{run}.json"
        began = await self.runner.start.remote(run, groups, interval_s, spread_s, str(path))
        return began, self._answers(run, path)

    @staticmethod
    async def _answers(run: str, path: Path, timeout_s: float = 600) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        # Only the file: this driver is detached from the cluster while the head is down.
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{run}: the stream runner wrote no answers within {timeout_s} s")
            await asyncio.sleep(0.2)
        payload = json.loads(path.read_text())
        if "error" in payload:
            raise RuntimeError(f"{run}: the stream runner failed: {payload['error']}")
        return payload["answers"]

    async def aclose(self) -> None:
        """Nothing to close here: the runner ends with the cluster."""


# ------------------------------------------------------------------------------ the faults


async def inject(cluster, fault: str, at_s: float, down_s: float) -> dict:
    """At ``at_s``, kill a worker node (:func:`phase` starts a fresh one after the stream), a
    replica's actor, or the GCS or the whole head for ``down_s``."""
    await asyncio.sleep(at_s)
    if fault == "gcs_restart":
        at = time.monotonic()
        await asyncio.to_thread(cluster.head_node.kill_gcs_server)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(cluster.head_node.start_gcs_server)
        return {"at": at, "back": time.monotonic(), "victim_held": "the GCS", "victim": None}
    if fault == "head_restart":
        import ray

        gcs_port = int(cluster.address.rsplit(":", 1)[1])
        ray.shutdown()  # this driver is attached to the head's raylet and would die with it
        at = time.monotonic()
        cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        cluster.head_node = None  # not remove_node: it would also clear the head's storage
        await asyncio.sleep(down_s)
        # A new head on the same Redis and GCS port, as KubeRay restarts the head pod; in the main
        # thread (Ray sets signal handlers). The workers' raylets reconnect to it.
        cluster.add_node(**HEAD_ARGS, gcs_server_port=gcs_port)
        back = time.monotonic()
        connect(cluster)
        return {"at": at, "back": back, "victim_held": "the head: GCS, Serve controller, raylet, proxy",
                "victim": None}
    if fault in REPLICA_FAULTS:
        import ray

        deployment = REPLICA_FAULTS[fault]
        replica = next(replica for replica, (name, _) in actor_nodes(APP).items() if name == deployment)
        at = time.monotonic()
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#{deployment}#{replica}", namespace="serve"), no_restart=True)
        return {"at": at, "victim_held": f"{deployment.removeprefix('GRRM')} x1 (the actor only)", "victim": None}
    node, held = await asyncio.to_thread(choose_victim, cluster, APP, fault)
    at = time.monotonic()
    await asyncio.to_thread(cluster.remove_node, node, False)
    scorers = held.get("GRRMReplica", [])
    summary = ", ".join(f"{deployment.removeprefix('GRRM')} x{len(ids)}" for deployment, ids in sorted(held.items()))
    return {"at": at, "victim_held": summary or "nothing", "victim": scorers[0] if scorers else None}


async def phase(cluster, streams, fault: str | None, groups: int, *, before: dict[str, dict] | None = None,
                interval_s: float = 0.25, spread_s: float = 1.0,
                down_s: float = HEAD_DOWN_S) -> tuple[dict, dict[str, dict]]:
    """Stream ``groups`` groups with ``streams``, inject ``fault`` a third of the way in (or at its
    ``FAULT_AT_S``), tally (see the docstring). ``before``: the replicas' counters as the previous
    phase on this cluster left them (nothing is scored between phases; read afresh when None).
    Returns the row and the counters after it."""
    run = fault or "baseline"
    if before is None:
        before = await asyncio.to_thread(replica_infos_outside, cluster.address)
    started = time.monotonic()
    began, answers_to_come = await streams.start(run, groups, interval_s, spread_s)
    if fault:
        at_s = began + FAULT_AT_S.get(fault, groups * interval_s / 3) - time.monotonic()
        injection = asyncio.ensure_future(inject(cluster, fault, max(0.0, at_s), down_s))
    else:
        injection = None
    answers = await answers_to_come
    injected = await injection if injection is not None else {}
    wall_s = time.monotonic() - started
    row: dict[str, Any] = {"phase": run}
    replicas_back_s = None
    if fault and fault not in HEAD_FAULTS and fault not in REPLICA_FAULTS:
        add_worker(cluster)  # the main thread only (Ray sets signal handlers)
    if fault:
        back_s = await wait_for_app(injected["victim"], cluster.head_node.node_id)
        replicas_back_s = None if back_s is None else time.monotonic() - injected["at"]
    # Read from a process of its own: after a node death this process's handles kept waiting on
    # calls routed to the dead node's replica before Ray declared it dead (Ray 2.60, one machine).
    after = await asyncio.to_thread(replica_infos_outside, cluster.address)
    row.update(tally(answers, before, after, injected.get("victim")))
    # A head restart with GCS fault tolerance keeps every scorer (no model reloads); a node death replaces its own.
    row["scorers_replaced"] = len(set(before) - set(after))
    if fault in HEAD_FAULTS:  # the controller runs again and still knows the app (its state is in Redis)
        from ray import serve

        status = serve.status().applications[APP].status
        row["app_status_after"] = getattr(status, "value", str(status))
    if fault:
        at = injected["at"]
        in_flight = [a for a in answers if a["sent_at"] < at < a["answered_at"]]
        row.update(in_flight_at_fault=len(in_flight),
                   recovery_s=max((a["answered_at"] - at for a in in_flight), default=0.0),
                   replicas_back_s=replicas_back_s, victim_held=injected["victim_held"])
    if "back" in injected:  # answers that arrived while the GCS or the head was down
        down = [a for a in answers if injected["at"] < a["answered_at"] < injected["back"]]
        row["answered_while_down"] = {transport: sum(a["transport"] == transport for a in down)
                                      for transport in ("http", "handle")}
        # A replica whose first call to a handle came during the outage froze until the GCS was back.
        row["scorers_answering_while_down"] = len({a["replica"] for a in down if a["valid"]})
        row.update(outage_waits(answers, injected["at"], injected["back"]))
    row.update(
        transports=sorted({a["transport"] for a in answers}),
        retried_members=sum(a["attempts"] > 1 for a in answers),
        max_latency_s=max(a["answered_at"] - a["sent_at"] for a in answers),
        wall_s=wall_s,
    )
    return row, after


def outage_waits(answers: list[dict], down_at: float, back_at: float, margin_s: float = OUTAGE_MARGIN_S) -> dict:
    """Whether any group waited for the GCS (or the head) to come back: ``groups_due_while_down``, the
    groups all of whose members were sent by the margin before it was back (so could be scored while it
    was down), and ``groups_waiting_for_the_outage``, those of them with no member answered before it was
    back (a frozen replica, router or proxy). Which scorer replicas own the groups of one short stream is
    the ring's chance, so "every scorer answered" is no test of "none froze"; this is.

    The margin (``outage_margin_s``) is ``margin_s`` or, where longer, :data:`UNHELD_FACTOR` times the time
    from the last member sent to the last answer of the slowest group answered whole while it was down: a
    group the outage did not hold. On a saturated 2-core CI machine every group took 6-8 s, those answered
    while the GCS was down too, and groups sent 6 s before it was back read as frozen by a 3 s margin; with
    the slowest unheld group's 7.0 s as the margin, 3 of 11 groups that took 7-10 s read as frozen, though
    every scorer answered while down. A frozen path answers no group while down, so it cannot lengthen the
    margin; the outage must outlast it (the test's is 20 s) for groups to be due at all."""
    # Per group: its last member sent, its first and its last answer.
    spans = [(max(m["sent_at"] for m in group), min(m["answered_at"] for m in group),
              max(m["answered_at"] for m in group)) for group in answers_by_group(answers).values()]
    unheld = [last - sent for sent, first, last in spans if down_at < first and last < back_at]
    margin_s = max([margin_s, *(UNHELD_FACTOR * took for took in unheld)])
    due = [(first, last) for sent, first, last in spans if sent <= back_at - margin_s and last > down_at]
    waited = [first for first, _ in due if first >= back_at]
    return {"groups_due_while_down": len(due), "groups_waiting_for_the_outage": len(waited),
            "outage_margin_s": margin_s}


async def wait_for_app(gone: str | None, head_node_id: str, timeout_s: float = 180) -> float | None:
    """Seconds until the Serve controller runs on the (current) head and the app runs 3 scorer
    replicas (none of them ``gone``), 2 ingress and 2 ledger replicas again, by the GCS's actor
    states (None: not within ``timeout_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        placed = actor_nodes(APP)
        deployments = [deployment for deployment, _ in placed.values()]
        # After a head restart the GCS reports the old controller alive until it notices the old head is gone.
        controller_node = live_actors("SERVE_CONTROLLER_ACTOR").get("SERVE_CONTROLLER_ACTOR")
        if (gone not in placed and controller_node == head_node_id
                and deployments.count("GRRMReplica") >= SCORERS
                and deployments.count("GRRMIngress") >= 2 and deployments.count("GRRMLedger") >= 2):
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    return None


_INFOS_SCRIPT = """
import asyncio, json, sys
import ray
from ray import serve
from bench.chaos import replica_infos
ray.init(address=sys.argv[1], namespace="serve", log_to_driver=False, configure_logging=False)
handle = serve.get_deployment_handle("GRRMReplica", app_name=sys.argv[2])
infos = asyncio.run(replica_infos(handle, sys.argv[2]))
print(json.dumps({name: {"groups_scored": info["groups_scored"]} for name, info in infos.items()}))
"""


def replica_infos_outside(address: str) -> dict[str, dict]:
    """Each live scorer replica's ``groups_scored``, asked by a fresh driver process."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", _INFOS_SCRIPT, address, APP], capture_output=True, text=True,
                          timeout=120, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"reading replica infos failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------ main


def app_config():
    """The app on the scripted engine: 3 scorers, 2 ingress and 2 ledger replicas, off the head."""
    from cluster.engines import EngineConfig, ScriptedEngineOptions
    from deployments.config import AppConfig, ReplicaSettings, ServiceSettings

    return AppConfig(
        engine=EngineConfig(kind="scripted", scripted=ScriptedEngineOptions(per_prompt_s=0.3, max_concurrent_prompts=4)),
        replicas=ReplicaSettings(num_replicas=SCORERS, num_cpus=1, gpus_per_rank=0),
        ingress=ServiceSettings(num_replicas=2, num_cpus=0.1),
        ledger=ServiceSettings(num_replicas=2, num_cpus=0.1),
        assembly_timeout_s=30,
    )


def run(groups: int, with_redis: bool, head_down_s: float = HEAD_DOWN_S) -> list[dict]:
    """The node phases on one fresh cluster, then (``with_redis``) the GCS and head phases on another
    with GCS fault tolerance, the GCS or the head down ``head_down_s``; the rows (answers dropped)."""
    rows = run_cluster([None, *REPLICA_FAULTS, "scorer_node_kill", "ingress_ledger_node_kill"], groups, redis_address=None)
    if with_redis:
        # A cluster of its own. With the app running, a worker node killed on a cluster with GCS
        # fault tolerance was once not declared dead within 5 minutes here (a bare cluster declared
        # one dead in 17 s; not understood), and there the members stream from a worker node that a
        # node kill could take: the node phases run without it.
        with redis_server() as redis_address:
            rows += run_cluster(list(HEAD_FAULTS), groups, redis_address=redis_address, down_s=head_down_s)
    return rows


def run_cluster(faults: list[str | None], groups: int, redis_address: str | None,
                down_s: float = HEAD_DOWN_S) -> list[dict]:
    """The app on a fresh cluster and the given phases in turn."""
    import ray
    from ray import serve

    from deployments.app import build_app

    cluster = start_cluster(workers=4, redis_address=redis_address)
    address = cluster.address
    try:
        port = free_port()
        # The head's faults need proxies on the worker nodes; the node faults go through the head's.
        location = "EveryNode" if redis_address else "HeadOnly"
        serve.start(http_options={"host": "127.0.0.1", "port": port, "location": location})
        serve.run(build_app(app_config()), name=APP, route_prefix=f"/{APP}")
        if redis_address:
            streams = RemoteStreams()
        else:
            streams = LocalStreams(f"http://127.0.0.1:{port}/{APP}", serve.get_deployment_handle("GRRMReplica", app_name=APP))
        return asyncio.run(run_phases(cluster, streams, faults, groups, down_s))
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
            os.environ.pop("RAY_REDIS_ADDRESS", None)
            WORKER_PROXY_PORTS.clear()
            forget_cluster(address)


def forget_cluster(address: str) -> None:
    """Remove Ray's pointer to the latest local head if it is this (now stopped) cluster's: a later
    ``serve run`` or ``ray.init()`` would otherwise wait minutes for it."""
    current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if current.read_text().strip() == address:
            current.unlink()
    except FileNotFoundError:
        pass


async def run_phases(cluster, streams, faults: list[str | None], groups: int, down_s: float) -> list[dict]:
    rows = []
    counters = None  # each phase starts from the counters the one before it read (a driver process each)
    try:
        for fault in faults:
            row, counters = await phase(cluster, streams, fault, groups, before=counters, down_s=down_s)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        await streams.aclose()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=60, help="groups of 4 streamed per phase")
    parser.add_argument("--quick", action="store_true", help="24 groups per phase (CI)")
    parser.add_argument("--redis", action="store_true", help="GCS fault tolerance on a local redis-server, and the GCS row")
    parser.add_argument("--head-down-s", type=float, default=HEAD_DOWN_S,
                        help="seconds the GCS or the head stays down (the --redis phases)")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups = 24
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # one machine, many nodes: no token to pass around
    rows = run(args.groups, args.redis, args.head_down_s)
    print_table(rows, COLUMNS)
    write_json("node_chaos", {"phases": rows, "simulated": "scripted engine"},
               {"machine": machine(), **{key: str(value) for key, value in vars(args).items()}})
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2))
    bad = sum(row["members_lost"] + row["groups_duplicated"] + row["split_groups"] for row in rows)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
