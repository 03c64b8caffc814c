"""Hang detection: an engine counts as hung after ``hang_probes`` checks in a row find no answer to its
probe (``cluster/hang_watch.py``), and the replica keeps one probe out at a time
(``deployments/engine_probe.py``). The engine here answers when the test says so: no outcome depends on
how long anything takes."""

from __future__ import annotations

import asyncio

import pytest

from cluster.engines import EngineDeadError
from cluster.hang_watch import HangWatch
from deployments.engine_probe import EngineProbe

# Each check waits this long for the engine; the engine below answers only when released, so a check
# before the release always misses and a check after it always finds the answer.
CHECK_S = 0.01


def test_probes_missed_in_a_row_make_a_hang_and_an_answer_starts_the_count_again():
    watch = HangWatch(probes=3)
    assert not watch.missed() and not watch.missed()
    watch.answered()  # a late engine, not a hung one
    assert watch.consecutive_misses == 0 and watch.recovered_total == 1
    assert not watch.missed() and not watch.missed()
    assert watch.missed() and watch.hung
    assert watch.as_dict() == {"hang_probes": 3, "consecutive_misses": 3, "missed_total": 5, "recovered_total": 1}


def test_one_probe_is_the_old_behaviour_a_single_miss_is_a_hang():
    assert HangWatch(probes=1).missed()


def test_an_answer_without_misses_is_no_recovery():
    watch = HangWatch(probes=2)
    watch.answered()
    assert watch.recovered_total == 0 and not watch.hung


def test_probes_below_one_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="probes"):
        HangWatch(probes=0)


class HeldEngine:
    """An engine whose health probes answer once released (or raise once killed); counts the probes."""

    name = "held"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.dead = False
        self.probes_started = 0
        self.probes_cancelled = 0

    async def check_health(self) -> None:
        self.probes_started += 1
        if self.dead:
            raise EngineDeadError("the held engine died")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.probes_cancelled += 1
            raise


async def test_a_late_probe_is_waited_on_again_not_piled_up_and_its_answer_resets_the_count():
    engine = HeldEngine()
    misses = []
    probe = EngineProbe(engine, CHECK_S, hang_probes=3, on_miss=lambda: misses.append(1))
    await probe.check()
    await probe.check()  # two misses: not yet hung
    assert engine.probes_started == 1 and probe.watch.consecutive_misses == 2 and len(misses) == 2
    engine.release.set()
    await probe.check()  # the same probe answered: the count starts again
    assert probe.watch.consecutive_misses == 0 and probe.watch.recovered_total == 1
    await probe.check()  # a new probe, answered at once
    assert engine.probes_started == 2 and probe.watch.missed_total == 2


async def test_hang_probes_checks_in_a_row_without_an_answer_are_a_hang_and_the_probe_is_cancelled():
    engine = HeldEngine()
    probe = EngineProbe(engine, CHECK_S, hang_probes=2)
    await probe.check()
    with pytest.raises(EngineDeadError, match="2 checks in a row"):
        await probe.check()
    await asyncio.sleep(0)  # the cancelled probe runs its cancellation
    assert engine.probes_started == 1 and engine.probes_cancelled == 1


async def test_a_dead_engine_is_lost_at_the_first_check_whatever_hang_probes_says():
    engine = HeldEngine()
    engine.dead = True
    probe = EngineProbe(engine, CHECK_S, hang_probes=5)
    with pytest.raises(EngineDeadError, match="died"):
        await probe.check()
    assert probe.watch.missed_total == 0


async def test_a_probe_that_raises_after_missed_checks_is_a_dead_engine():
    engine = HeldEngine()
    probe = EngineProbe(engine, CHECK_S, hang_probes=3)
    await probe.check()
    engine.dead = True
    engine.release.set()  # the held probe answers; the next one meets the dead engine
    await probe.check()
    with pytest.raises(EngineDeadError, match="died"):
        await probe.check()


async def test_close_cancels_the_probe_that_is_out():
    engine = HeldEngine()
    probe = EngineProbe(engine, CHECK_S, hang_probes=3)
    await probe.check()
    probe.close()
    await asyncio.sleep(0)
    assert engine.probes_cancelled == 1
    probe.close()  # nothing out: nothing to do
