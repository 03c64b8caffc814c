"""Whether a deployment can serve: the pure verdict from Serve's details and the nodes, and its cache."""

from __future__ import annotations

import asyncio
import threading

import pytest
from ray.serve.exceptions import DeploymentUnavailableError

from cluster.protocol.schema import GroupRequest, GroupResult
from grrm_handles.availability import (
    DeploymentAvailability,
    ReplicasUnschedulableError,
    assess,
    missing_resources,
)

CPU_NODE = {"CPU": 4.0, "memory": 8e9, "node:127.0.0.1": 1.0}
GPU_NODE = {"CPU": 16.0, "GPU": 1.0}


def deployment(*states: str, required=None, bundles=None, strategy=None, message: str = "") -> dict:
    """Serve's DeploymentDetails of the replica deployment, as JSON."""
    config = {"placement_group_bundles": bundles, "placement_group_strategy": strategy}
    return {
        "name": "GRRMReplica",
        "message": message,
        "required_resources": required if required is not None else {"CPU": 0.5, "GPU": 0.0},
        "deployment_config": config,
        "replicas": [{"state": state} for state in states],
    }


def nodes(*resources: dict, dead: dict | None = None) -> list[dict]:
    found = [{"Alive": True, "Resources": r} for r in resources]
    return found + ([{"Alive": False, "Resources": dead}] if dead else [])


def test_missing_resources_single_actor():
    assert missing_resources([{"CPU": 0.5, "GPU": 1.0}], None, [CPU_NODE]) == {"GPU": 1.0}
    assert missing_resources([{"CPU": 0.5, "GPU": 1.0}], None, [CPU_NODE, GPU_NODE]) == {}
    assert missing_resources([{"CPU": 1.0, "GPU": 2.0}], None, [GPU_NODE]) == {"GPU": 1.0}
    # A custom resource no node declares; zero amounts ask for nothing.
    assert missing_resources([{"CPU": 1.0, "accel_h100": 1.0, "GPU": 0}], None, [GPU_NODE]) == {"accel_h100": 1.0}
    assert missing_resources([{"CPU": 1.0}], None, []) == {"CPU": 1.0}  # no live node at all


