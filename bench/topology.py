"""The production topology, rehearsed on one machine: no reward replica ever takes a policy GPU.

One Ray cluster (``ray.cluster_utils.Cluster``) shaped as the rendered RayService declares it
(``k8s/render``, rendered with ``RenderOptions(replicas_per_worker=8)``, so the reward pod is one
8-GPU node): a head, and per worker group (``grrm-gpus``, ``grrm-services``, ``policy-gpus``) as many
nodes as the group may hold, each started with the group's ``rayStartParams`` (``num-cpus``,
``num-gpus``, ``resources``) as the renderer writes them, read from the render at run time. Ray takes
declared GPUs and custom resources without real ones. On it, the rendered application
(``serveConfigV2``, deployed as KubeRay deploys it: Serve's declarative API, with its
application-level autoscaling policy) with ONLY the engine swapped for the scripted one
(SIMULATED ENGINE: each replica still asks Ray for its GPU, ``replicas.gpus_per_rank`` 1). Every other
setting is the rendered one, the autoscaling policy's delays included. Not rehearsed here: what Kubernetes
decides (pod affinity, tolerations, node selectors), Ray's autoscaler (each group runs at its most nodes
from the start, the worst case for a replica looking for a free GPU) and GCS fault tolerance
(``bench/node_chaos.py``).

Phases, with a placement record of every replica (node group, node, GPU ids) at each, and a sampler
that checks the same rules every half second throughout:

1. ``pool_at_min``: the application deployed, its scorer pool at ``min_replicas``;
2. ``pool_at_max``: groups through the product's client (``RewardClient``, the Serve handle, as verl's
   reward workers send them) keep the engines' queued work above what ``max_replicas`` drain within
   ``target_backlog_s``: the project's policy asks for ``max_replicas``;
3. ``trainer_placed``: verl's TaskRunner (a bare ``@ray.remote`` actor, as ``main_ppo`` makes it) builds
   verl's own ``ResourcePoolManager`` for the rendered job's ``trainer.n_gpus_per_node`` x
   ``trainer.nnodes`` and asks for its placement groups (``RayResourcePool.get_placement_groups``:
   bundles ``{"CPU": max_colocate_count (3), "GPU": 1}``, ``STRICT_PACK``, one group per node): it must be
   CREATED, on the policy node;
4. ``pool_scaled_down``: the load stops, the pool drops back to ``min_replicas``;
5. ``pool_scaled_up_again``: the load again, the pool at ``max_replicas`` while the trainer's placement
   group holds the policy node.

The rules: every scorer replica on a reward (``grrm-gpus``) node, never on the policy node, the head or a
services node; the ingress and the ledger on ``grrm-services`` nodes only; nothing on the head but Serve's
controller and proxy; the trainer's TaskRunner and placement group on the policy node; no GPU id held by
two scorer replicas of one node.

``old_placement`` (the full form, or ``--old-placement``): the same cluster, the application with
``replicas.resources`` emptied (the replicas ask Ray only for CPUs and a GPU, as before issue 58), scaled
to ``max_replicas``, then verl's placement group asked for: where the replicas landed and whether the
group could form within ``OLD_PLACEMENT_PG_WAIT_S`` (it waits forever in verl). Its findings are the
defect the rehearsal exists to find, not failures of this run.

    .venv/bin/python -m bench.topology           # bench/results/topology.json (+ the old placement)
    .venv/bin/python -m bench.topology --quick   # what tests/rehearsal/test_topology.py runs
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common import free_port, machine, print_table, write_json
from bench.node_chaos import PROXY_PORT_ENV, forget_cluster

# The scripted engine: a GPU-like second per group, one group at a time, so a backlog builds as on a
# busy GPU; a cold start of half a second (the rehearsal is about where replicas land, not how fast).
SCRIPTED_ENGINE = {"per_prompt_s": 1.0, "max_concurrent_prompts": 1, "start_s": 0.5}
# Groups kept in flight while the pool must be at its maximum: more queued engine seconds than
# max_replicas x target_backlog_s, so the policy keeps asking for max_replicas.
BACKLOG_MARGIN = 1.25
SAMPLE_PERIOD_S = 0.5
# Longest waits (the rehearsal fails past them, naming what it waited for).
DEPLOY_TIMEOUT_S = 300
SCALE_TIMEOUT_S = 400
PG_TIMEOUT_S = 120
# How long the old placement's verl placement group is given before it counts as unable to form.
OLD_PLACEMENT_PG_WAIT_S = 20
TASK_RUNNER = "verl_task_runner"
# The name verl's ResourcePoolManager gives its pool (main_ppo's global_pool_id); its placement groups'
# names start with it.
VERL_POOL = "global_pool"
# Serve's own actors, which run on the head (KubeRay's head pod).
SERVE_HEAD_ACTORS = ("SERVE_CONTROLLER_ACTOR", "SERVE_PROXY_ACTOR")
MAX_NODES = 6  # a raylet each; more would not fit beside the replicas on 2 cores
COLUMNS = ["run", "phase", "t_s", "kind", "name", "node_group", "node", "gpus", "state", "strategy", "bundles", "broken"]
SUMMARY_COLUMNS = ["run", "phase", "t_s", "scorers", "scorers_on", "ingress_on", "ledger_on", "trainer_pg",
                   "task_runner_on", "violations"]


# ------------------------------------------------------------------------------ the render


@dataclass(frozen=True)
class NodeGroup:
    """One node group of the rendered RayCluster: what each of its nodes declares to Ray."""

    name: str
    role: str  # head, reward, services, policy
    nodes: int
    num_cpus: float
    num_gpus: float
    resources: dict[str, float]
    params: dict[str, str]  # its rayStartParams, as rendered


@dataclass(frozen=True)
class Rendered:
    """What the rehearsal takes from a render: the cluster's shape, the Serve config, verl's job size."""

    groups: list[NodeGroup]
    serve_config: dict[str, Any]
    app_name: str
    trainer_gpus_per_node: int
    trainer_nodes: int

    def group(self, role: str) -> NodeGroup:
        return next(group for group in self.groups if group.role == role)

    def application(self) -> dict[str, Any]:
        return next(app for app in self.serve_config["applications"] if app["name"] == self.app_name)


def node_group(spec: dict[str, Any], name: str, nodes: int) -> NodeGroup:
    """A rendered group spec (head or worker) as the Ray node it starts, its ``rayStartParams`` read as the
    renderer's own placement check reads them (``k8s.render.placement.node_shape``)."""
    from k8s.render.placement import HEAD, POLICY_GROUP, REWARD_GROUP, SERVICES_GROUP, node_shape

    roles = {HEAD: "head", REWARD_GROUP: "reward", SERVICES_GROUP: "services", POLICY_GROUP: "policy"}
    params = {key: str(value) for key, value in spec.get("rayStartParams", {}).items()}
    shape = node_shape(name, params)
    return NodeGroup(name=name, role=roles[name], nodes=nodes, num_cpus=shape.num_cpus, num_gpus=shape.num_gpus,
                     resources=dict(shape.resources), params=params)


