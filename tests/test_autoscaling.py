"""The autoscaling decision (cluster/autoscaling.py) and its Serve edge's parsing, without Ray."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from cluster.autoscaling import (
    Demand,
    EngineWorkMeter,
    ReplicaLoad,
    ScalingSettings,
    break_even_s,
    cold_start_s,
    measured_leads,
    decide_replicas,
    engine_work,
    queued_groups,
    replicas_for_demand,
)
from cluster.announced_demand import WITHDRAWAL_KEPT_S, AnnouncedDemands, copy_delay_s, demand_of, seen_later
from cluster.protocol.schema import DemandAnnouncement
from deployments.autoscaling_policy import (
    POLICY_PATH,
    ApplicationEngineWorkPolicy,
    EngineWorkPolicy,
    autoscaling_stats,
    demand_stats,
    demands_of,
    loads_of,
)

SETTINGS = ScalingSettings(min_replicas=1, max_replicas=4, target_backlog_s=10.0, upscale_delay_s=2.0,
                           downscale_delay_s=30.0, cold_start_s=20.0, default_seconds_per_group=1.0)


def decide(now: float, current: int, loads=(), demands=(), state=None, settings=SETTINGS, queued_at_callers=0.0,
           serving=None):
    return decide_replicas(now=now, current=current, loads=list(loads), demands=list(demands), settings=settings,
                           state=state, queued_at_callers=queued_at_callers, serving=serving)


def test_members_that_only_wait_add_no_replica():
    # The measurement: 600 members of 200 groups each waiting for its fourth member.
    waiting = [ReplicaLoad(members_waiting=600.0, seconds_per_group=0.05)]
    state = None
    for second in range(60):
        decision = decide(float(second), 1, waiting, state=state)
        state = decision.state
        assert decision.replicas == 1
    assert decision.engine_work_s == 0.0


def test_with_min_replicas_zero_the_last_replica_stays_while_members_wait_on_it_and_goes_when_idle():
    settings = dataclasses.replace(SETTINGS, min_replicas=0, downscale_delay_s=5.0)
    waiting = [ReplicaLoad(members_waiting=3.0, seconds_per_group=1.0)]
    state = None
    for second in range(30):
        decision = decide(float(second), 1, waiting, state=state, settings=settings)
        state = decision.state
        assert decision.replicas == 1  # kept, never more: waiting members are a forecast, not load
    idle = [ReplicaLoad(seconds_per_group=1.0)]
    first = decide(30.0, 1, idle, state=state, settings=settings)
    assert decide(35.0, 1, idle, state=first.state, settings=settings).replicas == 0
    # A pool at zero with nothing queued at callers and nothing announced stays at zero.
    assert decide(40.0, 0, [], settings=settings).replicas == 0


def test_queued_engine_work_adds_replicas_after_the_upscale_delay():
    loads = [ReplicaLoad(groups_waiting=30, groups_running=4, queued_work_s=35.0, seconds_per_group=1.0)]
    first = decide(100.0, 1, loads)
    assert first.replicas == 1 and first.for_work == 4  # wanted, held for the delay
    assert decide(101.0, 1, loads, state=first.state).replicas == 1
    assert decide(102.0, 1, loads, state=first.state).replicas == 4


def test_a_dip_below_the_wanted_count_restarts_the_upscale_delay():
    busy = [ReplicaLoad(groups_waiting=30, queued_work_s=35.0, seconds_per_group=1.0)]
    state = decide(0.0, 1, busy).state
    state = decide(1.0, 1, [], state=state).state  # the backlog drained meanwhile
    assert decide(2.5, 1, busy, state=state).replicas == 1
    assert decide(4.6, 1, busy, state=decide(2.5, 1, busy, state=state).state).replicas == 4


def test_scaling_down_waits_for_the_downscale_delay_and_a_controller_restart_starts_it_again():
    idle = [ReplicaLoad(seconds_per_group=1.0)] * 4
    first = decide(0.0, 4, idle)
    assert first.replicas == 4
    assert decide(29.0, 4, idle, state=first.state).replicas == 4
    assert decide(30.0, 4, idle, state=first.state).replicas == 1
    # A restarted controller hands the policy no state: it waits a whole delay again, never drops at once.
    assert decide(31.0, 4, idle, state={}).replicas == 4


def test_an_idle_pool_between_announced_phases_drops_at_once_and_within_a_phase_after_the_idle_delay():
    settings = dataclasses.replace(SETTINGS, idle_downscale_delay_s=2.0)
    idle = [ReplicaLoad(seconds_per_group=1.0)] * 4
    # The run's next phase opens in 120 s: announced, far beyond a cold start (20 s), so it needs none now, and
    # no announced phase is on: the trainer has said its work comes later, so the pool drops at once.
    next_phase = Demand("run-a", 40, starts_at=120.0, ends_at=160.0)
    dropped = decide(0.0, 4, idle, [next_phase], settings=settings)
    assert dropped.replicas == 1 and "until the next announced phase" in dropped.reason
    # Within an announced phase (here run-b's: 40 groups in 40 s at 1 s, headroom 1.5: 2 replicas) an idle
    # moment may be a lull: the pool holds for the idle delay, then drops to what the phase needs.
    on_now = Demand("run-b", 40, starts_at=-10.0, ends_at=30.0)
    first = decide(0.0, 4, idle, [on_now, next_phase], settings=settings)
    assert first.replicas == 4
    after = decide(2.0, 4, idle, [on_now, next_phase], state=first.state, settings=settings)
    assert after.replicas == 2 and "within an announced phase" in after.reason
    # Work between two idle moments restarts the idle clock.
    busy = [ReplicaLoad(groups_running=1, queued_work_s=1.0, seconds_per_group=1.0)] + idle[1:]
    state = decide(0.0, 4, idle, [on_now], settings=settings).state
    state = decide(1.0, 4, busy, [on_now], state=state, settings=settings).state
    assert decide(2.5, 4, idle, [on_now], state=state, settings=settings).replicas == 4
    # A pool nobody announces to keeps the whole downscale delay (served as before announcements existed).
    assert decide(2.0, 4, idle, state=decide(0.0, 4, idle, settings=settings).state, settings=settings).replicas == 4
    # Members waiting for their group-mates are groups on their way: not idle, the downscale delay holds.
    waiting = [ReplicaLoad(seconds_per_group=1.0, members_waiting=3.0)] + idle[1:]
    state = decide(0.0, 4, waiting, [next_phase], settings=settings).state
    assert decide(2.0, 4, waiting, [next_phase], state=state, settings=settings).replicas == 4
    # Never below what the announced phase needs within two cold starts (40 s): 40 groups in 40 s at 1 s, headroom
    # 1.5, counted from when its expected work reaches target_backlog_s (10 s: 6.7 groups, 6.7 s in, at 126.7).
    assert decide(86.0, 4, idle, [next_phase], settings=settings).replicas == 1
    assert decide(87.0, 4, idle, [next_phase], settings=settings).replicas == 2


def test_requests_queued_at_callers_count_as_work_while_a_replica_is_saturated():
    settings = ScalingSettings(max_replicas=8, upscale_delay_s=0, target_backlog_s=10.0)
    saturated = [ReplicaLoad(groups_running=4, queued_work_s=2.0, seconds_per_group=0.5, saturated=True)]
    assert decide(0.0, 1, saturated, settings=settings).replicas == 1
    assert decide(0.0, 1, saturated, settings=settings, queued_at_callers=60).replicas == 4  # 2 + 30 s
    # Members count as members: 60 requests of groups of 4 are 15 groups' work (2 + 7.5 s).
    of_four = [dataclasses.replace(saturated[0], members_per_group=4.0)]
    assert decide(0.0, 1, of_four, settings=settings, queued_at_callers=60).replicas == 1
    assert decide(0.0, 1, of_four, settings=settings, queued_at_callers=240).replicas == 4  # 2 + 30 s
    # An empty pool (none serving to say) counts what waits for it: the work must start one.
    assert decide(0.0, 0, [], settings=settings, queued_at_callers=3).replicas == 1
    # And a pool that may empty keeps the replica those requests are on their way to, saturated or not.
    may_empty = dataclasses.replace(settings, min_replicas=0, downscale_delay_s=0.0)
    state = None
    for second in range(5):
        decision = decide(float(second), 1, [ReplicaLoad(seconds_per_group=1.0)], settings=may_empty,
                          queued_at_callers=3, state=state)
        state = decision.state
        assert decision.replicas == 1, decision.reason


def test_a_burst_of_members_in_transit_is_no_engine_work():
    # Issue 48's measurement: 200 groups of 4, 3 members each, sent at once; the routers had not yet
    # placed 600 of them when the policy looked, while the one replica's slots were mostly free and no
    # group was complete. Counted as 600 groups' work, the pool went 1 -> 4 (its bound).
    settings = ScalingSettings(max_replicas=4, upscale_delay_s=0, target_backlog_s=10.0,
                               default_seconds_per_group=1.0)
    in_transit = [ReplicaLoad(members_waiting=120.0, seconds_per_group=1.0, members_per_group=4.0)]
    state = None
    for second in range(20):
        decision = decide(float(second), 1, in_transit, state=state, settings=settings, queued_at_callers=600)
        state = decision.state
        assert decision.replicas == 1 and decision.engine_work_s == 0.0, decision.reason
    assert queued_groups(in_transit, 600) == 0.0
    # Once the replica's slots are (nearly) all taken, the same queue is 150 groups' work.
    full = [dataclasses.replace(in_transit[0], saturated=True)]
    assert queued_groups(full, 600) == 150.0
    # A replica that serves but has not reported yet (right after a deploy; the real-Serve test saw the
    # policy's first look come before the first report, and the pool went 1 -> 2) is no empty pool.
    assert queued_groups([], 600, serving=1) == 0.0
    assert decide(0.0, 1, [], settings=settings, queued_at_callers=600, serving=1).replicas == 1
    assert decide(0.0, 1, [], settings=settings, queued_at_callers=600, serving=0).replicas == 4  # none serves yet


def test_a_replica_reports_saturation_from_its_slots_and_its_mean_group_size():
    meter = EngineWorkMeter()
    assert meter.load(0.0, 10, slots=100).saturated is False
    assert meter.load(0.0, 90, slots=100).saturated is True
    assert meter.load(0.0, 10_000).saturated is False  # slots unknown: never
    assert meter.load(0.0, 0).members_per_group is None
    meter.queued(100.0, members=4)
    meter.queued(100.0, members=8)
    load = meter.load(0.0, 88, slots=100)
    assert load.members_per_group == 6.0 and load.saturated  # 88 members + 2 groups of 100 slots


def test_a_fresh_replica_counts_its_groups_at_the_default_cost():
    fresh = ReplicaLoad(groups_waiting=25, groups_running=5)
    assert engine_work(fresh, 1.0) == 30.0
    assert decide(0.0, 1, [fresh], settings=ScalingSettings(max_replicas=8, upscale_delay_s=0,
                                                          default_seconds_per_group=1.0)).replicas == 3


def test_announced_demand_scales_ahead_within_a_cold_start_and_is_capped():
    settings = ScalingSettings(max_replicas=8, cold_start_s=20.0, demand_headroom=1.0, demand_grace_s=10.0,
                               upscale_delay_s=0.0)
    # 120 groups in 60 s at 2 s each: 4 engine-seconds per second, 4 replicas.
    step = Demand("run-a", 120, starts_at=100.0, ends_at=160.0)
    assert replicas_for_demand([step], 70.0, 2.0, settings) == 0  # too early: a replica would idle
    # Its first 5 groups are 10 s of work (target_backlog_s: what one replica may hold queued): they start
    # no replica ahead; from 2.5 s into the phase it needs 4, asked for one cold start before.
    assert replicas_for_demand([step], 80.0, 2.0, settings) == 0
    assert replicas_for_demand([step], 82.5, 2.0, settings) == 4
    assert replicas_for_demand([step], 165.0, 2.0, settings) == 4  # its last groups, within the grace
    assert replicas_for_demand([step], 171.0, 2.0, settings) == 0  # over
    # Two runs' phases overlap: their rates add up.
    other = Demand("run-b", 60, starts_at=90.0, ends_at=150.0)
    assert replicas_for_demand([step, other], 110.0, 2.0, settings) == 6
    # A forecast far too high is capped by max_replicas.
    flood = Demand("run-c", 1_000_000, starts_at=100.0, ends_at=110.0)
    decision = decide(100.0, 1, [], [flood], settings=settings)
    assert decision.for_demand > 8 and decision.replicas == 8


def test_a_profiled_phase_adds_replicas_a_cold_start_before_its_crowd_not_before_its_start():
    """GRPO groups are complete at their last rollout: the announced profile puts most of them at the
    phase's end, and the pool grows for that slice, one cold start before it."""
    settings = ScalingSettings(max_replicas=16, cold_start_s=20.0, demand_headroom=1.0, demand_grace_s=5.0)
    # 100 groups over 100 s at 1 s each: evenly 1 replica; 80% in the last 10 s: 8 replicas then.
    crowded = Demand("run-a", 100, starts_at=100.0, ends_at=200.0, profile=(0.0,) * 8 + (0.2, 0.8))
    assert crowded.peak_rate(100.0, 150.0) == 0.0 and crowded.peak_rate(180.0, 181.0) == pytest.approx(2.0)
    assert replicas_for_demand([crowded], 80.0, 1.0, settings) == 0  # its start is a cold start away: none yet
    # Its expected work reaches target_backlog_s (10 groups at 1 s) halfway through the 9th slice (20 groups in
    # 10 s): 2 replicas from then, asked for a cold start before.
    assert crowded.reaches(10) == pytest.approx(185.0)
    assert replicas_for_demand([crowded], 160.0, 1.0, settings) == 0
    assert replicas_for_demand([crowded], 165.0, 1.0, settings) == 2
    assert replicas_for_demand([crowded], 170.0, 1.0, settings) == 8  # the last slice is a cold start away
    assert replicas_for_demand([crowded], 204.0, 1.0, settings) == 8  # its last groups, within the grace
    assert replicas_for_demand([crowded], 206.0, 1.0, settings) == 0
    # The same phase announced evenly: 1 replica from a cold start before its 10th group (at 110) to its end.
    even = Demand("run-a", 100, starts_at=100.0, ends_at=200.0)
    assert [replicas_for_demand([even], t, 1.0, settings) for t in (80.0, 90.0, 170.0)] == [0, 1, 1]
    # A phase whose whole work is less than target_backlog_s starts no more than one replica ahead (one serves by
    # its first group, at 102, asked for a cold start before: a pool that may empty has it), scored as it comes.
    small = Demand("run-a", 5, starts_at=100.0, ends_at=110.0)
    assert small.reaches(10) == math.inf and small.reaches(1) == pytest.approx(102.0)
    times = (81.0, 82.0, 100.0, 115.0, 116.0)
    assert [replicas_for_demand([small], t, 1.0, settings) for t in times] == [0, 1, 1, 1, 0]


