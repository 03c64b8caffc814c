"""Fair share of an engine among tenants (cluster/fair_share.py): virtual token counters and the
asyncio gate, in milliseconds."""

from __future__ import annotations

import asyncio

import pytest

from cluster.fair_share import FairGate, TenantPolicy, VirtualTokenCounters


def drain(counters: VirtualTokenCounters, cost: float = 10.0) -> list[str]:
    """Serve every waiting group one at a time, each costing ``cost`` tokens; the tenants in order."""
    order = []
    while (entry := counters.next()) is not None:
        counters.finish(entry.tenant)
        order.append(entry.tenant)
    return order


def test_the_least_served_tenant_goes_next_and_a_flood_does_not_starve_a_small_run():
    counters = VirtualTokenCounters()
    for _ in range(20):
        counters.arrive("flood", 10)
    for _ in range(3):
        counters.arrive("small", 10)
    order = drain(counters)
    # Interleaved from the start: the small run's 3 groups are among the first 6, not after 20.
    assert [i for i, tenant in enumerate(order) if tenant == "small"] == [1, 3, 5]


def test_weights_share_in_proportion_and_priority_classes_go_first():
    policies = {"a": TenantPolicy(weight=1), "b": TenantPolicy(weight=1), "c": TenantPolicy(weight=2),
                "eval": TenantPolicy(weight=10, priority=-1)}
    counters = VirtualTokenCounters(lambda tenant: policies[tenant])
    for tenant in ("a", "b", "c", "eval"):
        for _ in range(100):  # all backlogged through the first 120 picks
            counters.arrive(tenant, 10)
    served = drain(counters)[:120]
    shares = {tenant: served.count(tenant) / 120 for tenant in ("a", "b", "c")}
    assert shares == pytest.approx({"a": 0.25, "b": 0.25, "c": 0.5}, abs=0.02)
    assert "eval" not in served[:120]  # the lower class waits while training groups wait


def test_a_returning_idle_tenant_banks_no_credit():
    counters = VirtualTokenCounters()
    for _ in range(10):
        counters.arrive("busy", 10)
    drain(counters)  # busy has 100 tokens of service; "late" had none, but was idle all along
    counters.arrive("busy", 10)
    counters.arrive("late", 10)
    assert counters.counters["late"] == counters.counters["busy"] == 100
    for _ in range(5):
        counters.arrive("late", 10)
        counters.arrive("busy", 10)
    order = drain(counters)
    # Level from the start: alternating (ties go to the earlier group), never one tenant 3 in a row.
    assert order.count("late") == order.count("busy") == 6
    assert all(len(set(order[i:i + 3])) == 2 for i in range(len(order) - 2)), order


def test_the_gate_is_work_conserving_and_charges_what_a_group_really_cost():
    async def scenario():
        gate: FairGate[int] = FairGate(slots=2)
        started: list[str] = []

        async def group(tenant: str, answer_tokens: int) -> int:
            started.append(tenant)
            await asyncio.sleep(0.01)
            return 10 + answer_tokens

        # A tenant alone gets every slot at once.
        alone = await asyncio.gather(*(gate.run("solo", 10, lambda: group("solo", 5), float) for _ in range(2)))
        assert [waited for _, waited in alone] == pytest.approx([0, 0], abs=0.005)
        assert gate.counters.counters["solo"] == 30  # 2 groups of 10 prompt + 5 answer tokens
        stats = gate.stats()["solo"]
        assert (stats.waiting, stats.running, stats.recent_groups, stats.recent_tokens) == (0, 0, 2, 30)

    asyncio.run(scenario())


def test_first_come_first_served_when_disabled_and_a_cancelled_waiter_leaves_its_place():
    async def scenario():
        gate: FairGate[int] = FairGate(slots=1, enabled=False)
        order: list[str] = []
        release = asyncio.Event()

        async def group(tenant: str) -> int:
            order.append(tenant)
            if tenant == "first":
                await release.wait()
            return 1

        first = asyncio.create_task(gate.run("first", 1, lambda: group("first"), float))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(gate.run(t, 1, lambda t=t: group(t), float)) for t in ("flood", "flood", "small")]
        gone = asyncio.create_task(gate.run("gone", 1, lambda: group("gone"), float))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        await asyncio.gather(first, *tasks)
        assert order == ["first", "flood", "flood", "small"]
        assert gate.counters.waiting.get("gone", []) == [] or not gate.counters.waiting["gone"]

    asyncio.run(scenario())


