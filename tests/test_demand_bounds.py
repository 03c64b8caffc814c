"""A shared pool that no tenant can take down or run up (issue 47), without Ray: what the keepers of
announced demand report is bounded whatever the number of tenants (cluster/demand_report.py), a
withdrawal frees its state, a keeper's book is bounded, and each tenant's announced demand is capped."""

from __future__ import annotations

import dataclasses
import json
import random
from types import SimpleNamespace

import pytest

from cluster.announced_demand import MAX_KEPT_TENANTS, WITHDRAWAL_KEPT_S, AnnouncedDemands, demand_of
from cluster.autoscaling import (
    OTHER_TENANTS,
    Demand,
    ReplicaLoad,
    ScalingSettings,
    decide_replicas,
    replicas_for_demand,
)
from cluster.demand_report import (
    MAX_REPORT_KEYS,
    REPORTED_TENANTS,
    DemandReader,
    report_demands,
    reported_groups,
)
from cluster.engines import EngineConfig
from cluster.protocol.schema import DemandAnnouncement
from deployments.app import replica_options
from deployments.autoscaling_policy import (
    POLICY_PATH,
    ApplicationEngineWorkPolicy,
    EngineWorkPolicy,
    autoscaling_stats,
    demand_stats,
)
from deployments.config import AppConfig

NOW = 10_000.0
GRACE_S = 10.0


def crowded_profile(rng: random.Random) -> tuple[float, ...]:
    """64 slices crowding the phase's end, as a GRPO phase's groups of 8 do, with some noise."""
    return tuple((((k + 1) / 64) ** 8 - (k / 64) ** 8) * rng.uniform(0.8, 1.2) for k in range(64))


def tenants_announcing(count: int, seed: int = 7) -> list[Demand]:
    """``count`` tenants' phases, starting within the next 400 s (some on now), 64-slice profiles each."""
    rng = random.Random(seed)
    demands = []
    for k in range(count):
        starts_at = NOW + rng.uniform(-100, 400)
        demands.append(Demand(f"run-{k}", rng.randint(5, 200), starts_at, starts_at + rng.uniform(60, 300),
                              announced_at=NOW - 1, profile=crowded_profile(rng)))
    return demands


def _raw(reports: dict[str, dict[str, float]]) -> dict:
    """Serve's raw metrics (key -> replica -> time series) of flat reports."""
    raw: dict = {}
    for replica, report in reports.items():
        for key, value in report.items():
            raw.setdefault(key, {})[replica] = [SimpleNamespace(timestamp=1.0, value=value)]
    return raw


def _context(now: float, reports: dict[str, dict[str, float]], current: int = 0, config=None):
    return SimpleNamespace(current_time=now, target_num_replicas=current, current_num_replicas=current,
                           raw_metrics=_raw(reports), policy_state={}, total_queued_requests=0.0, config=config)


def test_a_report_holds_a_fixed_set_of_keys_whatever_the_number_of_tenants():
    """1,000 tenants with 64-slice profiles took Serve's controller to 87% CPU at 68 keys each: now a report
    has the same keys for 20 tenants as for 1,000, and at most MAX_REPORT_KEYS of them."""
    book = AnnouncedDemands()
    for demand in tenants_announcing(1000):
        book.keep(demand)
    many = demand_stats(book.current(NOW, GRACE_S), NOW, GRACE_S)  # the ingress's report
    few = autoscaling_stats(ReplicaLoad(), tenants_announcing(20), NOW, GRACE_S)  # a scorer replica's
    assert len(many) <= MAX_REPORT_KEYS < 1000
    assert set(many) < set(few) and set(few) - set(many) == {
        "groups_waiting", "groups_running", "queued_work_s", "members_waiting", "sleeping", "saturated"}  # and its load
    assert len(demand_stats(tenants_announcing(2), NOW)) < len(many)  # a few tenants: only theirs
    # The largest announcements are there whole, the rest merged into one demand.
    kept = book.current(NOW, GRACE_S)  # those not over yet
    demands = DemandReader(f"run-{k}" for k in range(1000)).demands([[many]], NOW, GRACE_S)
    largest = sorted(kept, key=lambda demand: demand.peak_rate(demand.starts_at, demand.ends_at), reverse=True)
    assert demands[:REPORTED_TENANTS] == largest[:REPORTED_TENANTS]
    [merged] = demands[REPORTED_TENANTS:]
    assert (merged.tenant, merged.tenants) == (OTHER_TENANTS, len(kept) - REPORTED_TENANTS)