def test_a_measured_cold_start_longer_than_configured_brings_announced_replicas_earlier():
    settings = ScalingSettings(max_replicas=8, cold_start_s=20.0, demand_headroom=1.0, upscale_delay_s=0.0)
    step = Demand("run-a", 120, starts_at=100.0, ends_at=160.0)  # 4 replicas at 2 s a group
    quick = [ReplicaLoad(seconds_per_group=2.0, cold_start_s=5.0)]  # faster than configured: the floor holds
    slow = [ReplicaLoad(seconds_per_group=2.0, cold_start_s=50.0), ReplicaLoad(seconds_per_group=2.0, cold_start_s=40.0)]
    assert cold_start_s(quick, 20.0) == 20.0 and cold_start_s(slow, 20.0) == 45.0 and cold_start_s([], 20.0) == 20.0
    assert decide(70.0, 1, quick, [step], settings=settings).replicas == 1  # 30 s ahead: later than 20 s
    assert decide(70.0, 2, slow, [step], settings=settings).replicas == 4  # engines that load in 45 s start now
    report = autoscaling_stats(slow[0], [])
    assert loads_of({"a": report}) == [slow[0]]


def test_the_policy_measures_its_cold_start_from_asking_to_serving_and_announced_replicas_come_that_late():
    """The configured cold start is a guess (here 20 s); the policy times its own: from asking for more
    replicas to all of them serving. The longest of the last three then says how far ahead announced
    work is started."""
    settings = ScalingSettings(min_replicas=0, max_replicas=8, cold_start_s=20.0, demand_headroom=1.0,
                               target_backlog_s=2.0, upscale_delay_s=0.0, default_seconds_per_group=2.0)
    step = Demand("run-a", 120, starts_at=100.0, ends_at=160.0)  # 4 replicas at 2 s a group, counted from 100.5
    asked = decide(80.5, 0, [], [step], settings=settings)
    assert asked.replicas == 4 and asked.state["asked/4"] == 80.5
    # Replicas still starting, or some of them serving: nothing measured; all four serving 6 s after the ask.
    assert measured_leads(decide(83.0, 4, [], [step], state=asked.state, settings=settings, serving=0).state) == []
    three = decide(84.0, 4, [ReplicaLoad()] * 3, [step], state=asked.state, settings=settings)
    assert measured_leads(three.state) == []
    served = decide(86.5, 4, [ReplicaLoad()] * 4, [step], state=asked.state, settings=settings)
    assert measured_leads(served.state) == [6.0] and "asked/4" not in served.state
    # The next phase (a minute later) gets its replicas 6 s ahead, not 20 s.
    later = Demand("run-a", 120, starts_at=200.0, ends_at=260.0)
    idle = dict(served.state)
    assert decide(190.0, 0, [], [later], state=idle, settings=settings).replicas == 0
    ahead = decide(194.5, 0, [], [later], state=idle, settings=settings)
    assert ahead.replicas == 4 and ahead.cold_start_s == 6.0
    # Only the last MEASURED_LEADS count, the longest; the replicas' own longer construction still raises it.
    state = dict(served.state)
    for ask, serves in ((300.0, 309.0), (400.0, 407.0), (500.0, 505.0)):
        state = decide(ask, 0, [], [Demand("run-a", 120, ask + 1, ask + 61)], state=state, settings=settings).state
        state = decide(serves, 4, [ReplicaLoad()] * 4, state=state, settings=settings).state
    assert sorted(measured_leads(state)) == [5.0, 7.0, 9.0]  # the first (6 s) gave way
    assert cold_start_s([], 20.0, measured_leads(state)) == 9.0
    assert cold_start_s([ReplicaLoad(cold_start_s=12.0)], 20.0, measured_leads(state)) == 12.0
    # A controller restart loses the measurements: the configured value counts again.
    assert decide(190.0, 0, [], [later], settings=settings).replicas == 4