def render_topology(replicas_per_worker: int = 8) -> Rendered:
    """The RayService ``k8s/render`` writes for ``RenderOptions(replicas_per_worker=...)`` (checked as a render
    is), read as the cluster it declares: each group at the most nodes it may hold (a node the autoscaler may
    add is a node a replica may land on)."""
    import shlex

    import yaml

    from k8s.render.app import APP_NAME
    from k8s.render.manifests import render
    from k8s.render.options import RenderOptions
    from k8s.render.placement import HEAD

    options = RenderOptions(replicas_per_worker=replicas_per_worker)
    manifests = render(options)  # refuses a render whose demands could land on the wrong group
    service = yaml.safe_load(manifests["rayservice-grrm.yaml"])
    cluster = service["spec"]["rayClusterConfig"]
    groups = [node_group(cluster["headGroupSpec"], HEAD, 1)]
    for spec in cluster["workerGroupSpecs"]:
        groups.append(node_group(spec, spec["groupName"], int(spec.get("maxReplicas", spec.get("replicas", 1)))))
    if sum(group.nodes for group in groups) > MAX_NODES:
        raise ValueError(f"the render declares {sum(group.nodes for group in groups)} nodes; this rehearsal "
                         f"starts at most {MAX_NODES} on one machine")
    # verl's size: the RayJob's entrypoint (main_ppo's Hydra overrides).
    job = next(doc for doc in yaml.safe_load_all(manifests["verl-job.yaml"]) if doc)
    overrides = dict(item.split("=", 1) for item in shlex.split(job["spec"]["entrypoint"]) if "=" in item)
    # KubeRay hands Serve the embedded config as YAML text: read it back from there.
    return Rendered(groups=groups, serve_config=yaml.safe_load(service["spec"]["serveConfigV2"]), app_name=APP_NAME,
                    trainer_gpus_per_node=int(overrides["trainer.n_gpus_per_node"]),
                    trainer_nodes=int(overrides["trainer.nnodes"]))