@pytest.mark.parametrize("seed", [7, 8])
def test_the_policy_asks_from_a_bounded_report_about_what_it_asks_from_every_tenant(seed):
    """Documented near-same (cluster/demand_report.py): never fewer replicas than from every tenant one by
    one, and at most 10% more (the merged tail looks up to a slice, 4.7 s, further ahead, and counts a phase
    from its start rather than from a backlog's worth of work). The ingress and a scorer replica holding
    copies of the same announcements count once."""
    settings = ScalingSettings(min_replicas=0, max_replicas=100_000, cold_start_s=60.0, demand_grace_s=GRACE_S,
                               upscale_delay_s=0.0)
    loads = [ReplicaLoad(seconds_per_group=1.0)]
    everyone = tenants_announcing(1000, seed)
    for later in (0.0, 30.0, 60.0, 120.0, 200.0, 300.0):
        now = NOW + later
        kept = [demand for demand in everyone if demand.ends_at + GRACE_S >= now]
        reported = DemandReader().demands([[report_demands(kept, now, GRACE_S)]], now, GRACE_S)
        full = decide_replicas(now=now, current=0, loads=loads, demands=kept, settings=settings)
        bounded = decide_replicas(now=now, current=0, loads=loads, demands=reported, settings=settings)
        assert full.for_demand > 100
        assert full.for_demand <= bounded.for_demand <= 1.1 * full.for_demand, (later, full, bounded)
        assert bounded.replicas == bounded.for_demand
    copies = [dataclasses.replace(demand, announced_at=demand.announced_at + 0.5) for demand in kept]
    both = DemandReader().demands([[report_demands(copies, now, GRACE_S)], [report_demands(kept, now, GRACE_S)]],
                                  now, GRACE_S)
    assert replicas_for_demand(both, now, 1.0, settings) == bounded.for_demand