def test_each_count_asked_for_is_timed_from_its_own_ask_to_all_of_it_serving():
    settings = ScalingSettings(min_replicas=0, max_replicas=8, cold_start_s=20.0, upscale_delay_s=0.0,
                               default_seconds_per_group=1.0, downscale_delay_s=60.0)
    one = Demand("run-a", 1, starts_at=100.0, ends_at=101.0)  # one group, at 101: one replica by then
    state = decide(81.0, 0, [], [one], settings=settings).state
    assert state["asked/1"] == 81.0
    # Work queued at the callers meanwhile (35 s): 4 asked for at 82 while the first still starts, timed apart.
    state = decide(82.0, 1, [], [one], settings=settings, queued_at_callers=35, state=state, serving=0).state
    assert state["asked/1"] == 81.0 and state["asked/4"] == 82.0
    queued = [ReplicaLoad(groups_waiting=35, queued_work_s=35.0, seconds_per_group=1.0)]
    state = decide(84.0, 4, queued, [one], settings=settings, state=state).state  # the first serves: 3 s
    assert measured_leads(state) == [3.0] and "asked/4" in state
    idle = [ReplicaLoad(seconds_per_group=1.0)]
    state = decide(89.0, 4, idle * 4, [one], settings=settings, state=state).state  # all four: 7 s
    assert sorted(measured_leads(state)) == [3.0, 7.0] and not any(key.startswith("asked/") for key in state)
    # A count no longer asked for is no longer timed (it would never serve).
    state = decide(200.0, 1, queued, settings=settings).state
    assert state["asked/4"] == 200.0
    state = decide(201.0, 4, idle, settings=settings, state=state).state
    assert "asked/4" in state  # still asked for (the downscale delay holds the pool): timed on
    assert "asked/4" not in decide(262.0, 4, idle, settings=settings, state=state).state