def rehearsal_application(rendered: Rendered, old_placement: bool = False) -> dict[str, Any]:
    """The rendered application with only the engine swapped for the scripted one; ``old_placement``: its
    replicas also ask for no custom resource (``replicas.resources`` emptied), as before issue 58."""
    application = copy.deepcopy(rendered.application())
    args = application["args"]
    args["engine"] = {"kind": "scripted", "scripted": dict(SCRIPTED_ENGINE)}
    if old_placement:
        args["replicas"]["resources"] = {}
    return application


# ------------------------------------------------------------------------------ the cluster


@dataclass
class Topology:
    """The running cluster and the group of each of its nodes (by node id)."""

    cluster: Any
    node_groups: dict[str, NodeGroup] = field(default_factory=dict)

    def group_of(self, node_id: str) -> NodeGroup | None:
        return self.node_groups.get(node_id)


def start_cluster(rendered: Rendered) -> Topology:
    """A head and every worker node of the render, each declaring its group's resources; this process
    connected as the driver."""
    import ray
    from ray.cluster_utils import Cluster

    head = rendered.group("head")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head.num_cpus, "num_gpus": head.num_gpus, "resources": head.resources,
        "include_dashboard": False})
    topology = Topology(cluster, {cluster.head_node.node_id: head})
    for group in rendered.groups:
        if group.role == "head":
            continue
        for _ in range(group.nodes):
            # Each worker's Serve proxy, if it gets one, binds a port of its own (one machine).
            node = cluster.add_node(num_cpus=group.num_cpus, num_gpus=group.num_gpus, resources=group.resources,
                                    env_vars={PROXY_PORT_ENV: str(free_port())})
            topology.node_groups[node.node_id] = group
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return topology


def deploy(rendered: Rendered, application: dict[str, Any], port: int) -> None:
    """The rendered serveConfigV2 with ``application`` in place of the reward app, through Serve's declarative
    API (what KubeRay calls), HTTP on 127.0.0.1:``port``; waits until the app runs."""
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    config = copy.deepcopy(rendered.serve_config)
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    config["applications"] = [application if app["name"] == rendered.app_name else app
                              for app in config["applications"]]
    serve.start(proxy_location=config.get("proxy_location"), http_options=config["http_options"])
    serve.context._get_global_client().deploy_apps(ServeDeploySchema(**config))
    wait_for(lambda: app_status(rendered.app_name) == "RUNNING", DEPLOY_TIMEOUT_S, "the application to run",
             failed=lambda: app_status(rendered.app_name) == "DEPLOY_FAILED")


def app_status(app: str) -> str:
    from ray import serve

    status = serve.status().applications.get(app)
    return "NOT_STARTED" if status is None else str(getattr(status.status, "value", status.status))


def replica_states(app: str, deployment: str) -> dict[str, int]:
    """A deployment's replicas by state (RUNNING, STARTING, STOPPING, ...)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None or deployment not in status.deployments:
        return {}
    states = status.deployments[deployment].replica_states
    return {str(getattr(state, "value", state)): count for state, count in states.items()}


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str,
             failed: Callable[[], bool] | None = None) -> float:
    """Seconds until ``condition()`` holds (polled); raises naming ``what`` past ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if failed is not None and failed():
            raise RuntimeError(f"waiting for {what}: it failed")
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"waiting for {what}: not within {timeout_s:.0f} s")
        time.sleep(SAMPLE_PERIOD_S)
    return time.monotonic() - started


# ------------------------------------------------------------------------------ where things run


def _visible_devices(_actor: Any) -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