def test_a_withdrawal_frees_the_tenants_state_and_still_cancels_an_older_copy_elsewhere():
    """Two ingress replicas and a scorer replica: the announcement went to one ingress (and its copy to the
    scorer), the withdrawal to the other. The withdrawing keeper keeps it bare for a minute; the policy,
    which reads every keeper, remembers it while an older copy is reported."""
    announcement = DemandAnnouncement(tenant="run-a", groups=480, starts_in_s=50, lasts_s=120, profile=[0.4, 0.6])
    ingress_1, scorer, ingress_2 = AnnouncedDemands(), AnnouncedDemands(), AnnouncedDemands()
    ingress_1.keep(demand_of(announcement, 1000.0))
    scorer.keep(demand_of(announcement, 1000.5))  # the copy, stamped on the scorer's arrival
    ingress_2.keep(demand_of(announcement, 1001.0))  # a retry the other ingress took
    ingress_2.keep(demand_of(DemandAnnouncement(tenant="run-a", groups=0, lasts_s=1), 1080.0))
    # The withdrawing keeper holds no more than who withdrew and when, and reports just that.
    assert ingress_2.current(1081.0, GRACE_S) == [Demand("run-a", 0, 1080.0, 1080.0, announced_at=1080.0)]
    assert reported_groups(demand_stats(ingress_2.current(1081.0, GRACE_S), 1081.0), "run-a") == 0.0

    settings = dict(min_replicas=0, max_replicas=8, default_seconds_per_group=1.0, demand_headroom=1.0,
                    cold_start_s=30.0, upscale_delay_s=0.0, downscale_delay_s=0.0, demand_grace_s=GRACE_S)
    scorer_config = SimpleNamespace(policy=SimpleNamespace(policy_function=POLICY_PATH, policy_kwargs=settings))
    ingress_config = SimpleNamespace(policy=SimpleNamespace(policy_function="ray.serve.autoscaling_policy:default",
                                                            policy_kwargs={}))
    policy = ApplicationEngineWorkPolicy()

    def scorers_wanted(now: float, keepers_now: dict[str, AnnouncedDemands], current: int = 2) -> int:
        report = {name: demand_stats(book.current(now, GRACE_S), now, GRACE_S) for name, book in keepers_now.items()}
        scorers = {name: report.pop(name) for name in [name for name in report if name.startswith("scorer")]}
        contexts = {"scorer": _context(now, scorers, current, scorer_config),
                    "ingress": _context(now, report, 2, ingress_config)}
        return policy(contexts)[0]["scorer"]

    keepers = {"ingress-1": ingress_1, "ingress-2": ingress_2, "scorer-1": scorer}
    # Before the withdrawal its first half (192 groups in 60 s, at 1 s each) wants 4 replicas a cold start ahead.
    assert scorers_wanted(1075.0, {"ingress-1": ingress_1, "scorer-1": scorer}) == 4
    assert scorers_wanted(1085.0, keepers) == 0  # the withdrawal wins over both older copies
    # A minute later the withdrawing ingress has forgotten it: its book is empty, its report has no entry.
    forgotten = 1080.0 + WITHDRAWAL_KEPT_S + 1
    assert ingress_2.current(forgotten, GRACE_S) == [] and len(ingress_2) == 0
    assert demand_stats(ingress_2.current(forgotten, GRACE_S), forgotten) == {"demand/entries": 0.0}
    # The older copies on the other keepers are still reported, and still cancelled (the policy remembers) ...
    assert reported_groups(demand_stats(ingress_1.current(forgotten, GRACE_S), forgotten), "run-a") == 480.0
    assert scorers_wanted(forgotten, keepers) == 0
    [reader] = [engine_work.demand_reader for engine_work in policy.policies.values()]
    assert list(reader.withdrawn.values()) == [(1080.0, 1170.5 + GRACE_S)]  # until the latest copy expires
    # ... which a restarted controller does not: they count until their phase ends (within their cap).
    restarted = DemandReader()
    older = [demand_stats(book.current(forgotten, GRACE_S), forgotten) for book in (ingress_1, scorer)]
    assert [demand.groups for demand in restarted.demands([older], forgotten, GRACE_S)] == [480]
    # Once those copies have expired, the policy forgets the withdrawal too.
    scorers_wanted(1170.5 + GRACE_S + 1, keepers)
    assert reader.withdrawn == {}


def test_ten_thousand_names_keep_the_book_bounded_withdrawals_and_the_soonest_to_end_going_first():
    book = AnnouncedDemands()
    for k in range(10_000):
        book.keep(Demand(f"run-{k}", 10, NOW, NOW + 60 + k, announced_at=NOW))
    assert len(book) == MAX_KEPT_TENANTS
    # Each newcomer took the place of the one ending soonest: the latest-ending ones are kept.
    assert sorted(demand.ends_at for demand in book)[0] == NOW + 60 + 10_000 - MAX_KEPT_TENANTS
    # A withdrawal goes before announced work; one announcing work that ends sooner than all kept is not kept.
    book.keep(Demand("leaving", 0, NOW, NOW, announced_at=NOW + 1))
    book.keep(Demand("late-run", 10, NOW, NOW + 100_000, announced_at=NOW + 2))
    assert "leaving" not in book.tenants() and "late-run" in book.tenants() and len(book) == MAX_KEPT_TENANTS
    book.keep(Demand("short-run", 10, NOW, NOW + 1, announced_at=NOW + 3))
    assert "short-run" not in book.tenants()
    # A tenant already kept is replaced in place, never evicted for its own later announcement.
    book.keep(Demand("late-run", 20, NOW, NOW + 1, announced_at=NOW + 4))
    assert [demand.groups for demand in book if demand.tenant == "late-run"] == [20]
    small = AnnouncedDemands(max_tenants=2)
    small.keep(Demand("a", 0, NOW, NOW, announced_at=NOW))
    small.keep(Demand("b", 10, NOW, NOW + 10, announced_at=NOW))
    small.keep(Demand("c", 10, NOW, NOW + 5, announced_at=NOW))
    assert small.tenants() == ["b", "c"]  # the withdrawal went first, though "c" ends sooner than "b"