def test_the_next_announced_step_keeps_its_replicas_through_a_training_phase():
    settings = ScalingSettings(max_replicas=8, cold_start_s=20.0, downscale_delay_s=5.0, demand_headroom=1.0,
                               demand_grace_s=0.0)
    next_step = Demand("run-a", 120, starts_at=110.0, ends_at=170.0)
    # The training phase: no work now, but the next step starts within a cold start.
    state: dict = {}
    for now in range(90, 110):
        decision = decide(float(now), 4, [ReplicaLoad(seconds_per_group=2.0)] * 4, [next_step], state=state,
                          settings=settings)
        state = decision.state
        assert decision.replicas == 4


# idle="sleep": a cold start of 60 s against a wake-up of 10 s at a tenth of the cost: break-even 500 s ahead.
SLEEPY = ScalingSettings(min_replicas=1, max_replicas=8, cold_start_s=60.0, downscale_delay_s=5.0, demand_headroom=1.0,
                         demand_grace_s=0.0, idle="sleep", wake_s=10.0, sleeping_cost=0.1)
IDLE_FOUR = [ReplicaLoad(seconds_per_group=2.0, sleeping=True)] * 4


def settle(settings: ScalingSettings, demands: list[Demand], start: float = 0.0, loads=IDLE_FOUR):
    """The pool's decision after a minute of ticks from 4 idle replicas (past every downscale delay)."""
    state: dict = {}
    current = 4
    for now in range(int(start), int(start) + 60):
        decision = decide(float(now), current, loads, demands, state=state, settings=settings)
        state, current = decision.state, decision.replicas
    return decision