@dataclass
class Sampler:
    """Samples where every actor and placement group runs, checks the rules at each sample, and keeps
    the placement record (a snapshot at each phase) and each replica's lifetime."""

    topology: Topology
    app: str
    deployments: dict[str, str]  # deployment name -> kind (scorer, ingress, ledger)
    started: float = field(default_factory=time.monotonic)
    run: str = "rendered"
    phase: str = "starting"
    rows: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    lifetimes: dict[str, dict[str, Any]] = field(default_factory=dict)
    broken: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # see _note
    samples: int = 0
    _gpus: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def where(self, node_id: str) -> dict[str, str]:
        """A node's short id, group and role (``unknown``: not a node of this cluster)."""
        group = self.topology.group_of(node_id)
        return {"node": node_id[:8], "node_group": group.name if group else "unknown",
                "role": group.role if group else "unknown"}

    def snapshot(self) -> list[dict[str, Any]]:
        """Where each live app replica, the trainer's TaskRunner and placement groups, and any other actor on
        the head run now (rows without run/phase)."""
        import ray
        from ray.util import placement_group_table

        t_s = round(time.monotonic() - self.started, 2)
        rows = []
        for actor in ray._private.state.actors().values():
            if actor.get("State") != "ALIVE":
                continue
            name = actor.get("Name") or ""
            row = {"t_s": t_s, **self.where(actor["Address"]["NodeID"]), "state": "ALIVE", "gpus": []}
            if name.startswith(f"SERVE_REPLICA::{self.app}#"):
                _, deployment, replica = name.split("::", 1)[1].split("#")
                kind = self.deployments.get(deployment, deployment)
                if kind == "scorer":
                    row["gpus"] = self._gpu_ids(name, actor["ActorID"])
                rows.append({**row, "kind": kind, "name": f"{deployment}#{replica}"})
            elif name == TASK_RUNNER:
                rows.append({**row, "kind": "task_runner", "name": name})
            elif row["role"] == "head" and not name.startswith(SERVE_HEAD_ACTORS):
                rows.append({**row, "kind": "other_on_head", "name": name or actor["ActorClassName"]})
        for pg in placement_group_table().values():
            if pg["state"] == "REMOVED" or not (pg.get("name") or "").startswith(VERL_POOL):
                continue
            # One row per placement group: the nodes its bundles hold (none while PENDING).
            places = [self.where(node) for node in sorted({node for node in pg["bundles_to_node_id"].values() if node})]
            rows.append({"t_s": t_s, "kind": "trainer_pg", "name": pg["name"], "state": pg["state"],
                         **{key: ",".join(sorted({place[key] for place in places})) for key in ("node", "node_group",
                                                                                               "role")},
                         "gpus": sum(bundle.get("GPU", 0) for bundle in pg["bundles"].values()),
                         "strategy": pg["strategy"], "bundles": list(pg["bundles"].values())})
        return rows

    def _gpu_ids(self, name: str, actor_id: str) -> list[int] | None:
        """The GPU ids Ray gave a scorer replica (its CUDA_VISIBLE_DEVICES), asked once it answers."""
        if actor_id not in self._gpus:
            import ray

            try:
                handle = ray.get_actor(name, namespace="serve")
                visible = ray.get(handle.__ray_call__.remote(_visible_devices), timeout=5)
            except Exception:  # noqa: BLE001 - still starting, or gone: asked again at the next sample
                return None
            self._gpus[actor_id] = [int(index) for index in (visible or "").split(",") if index.strip()]
        return self._gpus[actor_id]

    def sample(self) -> list[dict[str, Any]]:
        """One sample, each row judged (its ``broken``: the rule it breaks, or None); the replicas' lifetimes
        extended, the broken rules kept."""
        rows = judge(self.snapshot())
        with self._lock:
            self.samples += 1
            for row in rows:
                key = f"{self.run}:{row['kind']}:{row['name']}"
                life = self.lifetimes.setdefault(key, {
                    "run": self.run, "kind": row["kind"], "name": row["name"], "node_group": row["node_group"],
                    "node": row["node"], "first_phase": self.phase, "first_t_s": row["t_s"]})
                life.update(last_phase=self.phase, last_t_s=row["t_s"], gpus=row["gpus"], state=row["state"])
                if row["broken"]:
                    self._note(self.phase, row["t_s"], row["broken"])
        return rows

    def _note(self, phase: str, t_s: float, what: str) -> None:
        """A broken rule: one entry per run and rule, with when it was first and last seen, and how often."""
        key = (self.run, what)
        seen = self.broken.setdefault(key, {"run": self.run, "what": what, "first_phase": phase, "first_t_s": t_s,
                                            "samples": 0})
        seen.update(last_phase=phase, last_t_s=t_s, samples=seen["samples"] + 1)

    @property
    def violations(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.broken.values())

    def begin(self, run: str) -> None:
        """Samples from now on belong to ``run``, starting (before its first phase)."""
        with self._lock:
            self.run, self.phase = run, "starting"

    def flag(self, phase: str, what: str) -> None:
        """A broken rule found outside a sample (verl's placement group that never formed)."""
        with self._lock:
            self._note(phase, round(time.monotonic() - self.started, 2), what)

    def record(self, phase: str) -> dict[str, Any]:
        """The placement record of ``phase``: every row of a sample, and its summary."""
        self.phase = phase
        rows = [{"run": self.run, "phase": phase, **{key: row.get(key) for key in COLUMNS[2:]}}
                for row in self.sample()]
        summary = summarize(rows)
        with self._lock:
            self.rows += rows
            self.summaries.append(summary)
        print(json.dumps(summary), flush=True)
        return summary

    def start(self) -> None:
        threading.Thread(target=self._loop, name="topology-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_PERIOD_S):
            try:
                self.sample()
            except Exception as error:  # noqa: BLE001 - a GCS read that failed: the next sample reads again
                print(f"sample failed: {type(error).__name__}: {error}", flush=True)


def judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (one sample), each with ``broken``: the rule it breaks (see the module docstring), or None."""
    held: dict[tuple[str, int], str] = {}
    for row in rows:
        broken = None
        role = row["role"]
        if row["kind"] == "scorer":
            if role != "reward":
                broken = "a scorer replica off the reward nodes"
            for gpu in row["gpus"] or []:
                other = held.setdefault((row["node"], gpu), row["name"])
                if other != row["name"]:
                    broken = f"GPU {gpu} held by {other} too"
        elif row["kind"] in ("ingress", "ledger") and role != "services":
            broken = "off the services nodes"
        elif row["kind"] == "task_runner" and role != "policy":
            broken = "verl's TaskRunner off the policy node"
        elif row["kind"] == "trainer_pg" and row["state"] == "CREATED" and role != "policy":
            broken = "verl's placement group off the policy node"
        elif row["kind"] == "other_on_head":
            broken = "an actor on the head"
        row["broken"] = None if broken is None else f"{row['kind']} {row['name']} on {row['node_group']}: {broken}"
    return rows


def _where(rows: list[dict[str, Any]], kind: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        if row["kind"] == kind:
            counts[row["node_group"]] = counts.get(row["node_group"], 0) + 1
    return counts


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's placement record (rows of one run and phase) in a row: how many of each kind on each node
    group, the trainer's placement group, the rules broken."""
    pg = next((row for row in rows if row["kind"] == "trainer_pg"), None)
    return {"run": rows[0]["run"], "phase": rows[0]["phase"], "t_s": rows[0]["t_s"],
            "scorers": sum(row["kind"] == "scorer" for row in rows), "scorers_on": _where(rows, "scorer"),
            "ingress_on": _where(rows, "ingress"), "ledger_on": _where(rows, "ledger"),
            "trainer_pg": None if pg is None else f"{pg['state']} on {pg['node_group'] or '-'}",
            "task_runner_on": _where(rows, "task_runner") or None,
            "violations": sum(bool(row["broken"]) for row in rows),
            "broken": [row["broken"] for row in rows if row["broken"]]}


# ------------------------------------------------------------------------------ the load and the trainer


class Load:
    """Groups through the product's client (``RewardClient`` over the Serve handle), ``in_flight`` at a time
    until stopped, each as verl's reward workers send it: its members one by one (``score_member``), at once."""

    def __init__(self, app: str, deployment: str, in_flight: int, group_size: int = 4):
        from grrm_client import ClientConfig, RewardClient
        from grrm_handles.send import HandleSender

        config = ClientConfig(transport="handle", app_name=app, replica_deployment=deployment, deadline_s=600)
        self.client = RewardClient(config, HandleSender(app=config))
        self.in_flight = in_flight
        self.group_size = group_size
        self.groups = self.valid = 0
        self.by_replica: dict[str, dict[str, int]] = {}  # label -> replica -> groups it scored
        self._stopping = False
        self._tasks: list[asyncio.Future] = []

    def start(self, label: str) -> None:
        self._stopping = False
        self._tasks = [asyncio.ensure_future(self._worker(label, worker)) for worker in range(self.in_flight)]

    async def _worker(self, label: str, worker: int) -> None:
        from cluster.protocol.schema import MemberRequest

        sent = 0
        scored = self.by_replica.setdefault(label, {})
        while not self._stopping:
            group_id = f"{label}-{worker}-{sent}"
            outcomes = await asyncio.gather(*(self.client.score_member(MemberRequest(
                group_id=group_id, group_size=self.group_size, index=index, source=f"source {group_id}",
                # German, as trg_lang says: grrm.yaml's recipe gates a candidate in another language.
                candidate=f"Kandidat {index} der Gruppe {group_id}: die Katze schläft auf dem Dach.",
                src_lang="en", trg_lang="de"))
                for index in range(self.group_size)))
            sent += 1
            self.groups += 1
            results = [outcome.result for outcome in outcomes]
            if all(result is not None and result.valid for result in results):
                self.valid += 1
                scored[results[0].replica] = scored.get(results[0].replica, 0) + 1

    async def stop(self) -> None:
        """Stop sending; returns once every group in flight was answered."""
        self._stopping = True
        await asyncio.gather(*self._tasks)

    async def cancel(self) -> None:
        """Stop at once: the groups in flight are dropped (the run is over)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def summary(self) -> dict[str, Any]:
        return {"groups_answered": self.groups, "valid": self.valid, "by_replica": self.by_replica}

    async def aclose(self) -> None:
        await self.client.aclose()


class TaskRunner:
    """verl's TaskRunner's part in placement: it builds verl's ``ResourcePoolManager`` for the job's GPUs and
    asks verl's ``RayResourcePool`` for its placement groups, as ``main_ppo`` does before any worker starts
    (verl 0.9.1: bundles ``{"CPU": max_colocate_count, "GPU": 1}``, ``STRICT_PACK``, one group per node;
    ``get_placement_groups`` waits until they are ready)."""

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def place(self, gpus_per_node: int, nodes: int) -> dict[str, Any]:
        from verl.single_controller.ray import ResourcePoolManager

        manager = ResourcePoolManager(resource_pool_spec={VERL_POOL: [gpus_per_node] * nodes}, mapping={})
        manager.create_resource_pool()  # verl's own check that the cluster has the GPUs free
        pool = manager.resource_pool_dict[VERL_POOL]
        groups = pool.get_placement_groups()
        return {"placement_groups": [group.id.hex() for group in groups], "max_colocate_count": pool.max_colocate_count}


def start_trainer(rendered: Rendered):
    """verl's TaskRunner (a bare ``@ray.remote`` actor, as main_ppo makes it: one CPU to schedule) asking for
    its placement groups; returns the actor and the call's reference."""
    import ray

    runner = ray.remote(TaskRunner).options(name=TASK_RUNNER).remote()
    ray.get(runner.node.remote(), timeout=PG_TIMEOUT_S)  # running, verl not yet imported
    return runner, runner.place.remote(rendered.trainer_gpus_per_node, rendered.trainer_nodes)


def stop_trainer(runner) -> None:
    """End the TaskRunner and remove verl's placement groups (verl's job would at its end)."""
    import ray
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    ray.kill(runner)
    for pg_id, pg in placement_group_table().items():
        if pg["state"] != "REMOVED" and (pg.get("name") or "").startswith(VERL_POOL):
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))


