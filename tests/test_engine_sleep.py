"""When a replica's engine sleeps and wakes (cluster/engine_sleep.py), without Ray: the pure decision,
then the sleeper on the scripted engine (a generation never reaches a sleeping engine)."""

from __future__ import annotations

import asyncio

import pytest

from cluster.autoscaling import Demand, ScalingSettings
from cluster.engine_sleep import EngineSleeper, sleep_action
from cluster.engines import EngineConfig, EngineDeadError, SamplingSettings, make_engine
from cluster.engines.config import ScriptedEngineOptions

SETTINGS = ScalingSettings(idle="sleep", wake_s=10.0, sleep_after_s=30.0, demand_grace_s=5.0, cold_start_s=30.0)


def action(now=100.0, sleeping=False, busy=False, idle_since=0.0, demands=(), margin_s=0.0):
    return sleep_action(now=now, sleeping=sleeping, busy=busy, idle_since=idle_since, demands=list(demands),
                        settings=SETTINGS, margin_s=margin_s)


def phase(starts_at: float, groups: int = 100, profile: tuple[float, ...] = ()) -> Demand:
    """A phase of 100 s: one group a second when even."""
    return Demand("run", groups, starts_at, starts_at + 100.0, profile=profile)


def test_an_engine_sleeps_only_after_sleep_after_s_without_work():
    assert action(now=29.0, idle_since=0.0) is None
    assert action(now=30.0, idle_since=0.0) == "sleep"
    assert action(now=100.0, busy=True, idle_since=None) is None  # groups queued, running or assembling
    assert action(now=100.0, idle_since=None) is None  # it has only now stopped being busy


def test_an_engine_stays_awake_while_an_announced_phase_is_expected_to_send_a_group_within_a_wake_up():
    assert action(demands=[phase(109.0)]) is None  # its first group is due within wake_s
    assert action(demands=[phase(111.0)]) == "sleep"
    assert action(demands=[phase(111.0)], margin_s=2.0) is None  # a late check is allowed for
    assert action(demands=[phase(50.0)]) is None  # on, a group a second
    assert action(demands=[phase(105.0, groups=0)]) == "sleep"  # withdrawn
    assert action(demands=[phase(-10.0)]) == "sleep"  # over


def test_a_phase_whose_groups_crowd_its_end_lets_the_engine_sleep_through_its_quiet_start():
    crowded = phase(50.0, profile=(0.0,) * 9 + (1.0,))  # all 100 groups in its last 10 s: 140-150
    assert action(now=100.0, demands=[crowded]) == "sleep"
    assert action(now=131.0, demands=[crowded]) is None
    assert action(now=131.0, sleeping=True, demands=[crowded]) == "wake"  # a wake-up before the crowd


def test_a_sleeping_engine_wakes_for_work_or_an_imminent_phase_and_else_sleeps_on():
    assert action(sleeping=True) is None
    assert action(sleeping=True, busy=True, idle_since=None) == "wake"  # a group waits for the wake-up
    assert action(sleeping=True, demands=[phase(109.0)]) == "wake"  # a wake-up ahead of the phase
    assert action(sleeping=True, demands=[phase(130.0)]) is None


def sleeper(wake_s: float = 0.0, clock=None) -> EngineSleeper:
    engine = make_engine(EngineConfig(kind="scripted", sleep_mode=True, scripted=ScriptedEngineOptions(wake_s=wake_s)))
    settings = ScalingSettings(idle="sleep", wake_s=wake_s, sleep_after_s=5.0, cold_start_s=30.0)
    return EngineSleeper(engine, settings, clock=clock) if clock else EngineSleeper(engine, settings)


async def test_the_sleeper_puts_an_idle_engine_to_sleep_and_wakes_it_before_a_generation():
    now = [1000.0]
    subject = sleeper(wake_s=0.1, clock=lambda: now[0])
    await subject.engine.start()
    assert await subject.check(pending=False, demands=[]) is None
    now[0] += 5.0
    assert await subject.check(pending=False, demands=[]) == "sleep"
    assert subject.sleeping and subject.sleeps == 1
    async with subject.awake():  # the generation waits for the wake-up, then runs on an awake engine
        [generation] = await subject.engine.generate(["a prompt"], SamplingSettings(max_tokens=4))
    assert generation.completion_tokens > 0
    assert not subject.sleeping and subject.wakes == 1 and subject.woken_for_work == 1
    assert subject.idle_since == now[0]  # idle again from the generation's end
    assert await subject.check(pending=True, demands=[]) is None  # awake and busy: stays awake
    assert subject.idle_since is None


async def test_the_sleeper_never_puts_an_engine_to_sleep_under_a_generation():
    now = [0.0]
    subject = sleeper(clock=lambda: now[0])
    await subject.engine.start()
    async with subject.awake():
        now[0] += 60.0
        assert await subject.check(pending=False, demands=[]) is None  # generating: busy, not idle
        assert not subject.sleeping


async def test_work_pending_wakes_a_sleeping_engine_ahead_of_its_generation():
    now = [0.0]
    subject = sleeper(clock=lambda: now[0])
    await subject.engine.start()
    now[0] += 5.0
    assert await subject.check(pending=False, demands=[]) == "sleep"
    assert await subject.check(pending=True, demands=[]) == "wake"  # a group queued (at the fair gate): wakes now
    assert not subject.sleeping and subject.woken_for_work == 0


async def test_concurrent_generations_wait_for_one_wake_up():
    subject = sleeper(wake_s=0.2)
    await subject.engine.start()
    await subject.engine.sleep()

    async def generate() -> None:
        async with subject.awake():
            await subject.engine.generate(["a prompt"], SamplingSettings(max_tokens=4))

    await asyncio.gather(*(generate() for _ in range(5)))
    assert subject.wakes == 1 and subject.engine.wakes == 1 and subject.engine.generations_served == 5


async def test_an_engine_that_cannot_wake_is_lost():
    subject = sleeper()
    await subject.engine.start()
    await subject.engine.sleep()
    subject.engine.kill()
    with pytest.raises(EngineDeadError, match="could not wake up"):
        async with subject.awake():
            pass