def test_the_groups_expected_in_a_window_follow_the_profile():
    even = Demand("run-a", 100, starts_at=100.0, ends_at=200.0)
    assert even.groups_between(90.0, 110.0) == pytest.approx(10.0)
    assert even.groups_between(190.0, 250.0) == pytest.approx(10.0) and even.groups_between(0.0, 100.0) == 0.0
    crowded = dataclasses.replace(even, profile=(1.0, 1.0, 2.0, 6.0))  # 60% of them in its last quarter
    assert crowded.groups_between(100.0, 125.0) == pytest.approx(10.0)
    assert crowded.groups_between(170.0, 180.0) == pytest.approx(4.0 + 12.0)  # 5 s of each of the last two quarters
    assert crowded.groups_between(0.0, float("inf")) == pytest.approx(100.0)


def test_the_break_even_horizon_weighs_a_wake_up_against_a_cold_start():
    assert break_even_s(SLEEPY) == pytest.approx(500.0)
    assert break_even_s(dataclasses.replace(SLEEPY, wake_s=60.0)) == 0.0  # waking is no cheaper than starting
    assert break_even_s(dataclasses.replace(SLEEPY, sleeping_cost=0.5)) == pytest.approx(100.0)


def test_with_idle_sleep_a_replica_needed_again_within_the_break_even_horizon_is_kept_asleep_not_removed():
    # The next step, 300 s ahead (beyond a cold start, within the horizon), needs 4 replicas: 2 groups/s x 2 s.
    next_step = Demand("run-a", 120, starts_at=360.0, ends_at=420.0)
    kept = settle(SLEEPY, [next_step])
    assert kept.replicas == 4 and kept.kept_asleep == 4 and kept.sleeping == 4
    assert "asleep" in kept.reason
    # idle="stop": the same pool drops to min_replicas and starts them again a cold start ahead.
    stopped = settle(dataclasses.replace(SLEEPY, idle="stop"), [next_step])
    assert stopped.replicas == 1 and stopped.kept_asleep == 0


def test_with_idle_sleep_a_need_beyond_the_break_even_horizon_removes_the_replicas():
    far_step = Demand("run-a", 120, starts_at=700.0, ends_at=760.0)  # 640 s ahead and more: past 500 s
    assert settle(SLEEPY, [far_step]).replicas == 1
    assert settle(SLEEPY, []).replicas == 1  # nothing announced: removed as with idle="stop"


def test_the_kept_count_follows_the_announced_profile_and_never_exceeds_what_runs():
    # 100 groups in 100 s, but 90% of them in its last tenth: 9 groups/s x 2 s = 18 replicas' work there.
    crowded = Demand("run-a", 100, starts_at=300.0, ends_at=400.0, profile=(0.0,) * 8 + (0.1, 0.9))
    even = Demand("run-a", 100, starts_at=300.0, ends_at=400.0)  # 1 group/s x 2 s: 2 replicas
    assert settle(SLEEPY, [even]).replicas == 2
    assert settle(SLEEPY, [crowded]).replicas == 4  # what runs now (4), none started only to sleep


def test_sleeping_replicas_are_reported_and_counted():
    report = autoscaling_stats(ReplicaLoad(members_waiting=2, sleeping=True), [])
    assert report["sleeping"] == 1.0
    assert loads_of({"a": report, "b": autoscaling_stats(ReplicaLoad(), [])}) == [
        ReplicaLoad(members_waiting=2, sleeping=True), ReplicaLoad()]
    assert decide(0.0, 2, loads_of({"a": report})).sleeping == 1