def trainer_pg_state() -> str | None:
    from ray.util import placement_group_table

    states = [pg["state"] for pg in placement_group_table().values()
              if pg["state"] != "REMOVED" and (pg.get("name") or "").startswith(VERL_POOL)]
    return states[0] if states else None


async def place_trainer(sampler: Sampler, rendered: Rendered, phase: str, wait_s: float) -> tuple[Any, dict]:
    """verl's TaskRunner asks for its placement groups; the phase is recorded once they are CREATED, or after
    ``wait_s`` (verl itself would wait forever). Returns the TaskRunner and what happened."""
    runner, placed = await asyncio.to_thread(start_trainer, rendered)
    started = time.monotonic()
    try:
        await asyncio.to_thread(wait_for, lambda: trainer_pg_state() == "CREATED", wait_s, "verl's placement group")
        formed_s: float | None = time.monotonic() - started
    except TimeoutError:
        formed_s = None
    summary = sampler.record(phase)
    outcome = {"formed_s": formed_s, "waited_up_to_s": wait_s, "trainer_pg": summary["trainer_pg"],
               "task_runner_on": summary["task_runner_on"]}
    if formed_s is not None:
        import ray

        outcome["verl"] = await asyncio.to_thread(ray.get, placed, timeout=PG_TIMEOUT_S)
    return runner, outcome


