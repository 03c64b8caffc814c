"""Concurrency asserted by a condition, not by the clock: prompts in the engine at once."""

from __future__ import annotations

import asyncio

from cluster.engines.base import Engine


def hold_until_in_flight(engine: Engine, prompts: int, timeout_s: float = 30.0) -> None:
    """Makes each of ``engine``'s generations wait until ``prompts`` prompts are in it at once. A caller
    that sends them concurrently gets its answers; one that sends them one after another never has them
    all in at once, and its first generation raises ``TimeoutError`` after ``timeout_s``."""
    generate, reached = engine.generate, asyncio.Event()
    in_flight = 0

    async def held(batch, *args, **kwargs):
        nonlocal in_flight
        in_flight += len(batch)
        if in_flight >= prompts:
            reached.set()
        try:
            await asyncio.wait_for(reached.wait(), timeout_s)
            return await generate(batch, *args, **kwargs)
        finally:
            in_flight -= len(batch)

    engine.generate = held  # type: ignore[method-assign]