def test_the_engine_work_meter_measures_busy_time_and_prices_the_queue():
    meter = EngineWorkMeter()
    assert meter.load(0.0, members_waiting=3) == ReplicaLoad(0, 0, 0.0, 3, None)
    meter.queued(100.0)
    meter.queued(100.0)
    meter.started(10.0)
    meter.started(10.0)
    meter.finished(12.0, 100.0, used_tokens=400.0)
    meter.finished(14.0, 100.0, used_tokens=400.0)
    meter.queued(300.0)  # idle from 14 to 50: not busy time
    load = meter.load(50.0, members_waiting=0)
    # Busy 4 s for 200 estimated tokens: 0.02 s per estimated token, so 300 queued are 6 s of work.
    assert load.groups_waiting == 1 and load.seconds_per_group == pytest.approx(2.0)
    assert load.queued_work_s == pytest.approx(6.0)
    assert meter.tokens_per_s(50.0) == pytest.approx(200.0)
    meter.withdrawn(300.0)
    assert meter.load(50.0, 0).queued_work_s == 0.0


def test_a_failed_group_teaches_nothing_about_cost():
    meter = EngineWorkMeter()
    meter.queued(50.0)
    meter.started(0.0)
    meter.finished(5.0, 50.0, used_tokens=None)
    assert meter.load(5.0, 0).seconds_per_group is None


def _series(value: float, at: float = 1.0) -> list:
    return [SimpleNamespace(timestamp=at - 1, value=-1.0), SimpleNamespace(timestamp=at, value=value)]


def test_the_serve_policy_reads_the_latest_reports_and_decides():
    reports = {
        "replica-a": autoscaling_stats(ReplicaLoad(20, 2, 30.0, 7, 1.5), [Demand("run-a", 60, 1000.0, 1060.0)]),
        "replica-b": autoscaling_stats(ReplicaLoad(0, 0, 0.0, 100, None), []),
    }
    assert loads_of(reports)[1] == ReplicaLoad(0, 0, 0.0, 100, None)
    # Reports carry tenants as numbers; the policy names those it has a cap for (the others: "#<hex>").
    assert demands_of(reports, now=1000.0, grace_s=5.0, tenants=("run-a",)) == [Demand("run-a", 60, 1000.0, 1060.0)]
    assert demands_of(reports, now=1066.0, grace_s=5.0) == []  # announced and never came: expired
    raw = {}
    for replica, report in reports.items():
        for key, value in report.items():
            raw.setdefault(key, {})[replica] = _series(value)
    policy = EngineWorkPolicy(min_replicas=1, max_replicas=8, target_backlog_s=10.0, upscale_delay_s=0.0,
                              default_seconds_per_group=1.0, demand_headroom=1.0, cold_start_s=30.0)
    context = SimpleNamespace(current_time=1000.0, target_num_replicas=1, current_num_replicas=1, raw_metrics=raw,
                              policy_state={}, total_queued_requests=0.0)
    replicas, state = policy(context)
    # 30 s of queued work at target 10 s: 3; the announced 1 group/s at 1.5 s each: 2. Waiting members: none.
    assert replicas == 3 and "queued engine work" in policy.last_reason
    assert isinstance(state, dict)


def test_of_a_tenants_announcements_the_latest_counts_wherever_kept_and_a_withdrawal_ends_them():
    earlier = Demand("run-a", 10, 100.0, 110.0, announced_at=90.0)
    later = Demand("run-a", 50, 200.0, 260.0, announced_at=95.0)  # the next step, announced ahead
    reports = {"a": autoscaling_stats(ReplicaLoad(), [earlier]), "b": autoscaling_stats(ReplicaLoad(), [later])}
    tenants = ("run-a", "run-b")
    assert demands_of(reports, now=150.0, grace_s=0.0, tenants=tenants) == [later]
    profiled = Demand("run-b", 40, 200.0, 260.0, announced_at=95.0, profile=(0.1, 0.3, 0.6))
    reports["d"] = autoscaling_stats(ReplicaLoad(), [profiled])  # its profile survives the flat report
    assert demands_of(reports, now=150.0, grace_s=0.0, tenants=tenants) == [later, profiled]
    del reports["d"]
    withdrawn = Demand("run-a", 0, 96.0, 96.0, announced_at=96.0)
    reports["c"] = autoscaling_stats(ReplicaLoad(), [withdrawn])
    assert demands_of(reports, now=150.0, grace_s=0.0, tenants=tenants) == []


def test_the_simulated_shared_pool_costs_less_than_a_pool_per_run_at_the_same_exposure():
    """bench/autoscaling_sim.py's model, small: two runs on the policy's elastic pool against one
    fixed pool each sized for its own end-of-phase burst."""
    import argparse
    import random

    from bench.autoscaling_sim import peak_sized
    from cluster.planning.pool_model import Run, simulate

    args = argparse.Namespace(gpus=32, seconds_per_group=1.5, cold_start_s=90.0)
    rng = random.Random(2)
    runs = [Run(f"run-{k}", offset_s=rng.uniform(0, 360), steps=3, groups=64, group_size=8, generation_s=120.0,
                training_s=240.0).build(rng) for k in range(2)]
    settings = ScalingSettings(max_replicas=32, target_backlog_s=10.0, downscale_delay_s=10.0, cold_start_s=90.0,
                               default_seconds_per_group=1.5, demand_grace_s=5.0, demand_headroom=1.5,
                               upscale_delay_s=0.0)
    fixed = peak_sized(runs, args)
    elastic = simulate(runs, lambda run: ("shared", 1), 1.5, 90.0, settings)
    assert fixed["size"] > 1
    assert elastic["replica_seconds"] < 0.5 * fixed["replica_seconds"]
    assert elastic["exposed_s_mean"] <= 1.05 * fixed["exposed_s_mean"]
    # Without the profiles (each phase announced evenly) the same headroom leaves the crowd unserved.
    for run in runs:
        run.announcements = [(at, dataclasses.replace(demand, profile=())) for at, demand in run.announcements]
    evenly = simulate(runs, lambda run: ("shared", 1), 1.5, 90.0, settings)
    assert evenly["exposed_s_mean"] > 1.5 * fixed["exposed_s_mean"]