# ------------------------------------------------------------------------------ the phases


def backlog_groups(application: dict[str, Any]) -> int:
    """Groups to keep in flight so that the engines' queued work asks for ``max_replicas`` (its seconds
    above ``max_replicas x target_backlog_s``, each group ``per_prompt_s`` of one engine)."""
    scaling = application["args"]["replicas"]["autoscaling"]
    needed_s = scaling["max_replicas"] * scaling["target_backlog_s"] * BACKLOG_MARGIN
    return int(needed_s / SCRIPTED_ENGINE["per_prompt_s"]) + scaling["max_replicas"]


async def scale_to(app: str, deployment: str, replicas: int, what: str) -> float:
    """Seconds until exactly ``replicas`` scorer replicas run and none starts or stops."""
    def settled() -> bool:
        states = replica_states(app, deployment)
        return states.get("RUNNING", 0) == replicas and sum(states.values()) == replicas

    return await asyncio.to_thread(wait_for, settled, SCALE_TIMEOUT_S, what)


@dataclass
class Deployed:
    """The application deployed for one run, and its load."""

    app: str
    scorer: str
    min_replicas: int
    max_replicas: int
    load: Load

    @classmethod
    async def start(cls, rendered: Rendered, application: dict[str, Any], port: int) -> tuple[Deployed, float]:
        """Deploy ``application`` and wait until its pool is at ``min_replicas``; returns it and the seconds taken."""
        from deployments.config import AppConfig

        config = AppConfig.model_validate(application["args"])
        scaling = config.replicas.autoscaling
        started = time.monotonic()
        await asyncio.to_thread(deploy, rendered, application, port)
        deployed = cls(rendered.app_name, config.replica_deployment_name, scaling.min_replicas, scaling.max_replicas,
                       Load(rendered.app_name, config.replica_deployment_name, backlog_groups(application)))
        await scale_to(deployed.app, deployed.scorer, deployed.min_replicas, "the pool at min_replicas")
        return deployed, time.monotonic() - started

    async def scale_up(self, label: str) -> float:
        """Load on until the pool runs ``max_replicas``; the seconds it took."""
        self.load.start(label)
        return await scale_to(self.app, self.scorer, self.max_replicas, f"the pool at max_replicas ({label})")

    async def scale_down(self) -> tuple[float, float]:
        """Load off (every group in flight answered), then the pool back at ``min_replicas``: the seconds of each."""
        started = time.monotonic()
        await self.load.stop()
        drained = time.monotonic() - started
        return drained, await scale_to(self.app, self.scorer, self.min_replicas, "the pool back at min_replicas")


