"""`engine.scheduling`: the largest waiting group first while the engine is saturated.

Pure: the priority semaphore behind the scripted engine's capacity. Through the scorer: groups
scored concurrently on an engine with one slot finish in the order the policy says. (vLLM's own
priority scheduler is exercised in tests/engines/test_vllm_engine.py.)
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from cluster.config import ScoringConfig
from cluster.engines import EngineConfig, ScriptedEngineOptions, make_engine
from cluster.engines.vllm import engine_args_kwargs
from cluster.protocol.schema import GroupRequest
from cluster.scorer import GroupScorer
from simulated.slots import PrioritySlots


async def served_order(slots: PrioritySlots, priorities: list[int]) -> list[int]:
    """Hold the only slot, queue waiters with these priorities, release: the order they got it."""
    order: list[int] = []
    release = asyncio.Event()

    async def first() -> None:
        async with slots.hold():
            await release.wait()

    async def waiter(index: int) -> None:
        async with slots.hold(priorities[index]):
            order.append(index)

    holder = asyncio.ensure_future(first())
    await asyncio.sleep(0)
    waiters = [asyncio.ensure_future(waiter(index)) for index in range(len(priorities))]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, *waiters)
    return order


async def test_waiters_are_served_lowest_priority_first_then_first_come():
    assert await served_order(PrioritySlots(1), [5, -10, 0, -10]) == [1, 3, 2, 0]
    assert await served_order(PrioritySlots(1), [0, 0, 0]) == [0, 1, 2]


async def test_a_cancelled_waiter_loses_no_slot():
    slots = PrioritySlots(1)
    release = asyncio.Event()

    async def holder() -> None:
        async with slots.hold():
            await release.wait()

    held = asyncio.ensure_future(holder())
    await asyncio.sleep(0)
    cancelled = asyncio.ensure_future(slots.hold(-1).__aenter__())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    release.set()
    await held
    async with slots.hold():  # the slot came back: this does not wait
        assert slots.waiting == 0


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="limit"):
        PrioritySlots(0)


def group(group_id: str, candidates: int) -> GroupRequest:
    return GroupRequest(group_id=group_id, source="The cat sat on the mat.", src_lang="en", trg_lang="de",
                        candidates=[f"Die Katze sass auf der Matte, Variante {k} [q={k % 10}]" for k in range(candidates)])


async def finish_order(scheduling: str) -> list[str]:
    engine = make_engine(EngineConfig(kind="scripted", scheduling=scheduling,
                                      scripted=ScriptedEngineOptions(per_prompt_s=0.05, max_concurrent_prompts=1)))
    await engine.start()
    scorer = GroupScorer(engine, ScoringConfig(), replica="r0")
    finished: list[str] = []

    async def score(request: GroupRequest, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        result = await scorer.score_group(request)
        assert result.valid, result
        finished.append(request.group_id)

    # `busy` takes the engine's one slot; `small` then `large` complete while it runs and wait.
    await asyncio.gather(score(group("busy", 2), 0), score(group("small", 2), 0.01), score(group("large", 8), 0.02))
    return finished


async def test_the_largest_waiting_group_is_scored_first_with_largest_first():
    assert await finish_order("largest_first") == ["busy", "large", "small"]


async def test_first_come_first_served_by_default():
    assert await finish_order("fifo") == ["busy", "small", "large"]


def test_vllm_gets_its_priority_scheduler_and_other_engines_refuse_the_setting():
    assert engine_args_kwargs(EngineConfig(model="m", scheduling="largest_first"))["scheduling_policy"] == "priority"
    assert "scheduling_policy" not in engine_args_kwargs(EngineConfig(model="m"))
    with pytest.raises(ValidationError, match="engine.scheduling"):
        EngineConfig(kind="transformers", model="m", scheduling="largest_first")
    with pytest.raises(ValidationError, match="engine_kwargs.scheduling_policy: set engine.scheduling"):
        EngineConfig(model="m", scheduling="largest_first", engine_kwargs={"scheduling_policy": "fcfs"})