def test_the_simulated_pool_with_idle_sleep_keeps_replicas_asleep_between_steps_and_scores_every_group():
    """bench/autoscaling_sim.py --idle sleep, small: one run; between its steps the pool keeps its
    replicas asleep (the next step is within the break-even horizon) instead of removing them."""
    import random

    from cluster.planning.pool_model import Run, simulate

    runs = [Run("run-0", offset_s=30.0, steps=3, groups=64, group_size=8, generation_s=120.0,
                training_s=240.0).build(random.Random(1))]
    settings = ScalingSettings(max_replicas=32, target_backlog_s=10.0, downscale_delay_s=10.0, cold_start_s=90.0,
                               default_seconds_per_group=1.5, demand_grace_s=5.0, demand_headroom=1.5)
    stopped = simulate(runs, lambda run: ("shared", 1), 1.5, 90.0, settings)
    asleep = simulate(runs, lambda run: ("shared", 1), 1.5, 90.0,
                      dataclasses.replace(settings, idle="sleep", wake_s=10.0, sleep_after_s=30.0))
    assert stopped["asleep_replica_seconds"] == 0.0
    assert asleep["asleep_replica_seconds"] > 0.25 * asleep["replica_seconds"]
    awake = asleep["replica_seconds"] - asleep["asleep_replica_seconds"]
    assert awake < stopped["replica_seconds"]  # no cold start between steps: fewer awake replica-seconds
    assert asleep["exposed_s_max"] < 30.0  # every group scored, none stranded behind a sleeping engine


def test_the_simulated_serve_default_policy_counts_waiting_members_and_waits_its_delays():
    """bench/autoscaling_sim.py's model of Serve's default policy (the baseline it is compared with)."""
    from cluster.planning.pool_model import ServeDefault

    policy, state = ServeDefault(target=10, upscale_delay_s=30.0, downscale_delay_s=300.0, look_back_s=1.0), {}
    # 45 members sent and unanswered (most only waiting for group-mates): 5 replicas wished, after 30 s.
    assert [policy.decide(now, 1, 45.0, state) for now in (0.0, 10.0, 29.0)] == [1, 1, 1]
    assert policy.decide(30.0, 1, 45.0, state) == 5
    assert policy.decide(31.0, 5, 45.0, state) == 5
    # Down only after the wish held 300 s; a wish for more in between starts the wait again.
    assert policy.decide(40.0, 5, 0.0, state) == 5
    assert policy.decide(200.0, 5, 100.0, state) == 5
    assert policy.decide(201.0, 5, 0.0, state) == 5 and policy.decide(500.0, 5, 0.0, state) == 5
    assert policy.decide(501.0, 5, 0.0, state) == 1


def test_the_simulated_shared_pool_costs_less_than_serves_default_policy_and_exposes_less():
    """bench/autoscaling_sim.py, small: two runs; Serve's default policy as grrm.yaml had it (target 64,
    up after 30 s, down after 300 s) reacts to the burst a cold start late and keeps its peak through
    training: at every target it exposes more and costs more than the project's pool; the lower the
    target, the less it exposes and the more it costs (still above the project's exposure at 5x its cost)."""
    import random

    from cluster.planning.pool_model import Run, ServeDefault, simulate

    rng = random.Random(2)
    runs = [Run(f"run-{k}", offset_s=rng.uniform(0, 360), steps=3, groups=64, group_size=8, generation_s=120.0,
                training_s=240.0).build(rng) for k in range(2)]
    settings = ScalingSettings(max_replicas=32, target_backlog_s=10.0, downscale_delay_s=10.0, cold_start_s=90.0,
                               default_seconds_per_group=1.5, demand_grace_s=5.0, demand_headroom=1.5)
    elastic = simulate(runs, lambda run: ("shared", 1), 1.5, 90.0, settings)
    serve = {target: simulate(runs, lambda run: ("shared", 1), 1.5, 90.0, None,
                              ServeDefault(target=target, max_replicas=32)) for target in (64, 16, 4)}
    assert all(result["replica_seconds"] > elastic["replica_seconds"] for result in serve.values())
    assert all(result["exposed_s_mean"] > 1.2 * elastic["exposed_s_mean"] for result in serve.values())
    assert serve[64]["exposed_s_mean"] > serve[16]["exposed_s_mean"] > serve[4]["exposed_s_mean"]
    assert serve[4]["replica_seconds"] > 5 * elastic["replica_seconds"]