FLOOD = Demand("flood", 10_000_000, NOW, NOW + 86_400, announced_at=NOW)  # the issue's: a day of it
STEP = Demand("run-b", 60, NOW, NOW + 60, announced_at=NOW)  # 1 group/s at 1 s each, headroom 1: 1 replica


def test_one_tenants_announced_demand_claims_its_share_and_the_others_add_theirs():
    capped = ScalingSettings(max_replicas=4, demand_headroom=1.0, upscale_delay_s=0.0, max_announced_replicas=2)
    assert replicas_for_demand([FLOOD], NOW, 1.0, ScalingSettings(max_replicas=4)) > 4  # uncapped: the whole pool
    assert replicas_for_demand([FLOOD], NOW, 1.0, capped) == 2
    assert replicas_for_demand([FLOOD, STEP], NOW, 1.0, capped) == 3
    decision = decide_replicas(now=NOW, current=1, loads=[ReplicaLoad(seconds_per_group=1.0)], demands=[FLOOD],
                               settings=capped)
    assert (decision.for_demand, decision.replicas) == (2, 2)
    # A tenant's own cap raises or lowers it; the pool's max_replicas still bounds the total.
    for own, wanted in ((3, 3), (1, 1), (8, 8)):
        settings = ScalingSettings(max_replicas=16, demand_headroom=1.0, max_announced_replicas=2,
                                   tenant_max_announced_replicas=(("flood", own),))
        assert replicas_for_demand([FLOOD], NOW, 1.0, settings) == wanted
        assert replicas_for_demand([FLOOD, STEP], NOW, 1.0, settings) == wanted + 1
    # Tenants merged in a report's tail count at the default cap each.
    merged = Demand(OTHER_TENANTS, 10_000_000, NOW, NOW + 600, tenants=3)
    assert replicas_for_demand([merged], NOW, 1.0, capped) == 6


def test_the_caps_arrive_from_the_app_config_through_serves_policy_kwargs():
    config = AppConfig.model_validate({
        "engine": {"kind": "scripted"},
        "replicas": {"autoscaling": {"min_replicas": 0, "max_replicas": 4, "upscale_delay_s": 0,
                                     "demand_headroom": 1.0, "default_seconds_per_group": 1.0}},
        "http": {"tenants": [{"name": "big", "max_announced_replicas": 3}, {"name": "small",
                                                                          "max_announced_replicas": 1}]},
    })
    kwargs = replica_options(config)["autoscaling_config"]["policy"]["policy_kwargs"]
    assert kwargs["max_announced_replicas"] == 2  # None: half of max_replicas
    kwargs = json.loads(json.dumps(kwargs))  # Serve checks that they are JSON; pairs may come back as lists
    policy = EngineWorkPolicy(**kwargs)

    def wanted(tenant: str) -> int:
        flood = Demand(tenant, 10_000_000, NOW, NOW + 86_400, announced_at=NOW)
        return policy.decide(_context(NOW, {"scorer-1": autoscaling_stats(ReplicaLoad(), [flood], NOW)}, 1))[0]

    assert [wanted(tenant) for tenant in ("anyone", "big", "small")] == [2, 3, 1]
    # tenants.default sets every other tenant's cap; at least one replica where max_replicas is 1.
    config = AppConfig.model_validate({"engine": {"kind": "scripted"}, "replicas": {"autoscaling": {}},
                                       "tenants": {"default": {"max_announced_replicas": 5}}})
    assert replica_options(config)["autoscaling_config"]["policy"]["policy_kwargs"]["max_announced_replicas"] == 5
    one = AppConfig(engine=EngineConfig(kind="scripted"), replicas={"autoscaling": {"max_replicas": 1}})
    assert one.replicas.autoscaling.scaling_settings().max_announced_replicas == 1