async def rehearse(topology: Topology, rendered: Rendered, old_placement: bool) -> dict[str, Any]:
    """Every phase on the running cluster (see the module docstring); the sampler (placement record,
    lifetimes, violations), the timings and the findings."""
    from deployments.config import AppConfig

    config = AppConfig.model_validate(rehearsal_application(rendered)["args"])
    sampler = Sampler(topology, rendered.app_name, {
        config.replica_deployment_name: "scorer", config.ingress_deployment_name: "ingress",
        config.ledger_deployment_name: "ledger"})
    sampler.start()
    timings: dict[str, float] = {}
    findings: dict[str, Any] = {}
    port = free_port()
    deployed = None
    try:
        deployed, timings["deploy_s"] = await Deployed.start(rendered, rehearsal_application(rendered), port)
        sampler.record("pool_at_min")
        timings["scale_up_s"] = await deployed.scale_up("up")
        sampler.record("pool_at_max")
        runner, findings["trainer"] = await place_trainer(sampler, rendered, "trainer_placed", PG_TIMEOUT_S)
        if findings["trainer"]["formed_s"] is None:
            # The rest needs the trainer's placement group: the run ends here, failed.
            sampler.flag("trainer_placed", f"verl's placement group did not form within {PG_TIMEOUT_S} s")
        else:
            timings["trainer_pg_s"] = findings["trainer"]["formed_s"]
            timings["drain_s"], timings["scale_down_s"] = await deployed.scale_down()
            sampler.record("pool_scaled_down")
            timings["scale_up_again_s"] = await deployed.scale_up("again")
            sampler.record("pool_scaled_up_again")
        await deployed.load.cancel()
        findings["groups"] = deployed.load.summary()
        await asyncio.to_thread(stop_trainer, runner)
        if old_placement:
            findings["old_placement"] = await rehearse_old_placement(sampler, rendered, port)
    finally:
        sampler.stop()
        if deployed is not None:
            await deployed.load.aclose()
    return {"sampler": sampler, "timings": timings, "findings": findings}