def _raw(reports: dict[str, dict[str, float]]) -> dict:
    """Serve's raw metrics (key -> replica -> time series) of flat reports."""
    raw: dict = {}
    for replica, report in reports.items():
        for key, value in report.items():
            raw.setdefault(key, {})[replica] = _series(value)
    return raw


def test_the_application_policy_starts_an_empty_scorer_pool_for_what_its_ingress_was_told_and_keeps_the_rest():
    """At 0 scorer replicas nobody in the scorer deployment reports: the announcement the ingress took
    (its own report) is what grows the pool a cold start before the phase, and back once withdrawn."""
    settings = dict(min_replicas=0, max_replicas=8, default_seconds_per_group=1.0, demand_headroom=1.0,
                    cold_start_s=30.0, upscale_delay_s=0.0, downscale_delay_s=0.0, demand_grace_s=0.0)
    scorer_config = SimpleNamespace(policy=SimpleNamespace(policy_function=POLICY_PATH, policy_kwargs=settings))
    ingress_config = SimpleNamespace(policy=SimpleNamespace(policy_function="ray.serve.autoscaling_policy:default",
                                                            policy_kwargs={}))
    policy = ApplicationEngineWorkPolicy()

    def decide(now: float, ingress_reports: dict, scorers: int = 0) -> dict:
        contexts = {
            "scorer": SimpleNamespace(current_time=now, target_num_replicas=scorers, current_num_replicas=scorers,
                                      raw_metrics={}, policy_state={}, total_queued_requests=0.0, config=scorer_config),
            "ingress": SimpleNamespace(current_time=now, target_num_replicas=2, current_num_replicas=2,
                                       raw_metrics=_raw(ingress_reports), policy_state={"kept": 1},
                                       total_queued_requests=0.0, config=ingress_config),
        }
        decisions, states = policy(contexts)
        assert states["ingress"] == {"kept": 1}
        return decisions

    # Nothing announced: the pool stays empty, the ingress at its size.
    assert decide(1000.0, {}) == {"scorer": 0, "ingress": 2}
    # 120 groups over 60 s (2 a second, 1 s each: 2 replicas), starting in 100 s: not yet (cold start 30 s) ...
    announced = {"ingress-1": demand_stats([Demand("run-a", 120, 1100.0, 1160.0, announced_at=1000.0)])}
    assert decide(1000.0, announced)["scorer"] == 0
    # ... but a cold start before it, without a member sent or a scorer replica to report it.
    assert decide(1075.0, announced)["scorer"] == 2
    # The other ingress replica took the tenant's withdrawal later: it wins, and the pool empties.
    announced["ingress-2"] = demand_stats([Demand("run-a", 0, 1080.0, 1080.0, announced_at=1080.0)])
    assert decide(1085.0, announced, scorers=2)["scorer"] == 0


def test_announcements_kept_are_the_latest_per_tenant_and_are_forgotten_once_over():
    book = AnnouncedDemands()
    announcement = DemandAnnouncement(tenant="run-a", groups=40, starts_in_s=20, lasts_s=10, profile=[0.2, 0.8])
    book.keep(demand_of(announcement, now=1000.0))
    assert book.current(1000.0, grace_s=5.0) == [Demand("run-a", 40, 1020.0, 1030.0, 1000.0, (0.2, 0.8))]
    book.keep(Demand("run-a", 10, 990.0, 995.0, announced_at=990.0))  # an older copy handed on: ignored
    assert [demand.groups for demand in book] == [40]
    withdrawal = demand_of(DemandAnnouncement(tenant="run-a", groups=0, lasts_s=1), now=1001.0)
    assert (withdrawal.groups, withdrawal.ends_at) == (0, 1001.0)
    book.keep(withdrawal)
    assert book.current(1002.0, grace_s=5.0) == [withdrawal]  # kept: it outweighs older copies elsewhere
    assert book.current(1001.0 + WITHDRAWAL_KEPT_S + 1, grace_s=5.0) == []
    book.keep(demand_of(announcement, now=2000.0))  # announced and never came: forgotten 5 s after its end
    assert len(book.current(2035.0, grace_s=5.0)) == 1
    assert book.current(2035.1, grace_s=5.0) == [] and len(book) == 0


def test_the_ingress_copies_announced_work_to_a_pool_that_may_empty_when_its_phase_starts_as_then_seen():
    later = DemandAnnouncement(tenant="run-a", groups=40, starts_in_s=24, lasts_s=8)
    withdrawal = DemandAnnouncement(tenant="run-a", groups=0, lasts_s=1)
    assert copy_delay_s(later, pool_may_empty=False) == 0.0  # a pool that never empties: at once
    assert copy_delay_s(later, pool_may_empty=True) == 24.0  # else when the phase starts
    assert copy_delay_s(withdrawal, pool_may_empty=True) == 0.0
    seen = seen_later(later, 24.0)
    assert (seen.starts_in_s, seen.lasts_s, seen.groups) == (0.0, 8.0, 40)
    assert (seen_later(later, 10.0).starts_in_s, seen_later(later, 27.0).lasts_s) == (14.0, 5.0)
    assert seen_later(later, 32.0) is None  # over: nothing to hand on
    assert seen_later(withdrawal, 100.0) == withdrawal