def test_missing_resources_tensor_parallel_bundles():
    bundles = [{"CPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]
    # STRICT_PACK (the app's choice for TP > 1): both GPUs on one node; two 1-GPU nodes do not do.
    assert missing_resources(bundles, "STRICT_PACK", [GPU_NODE, GPU_NODE]) == {"GPU": 1.0}
    assert missing_resources(bundles, "STRICT_PACK", [{"CPU": 8.0, "GPU": 2.0}]) == {}
    # Bundle by bundle for the other strategies.
    assert missing_resources(bundles, "PACK", [GPU_NODE, GPU_NODE]) == {}
    # The closest node is reported: the one short of the fewest resources.
    assert missing_resources([{"CPU": 2.0, "GPU": 1.0}], None, [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]) == {"CPU": 1.0}


def test_assess_running_deployment_is_ready():
    verdict = assess(deployment("RUNNING", "STARTING", required={"CPU": 1.0, "GPU": 1.0}), nodes(CPU_NODE))
    assert verdict.ready and verdict.running == 1 and verdict.unschedulable is None
    assert verdict.replica_states == {"RUNNING": 1, "STARTING": 1}


def test_assess_names_the_missing_resources():
    verdict = assess(deployment("STARTING", required={"CPU": 0.5, "GPU": 1.0}), nodes(CPU_NODE, dead=GPU_NODE))
    assert not verdict.ready and verdict.missing == {"GPU": 1.0}
    assert '"GPU": 1.0' in verdict.unschedulable and "no node" in verdict.unschedulable
    assert "gpus_per_rank" in verdict.unschedulable  # what to change
    assert "GRRMReplica" in verdict.describe() and "STARTING: 1" in verdict.describe()
    assert verdict.as_dict()["missing"] == {"GPU": 1.0}


def test_assess_trusts_serve_when_the_resources_exist_but_are_taken():
    starting = deployment("STARTING", required={"CPU": 1.0, "GPU": 1.0})
    assert assess(starting, nodes(GPU_NODE)).unschedulable is None  # may still start: callers wait
    slow = dict(starting, message="Deployment 'GRRMReplica' in application 'grrm' has 1 replicas that have taken "
                                  "more than 30s to be scheduled. Resources required for each replica: ...")
    verdict = assess(slow, nodes(GPU_NODE))
    assert verdict.unschedulable.startswith("Serve cannot place its replicas") and not verdict.missing


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_availability_is_cached_and_refreshed():
    clock = FakeClock()
    facts = [(deployment("STARTING", required={"GPU": 1.0}), nodes(CPU_NODE))]
    fetched = []

    def fetch(app, name):
        fetched.append((app, name))
        return facts[-1]

    availability = DeploymentAvailability("grrm", "GRRMReplica", fetch=fetch, clock=clock)
    first = await availability.current()
    assert first.unschedulable and fetched == [("grrm", "GRRMReplica")]
    assert await availability.current() is first and len(fetched) == 1  # cached
    with pytest.raises(ReplicasUnschedulableError) as raised:
        availability.check("GRRMReplica")
    # A Serve DeploymentUnavailableError: callers that retry those (the trainer bridge) retry it.
    assert isinstance(raised.value, DeploymentUnavailableError)
    assert '"GPU": 1.0' in str(raised.value) and raised.value.availability["missing"] == {"GPU": 1.0}

    facts.append((deployment("RUNNING"), nodes(CPU_NODE)))
    clock.now += availability.refresh_s
    assert (await availability.current()).ready and len(fetched) == 2
    clock.now += 5.0  # a running deployment is looked at less often
    assert len(fetched) == 2 and (await availability.current()).ready
    assert (await availability.current(max_age_s=0)).ready and len(fetched) == 3  # /v1/info: always fresh


async def test_unknown_availability_never_blocks_callers(caplog):
    def broken(app, name):
        raise ConnectionError("no controller")

    availability = DeploymentAvailability("grrm", "GRRMReplica", fetch=broken, clock=FakeClock())
    verdict, refreshing = availability.check("GRRMReplica")
    assert verdict is None and await asyncio.wrap_future(refreshing) is None
    # A deployment Serve does not know (yet) is unknown too.
    missing = DeploymentAvailability("grrm", "GRRMReplica", fetch=lambda a, n: (None, []), clock=FakeClock())
    assert await missing.current() is None


def test_only_serve_handles_get_an_availability():
    class Handle:
        class deployment_id:  # noqa: N801 - the shape of Serve's DeploymentID
            name, app_name = "GRRMReplica", "grrm"

    availability = DeploymentAvailability.for_handle(Handle())
    assert (availability.app_name, availability.deployment_name) == ("grrm", "GRRMReplica")
    assert DeploymentAvailability.for_handle(object()) is None


def test_concurrent_callers_share_one_fetch():
    calls = []

    def slow_fetch(app, name):
        calls.append(1)
        import time

        time.sleep(0.05)
        return deployment("RUNNING"), nodes(CPU_NODE)

    availability = DeploymentAvailability("grrm", "GRRMReplica", fetch=slow_fetch)

    async def many():
        return await asyncio.gather(*(availability.current() for _ in range(20)))

    verdicts = asyncio.run(many())
    assert all(v.ready for v in verdicts) and len(calls) == 1


class BlockedFetch:
    """Serve's facts as a fetch reads them while the GCS is down: it blocks until ``released``."""

    def __init__(self, facts):
        self.facts, self.calls = facts, 0
        self.released = threading.Event()

    def __call__(self, app, name):
        self.calls += 1
        assert self.released.wait(30), "never released"
        return self.facts


async def test_peek_answers_at_once_and_refreshes_once_in_the_background():
    fetch = BlockedFetch((deployment("RUNNING"), nodes(CPU_NODE)))
    availability = DeploymentAvailability("grrm", "GRRMReplica", fetch=fetch)
    verdict, refreshing = availability.peek()
    assert verdict is None and refreshing is not None  # unknown yet, not a wait
    assert availability.peek() == (None, refreshing)  # the same refresh serves every caller
    # A probe waits for the first look only so long, and a waiter giving up does not stop the refresh.
    assert await availability.settled(0.05) is None and not refreshing.done()
    fetch.released.set()
    assert (await asyncio.wrap_future(refreshing)).ready and fetch.calls == 1
    verdict, refreshing = availability.peek()
    assert verdict.ready and refreshing is None and (await availability.settled(0.05)).ready


class Response:
    """A Serve DeploymentResponse's surface: awaitable, cancellable."""

    def __init__(self, result=None):
        self.future = asyncio.get_running_loop().create_future()
        if result is not None:
            self.future.set_result(result)

    def __await__(self):
        return self.future.__await__()

    def cancel(self):
        self.future.cancel()


class Handle:
    """A deployment handle whose ``run_group`` answers at once (``answer``) or never."""

    class deployment_id:  # noqa: N801 - the shape of Serve's DeploymentID
        name, app_name = "GRRMReplica", "grrm"

    def __init__(self, answer=None):
        self.responses = []
        handle = self

        class Method:
            def remote(self, request):
                handle.responses.append(Response(answer))
                return handle.responses[-1]

        self.run_group = Method()


GROUP = {"group_id": "g", "source": "Hallo", "candidates": ["Hello", "Hi"], "src_lang": "German", "trg_lang": "English"}


async def test_a_call_never_waits_for_the_verdict():
    """While the GCS is down a fetch blocks (until the GCS is back); a call goes through to its
    replica all the same, the first (no verdict yet) as well as one whose verdict went stale."""
    from deployments.client import ScorerClient

    clock = FakeClock()
    fetch = BlockedFetch((deployment("RUNNING"), nodes(CPU_NODE)))
    scored = GroupResult(group_id="scored", valid=True, scores=[3, 8])
    client = ScorerClient(Handle(answer=scored),
                          availability=DeploymentAvailability("grrm", "GRRMReplica", fetch=fetch, clock=clock))
    assert (await asyncio.wait_for(client.group_result(GroupRequest(**GROUP)), 5)).group_id == "scored"
    fetch.released.set()
    while client.availability.peek()[0] is None:
        await asyncio.sleep(0.01)
    fetch.released.clear()
    clock.now += 60  # stale: the next call starts a refresh that blocks again
    assert (await asyncio.wait_for(client.group_result(GroupRequest(**GROUP)), 5)).group_id == "scored"
    assert fetch.calls == 2
    fetch.released.set()


async def test_the_first_call_fails_as_soon_as_the_first_look_says_no_replica_can_run():
    from deployments.client import ROUTE_POLICY, ScorerClient

    handle = Handle(answer=None)  # the call would wait in the handle's queue for ever
    fetch = BlockedFetch((deployment("STARTING", required={"GPU": 1.0}), nodes(CPU_NODE)))
    # The HTTP ingress's policy: a caller's retries are the caller's.
    client = ScorerClient(handle, ROUTE_POLICY, availability=DeploymentAvailability("grrm", "GRRMReplica", fetch=fetch))
    call = asyncio.ensure_future(client.group_result(GroupRequest(**GROUP)))
    await asyncio.sleep(0.2)
    assert not call.done()  # sent, waiting: the look is not back yet
    fetch.released.set()
    with pytest.raises(ReplicasUnschedulableError, match='"GPU": 1.0'):
        await asyncio.wait_for(call, 1.0)  # long before a refresh period (2 s)
    assert handle.responses[0].future.cancelled()  # the waiting call was taken back