async def rehearse_old_placement(sampler: Sampler, rendered: Rendered, port: int) -> dict[str, Any]:
    """The application as it asked before issue 58 (``replicas.resources`` emptied) at ``max_replicas``, then
    verl's placement group: where the replicas landed, whether the group formed (see the module docstring)."""
    from ray import serve

    await asyncio.to_thread(serve.delete, rendered.app_name)
    sampler.begin("old_placement")
    deployed, _ = await Deployed.start(rendered, rehearsal_application(rendered, old_placement=True), port)
    try:
        await deployed.scale_up("old")
        at_max = sampler.record("pool_at_max")
        runner, trainer = await place_trainer(sampler, rendered, "trainer_asked", OLD_PLACEMENT_PG_WAIT_S)
        await deployed.load.cancel()
        await asyncio.to_thread(stop_trainer, runner)
    finally:
        await deployed.load.aclose()
    return {"scorers_on": at_max["scorers_on"], **trainer,
            "broken": [v["what"] for v in sampler.violations if v["run"] == "old_placement"]}


# ------------------------------------------------------------------------------ main and report


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{group} {count}" for group, count in sorted(value.items())) or "-"
    return "-" if value is None else str(value)


def report_section(results: list[dict]) -> str:
    """docs/benchmarks.md's section: the placement record by phase (results: topology.json's rows)."""
    phases: dict[tuple[str, str], list[dict]] = {}
    for row in results:
        phases.setdefault((row["run"], row["phase"]), []).append(row)
    columns = SUMMARY_COLUMNS
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(summarize(rows)[column]) for column in columns) + " |" for rows in phases.values()]
    return "\n".join([
        "## The production topology, rehearsed",
        "",
        "Command: `.venv/bin/python -m bench.topology`",
        "",
        "SIMULATED ENGINE (scripted; each replica still asks Ray for its GPU). One Ray cluster on this machine shaped as "
        "the rendered RayService declares it (`k8s/render`, `replicas_per_worker=8`): a head, one 8-GPU `grrm-gpus` "
        "node, two `grrm-services` nodes, one 8-GPU `policy-gpus` node, each started with its group's rendered "
        "`rayStartParams`; the rendered application deployed as KubeRay deploys it, scaled by load through "
        "`RewardClient` between `min_replicas` and `max_replicas`; verl's own `ResourcePoolManager` asking for the "
        "trainer's placement group (8 bundles `{CPU: 3, GPU: 1}`, `STRICT_PACK`) from a TaskRunner actor. Where each "
        "replica ran at each phase (`bench/results/topology.json` has every replica's node and GPU ids); `violations`: "
        "rules broken at that phase's sample (a sampler checks them every 0.5 s throughout). `old_placement`: the same "
        "cluster with the replicas asking only for CPUs and a GPU (before issue 58).",
        "",
        "\n".join(lines),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the rendered placement only (CI)")
    parser.add_argument("--old-placement", action="store_true",
                        help="also the old placement (replicas.resources emptied); the full form's default")
    parser.add_argument("--out", default=None, help="also write the result (rows, summaries, findings) here")
    args = parser.parse_args(argv)
    old_placement = args.old_placement or not args.quick
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # one machine, many nodes: no token to pass around
    # The rendered app's HTTP ingress reads its token from here (the pods' Secret); set on every node.
    os.environ.setdefault("GRRM_API_TOKEN", secrets.token_hex(16))
    started = time.monotonic()
    rendered = render_topology()
    topology = start_cluster(rendered)
    address = topology.cluster.address
    try:
        outcome = asyncio.run(rehearse(topology, rendered, old_placement))
    finally:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            topology.cluster.shutdown()
            forget_cluster(address)
    sampler: Sampler = outcome["sampler"]
    wall_s = time.monotonic() - started
    rendered_violations = [v for v in sampler.violations if v["run"] == "rendered"]
    result = {
        "rows": sampler.rows, "summaries": sampler.summaries, "lifetimes": list(sampler.lifetimes.values()),
        "violations": sampler.violations, "samples": sampler.samples, "timings": outcome["timings"],
        "findings": outcome["findings"], "wall_s": wall_s,
        "groups": [asdict(group) for group in rendered.groups],
    }
    print_table(sampler.summaries, SUMMARY_COLUMNS)
    write_json("topology", sampler.rows, {"machine": machine(), "quick": args.quick, "old_placement": old_placement,
                                          **{key: value for key, value in result.items() if key != "rows"}})
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2, default=str)
    print(json.dumps({"wall_s": wall_s, "samples": sampler.samples, "violations": len(rendered_violations),
                      "timings": outcome["timings"]}), flush=True)
    return 0 if not rendered_violations else 1


if __name__ == "__main__":
    raise SystemExit(main())