def test_slots_must_be_positive():
    with pytest.raises(ValueError, match="slots: must be at least 1"):
        FairGate(slots=0)


def test_a_tenant_idle_for_a_whole_window_is_forgotten():
    async def scenario():
        now = [0.0]
        gate: FairGate[int] = FairGate(slots=1, window_s=60, clock=lambda: now[0])

        async def group() -> int:
            return 20

        for index in range(100):  # a sweep of many short runs
            await gate.run(f"run-{index}", 10, group, float)
        assert len(gate.stats()) == 100
        now[0] = 61.0
        await gate.run("still-here", 10, group, float)
        assert set(gate.stats()) == {"still-here"}
        assert set(gate.counters.counters) <= {"still-here"}

    asyncio.run(scenario())


def test_a_tenant_back_from_idle_goes_ahead_by_its_credit_once_not_every_time():
    counters = VirtualTokenCounters(return_credit=20)
    for _ in range(20):
        counters.arrive("flood", 10)
    for _ in range(2):
        counters.next()  # the flood got 20 tokens of service while "small" was idle
    for _ in range(3):
        counters.arrive("small", 10)
    assert counters.counters["small"] == 0  # lifted to 20 - 20, never below its own 0
    order = drain(counters)
    # Its credit (two groups' worth) puts its first two ahead, then it shares: small, small, flood, small.
    assert order[:4] == ["small", "small", "flood", "small"], order
    # A tenant that sends one group at a time is back from idle before each: the credit does not add
    # up (its own counter keeps its service), so beside a backlogged flood it gets half, not all.
    counters = VirtualTokenCounters(return_credit=20)
    for _ in range(40):
        counters.arrive("flood", 10)
    order = []
    for _ in range(30):
        if not counters.active("closed-loop"):
            counters.arrive("closed-loop", 10)
        entry = counters.next()
        counters.finish(entry.tenant)
        order.append(entry.tenant)
    assert 15 <= order.count("closed-loop") <= 17, order


def test_reserved_slots_keep_a_lower_class_off_the_last_slot_while_a_higher_one_is_active():
    async def scenario():
        now = [0.0]
        policies = {"train": TenantPolicy(priority=0), "eval": TenantPolicy(priority=-1)}
        gate: FairGate[int] = FairGate(slots=2, policy=lambda tenant: policies[tenant], reserved_slots=1,
                                       window_s=60, clock=lambda: now[0])
        release = {tenant: asyncio.Event() for tenant in ("train", "eval")}
        running: list[str] = []

        async def group(tenant: str) -> int:
            running.append(tenant)
            await release[tenant].wait()
            running.remove(tenant)
            return 10

        # No higher class has been seen: the evaluation alone may use both slots (work-conserving).
        evals = [asyncio.create_task(gate.run("eval", 10, lambda: group("eval"), float)) for _ in range(4)]
        await asyncio.sleep(0)
        assert running == ["eval", "eval"]
        release["eval"].set()
        await asyncio.gather(*evals)
        release["eval"].clear()
        # Training sent a group: from now on evaluation leaves one slot free for it.
        trained = asyncio.create_task(gate.run("train", 10, lambda: group("train"), float))
        await asyncio.sleep(0)
        release["train"].set()
        await trained
        release["train"].clear()
        evals = [asyncio.create_task(gate.run("eval", 10, lambda: group("eval"), float)) for _ in range(4)]
        await asyncio.sleep(0)
        assert running == ["eval"]  # one slot left free
        trained = asyncio.create_task(gate.run("train", 10, lambda: group("train"), float))
        await asyncio.sleep(0)
        assert sorted(running) == ["eval", "train"]  # training's group starts at once
        release["train"].set()
        await trained
        # A whole window without training: the evaluation gets both slots again.
        now[0] = 61.0
        release["eval"].set()
        await asyncio.gather(*evals)

    asyncio.run(scenario())
