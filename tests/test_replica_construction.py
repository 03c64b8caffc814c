"""A scorer replica whose construction fails releases what it had started, and its destructor
never raises, however far the construction got. The class is called directly, as
Serve calls it in a replica actor."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import psutil
import pytest

import deployments.replica as replica_module
from cluster.engines import EngineConfig
from deployments.config import AppConfig, ReplicaSettings
from deployments.preflight import PreflightError
from deployments.replica import GRRMReplica


# Python's garbage collector also calls the async destructor of replicas built here (Serve awaits
# it; the collector cannot): that coroutine is dropped, as in any Serve replica object.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'GRRMReplica.__del__' was never awaited")


@pytest.fixture
def lifecycle(monkeypatch):
    """What happens to the engines replicas make: the real factory and engines, watched."""
    events: list[str] = []
    make_engine = replica_module.make_engine

    def watched(config):
        engine = make_engine(config)
        start, stop = engine.start, engine.stop

        async def watched_start():
            await start()
            events.append("started")

        async def watched_stop():
            events.append("stop")
            await stop()

        engine.start, engine.stop = watched_start, watched_stop
        return engine

    monkeypatch.setattr(replica_module, "make_engine", watched)
    return events


async def construct(config: AppConfig) -> GRRMReplica:
    replica = GRRMReplica.__new__(GRRMReplica)
    await replica.__init__(config)
    return replica


async def test_a_failure_after_the_engine_started_stops_the_engine(lifecycle, caplog):
    # Valid configs cannot say this; a config that skipped validation (model_copy) reaches the
    # assembler, a step after the engine's start, which refuses it.
    config = AppConfig(engine=EngineConfig(kind="scripted")).model_copy(update={"assembly_timeout_s": 0})
    with caplog.at_level(logging.ERROR, logger="ray.serve"), pytest.raises(ValueError, match="assembly_timeout_s"):
        await construct(config)
    assert lifecycle == ["started", "stop"]
    assert "construction failed" in caplog.text


async def test_a_failing_engine_start_is_still_stopped(lifecycle, tmp_path):
    # An engine whose start fails may have started processes: it is stopped all the same. A directory
    # with a config.json and a weights file passes the pre-flight's model check; the weights are empty,
    # so the start fails.
    (tmp_path / "config.json").write_text((Path(__file__).parent / "data" / "qwen2.5-7b-config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"")
    config = AppConfig(engine=EngineConfig(kind="transformers", model=str(tmp_path)),
                       replicas=ReplicaSettings(num_replicas=1, gpus_per_rank=0))
    with pytest.raises(Exception) as error:
        await construct(config)
    assert not isinstance(error.value, PreflightError)
    assert lifecycle == ["stop"]


async def test_a_node_that_fails_the_pre_flight_makes_no_engine(lifecycle):
    with pytest.raises(PreflightError, match=r"\[PROBLEM\] model: engine.model: '/no/such/model' is not a directory"):
        await construct(AppConfig(engine=EngineConfig(kind="transformers", model="/no/such/model"),
                                  replicas=ReplicaSettings(num_replicas=1, gpus_per_rank=0)))
    assert lifecycle == []


async def test_the_destructor_never_raises_however_far_construction_got(lifecycle):
    bare = GRRMReplica.__new__(GRRMReplica)  # __init__ failed before anything existed
    await bare.__del__()
    assert lifecycle == []

    replica = await construct(AppConfig(engine=EngineConfig(kind="scripted")))
    await replica.engine.check_health()
    assert replica.process_guard.watching
    await replica.__del__()
    assert lifecycle == ["started", "stop"]
    # The engine stopped: its process guard (cluster/engines/process_guard.py) ends, killing nothing.
    # disarm() waits for that at most a few seconds (a replica's shutdown must not hang on it); on a
    # loaded machine the watcher ends later, so the test waits for the watcher's exit itself (psutil
    # raises TimeoutExpired, a clear failure, if it never ends).
    try:
        watcher = psutil.Process(replica.process_guard.pid)
    except psutil.NoSuchProcess:  # ended already
        pass
    else:
        await asyncio.to_thread(watcher.wait, 120)
    assert not replica.process_guard.watching
    await replica.__del__()  # again (an engine's stop is idempotent): harmless


async def test_a_failing_stop_is_logged_not_raised(lifecycle, caplog):
    replica = await construct(AppConfig(engine=EngineConfig(kind="scripted")))

    async def broken_stop():
        raise RuntimeError("stop failed")

    replica.engine.stop = broken_stop
    replica.assembler.close = broken_stop  # both steps fail: each is logged, neither raises
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        await replica.__del__()
    assert "could not close the assembler" in caplog.text and "could not stop the engine" in caplog.text
    # Its processes, if any, end with the replica's process: the guard stays armed.
    assert replica.process_guard.watching
    replica.process_guard.disarm()


async def test_a_replica_that_lost_its_engine_answers_no_peers_probe(lifecycle):
    """A peer probes a replica (takes_members) before it hands it members of the groups the ring now
    places there. One that lost its engine must not answer (its process is about to end): the peer
    then keeps the members, instead of handing them over to come back 'moved' at their callers' cost."""
    import asyncio

    replica = await construct(AppConfig(engine=EngineConfig(kind="scripted")))
    try:
        assert await asyncio.wait_for(replica.takes_members(), 1.0) == replica.name
        replica.loss._lost = asyncio.get_running_loop().create_future()  # what EngineLoss.lose sets first
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(replica.takes_members(), 0.5)
    finally:
        replica.loss._lost = None
        await replica.__del__()
