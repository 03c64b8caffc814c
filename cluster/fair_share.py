"""Fair share of one engine among tenants: which complete group goes to the engine next.

Several training runs, evaluations and ``grrm score`` jobs share the reward replicas. Where complete
groups wait for a replica's engine, first come first served lets one run's flood delay another's
rewards by the whole flood. This module decides the order instead, by **virtual token counters**
(VTC, Sheng et al., "Fairness in Serving Large Language Models", OSDI '24), the known design for
LLM serving:

* every tenant has a counter of the service it got, in tokens (the prompt's when its group is sent
  to the engine, the answer's when it comes back), divided by its weight;
* a free engine slot goes to the waiting tenant with the least counter (ties: the earlier group);
* a tenant that was idle and comes back has its counter lifted to the least counter among the
  tenants that are waiting or running, less a bounded ``return_credit`` (tokens): idle time is not
  banked as credit for a later burst, but a returning tenant's first few groups go ahead of a
  backlogged flood (FQ-CoDel's "new flows first" for sparse flows). Without it a small run's
  handful of groups would alternate with the flood's and take twice as long as alone; with it
  they take about as long as alone, and a tenant that stays busy gets exactly its weighted share
  (the credit is granted again only after the tenant was idle, and never lowers its own counter);
* priority classes come first: a waiting group of a higher class always goes before a lower one
  (evaluation below training); counters order the tenants within a class. A group already at the
  engine is never preempted, so where a lower class fills every slot, a higher class's group waits
  for one to end; ``reserved_slots`` keeps that many free of lower classes while a higher class
  has sent a group within the window (its groups then start at once, at that share of the
  engine's throughput to the lower classes).

Why VTC and not per-request round robin or weighted fair queueing on group counts: GRRM groups
differ in cost by an order of magnitude (2 vs 16 candidates, answers of 100 vs 2000 tokens), and
counting tokens is what makes a flood of large groups pay for what it uses. It is work-conserving
(unless slots are reserved): a slot is never left free while a group waits, so a tenant alone
gets the whole engine, and the
engine's batch stays as full as without it (the gate admits as many groups as the engine runs at
once; the engine's own scheduler orders those).

:class:`VirtualTokenCounters` is the pure decision state (no asyncio, no clock); :class:`FairGate`
is the asyncio gate a replica puts in front of its engine. No Ray, no I/O.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["DEFAULT_POLICY", "FairGate", "GateStats", "TenantPolicy", "VirtualTokenCounters"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """How one tenant shares the engine."""

    weight: float = 1.0  # its share relative to the others of its class
    priority: int = 0  # a higher class is always served first


DEFAULT_POLICY = TenantPolicy()


@dataclass(order=True)
class _Waiting:
    arrival: int
    tenant: str = field(compare=False)
    tokens: float = field(compare=False)  # the estimate charged when it is sent to the engine


class VirtualTokenCounters:
    """Per-tenant counters of weighted service, and the choice of the next waiting group."""

    def __init__(self, policy: Callable[[str], TenantPolicy] = lambda tenant: DEFAULT_POLICY,
                 return_credit: float = 0.0):
        self.policy = policy
        self.return_credit = return_credit  # tokens a returning tenant may go ahead of the least served
        self.counters: dict[str, float] = {}
        self.waiting: dict[str, deque[_Waiting]] = {}
        self.running: Counter[str] = Counter()
        self._arrivals = itertools.count()

    def active(self, tenant: str) -> bool:
        """Whether the tenant has a group waiting or running."""
        return bool(self.waiting.get(tenant)) or self.running[tenant] > 0

    def arrive(self, tenant: str, tokens: float) -> _Waiting:
        """A complete group of ``tenant`` waits for the engine (``tokens``: its estimated prompt)."""
        if not self.active(tenant):
            # A returning tenant starts level with the least served active one, less the bounded
            # credit: no banked idle time, and never below its own past service.
            others = [self.counters.get(name, 0.0) for name in self._active_tenants() if name != tenant]
            if others:
                lifted = min(others) - self.return_credit / self.policy(tenant).weight
                self.counters[tenant] = max(self.counters.get(tenant, 0.0), lifted)
        entry = _Waiting(next(self._arrivals), tenant, tokens)
        self.waiting.setdefault(tenant, deque()).append(entry)
        return entry

    def withdraw(self, entry: _Waiting) -> None:
        """A waiting group left before it was sent (its caller went away)."""
        queue = self.waiting.get(entry.tenant)
        if queue and entry in queue:
            queue.remove(entry)

    def next(self) -> _Waiting | None:
        """The group to send to the engine now (None: none waits); it counts as running from now."""
        chosen = self.peek()
        if chosen is not None:
            self.take(chosen)
        return chosen

    def peek(self) -> _Waiting | None:
        """The group that goes next, left waiting."""
        candidates = [queue[0] for queue in self.waiting.values() if queue]
        if not candidates:
            return None
        return min(candidates, key=lambda entry: (-self.policy(entry.tenant).priority,
                                                  self.counters.get(entry.tenant, 0.0), entry.arrival))

    def take(self, chosen: _Waiting) -> None:
        """Send ``chosen`` (the head of its tenant's queue) to the engine."""
        self.waiting[chosen.tenant].popleft()
        self.running[chosen.tenant] += 1
        self.charge(chosen.tenant, chosen.tokens)

    def charge(self, tenant: str, tokens: float) -> None:
        """Count ``tokens`` of service to ``tenant`` (divided by its weight)."""
        weight = self.policy(tenant).weight
        self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / weight

    def finish(self, tenant: str) -> None:
        """A running group of ``tenant`` left the engine."""
        self.running[tenant] -= 1
        if self.running[tenant] <= 0:
            del self.running[tenant]

    def forget(self, tenant: str) -> None:
        """Drop an idle tenant's counter (it starts level with the others when it returns)."""
        if not self.active(tenant):
            self.counters.pop(tenant, None)
            self.waiting.pop(tenant, None)

    def _active_tenants(self) -> list[str]:
        return [name for name in set(self.waiting) | set(self.running) if self.active(name)]


@dataclass
class GateStats:
    """One tenant's work at a gate now, and what it was served lately."""

    waiting: int = 0
    running: int = 0
    recent_groups: int = 0  # groups the engine finished for it in the last ``window_s``
    recent_tokens: float = 0.0  # their tokens (prompt and answer)


class FairGate(Generic[T]):
    """At most ``slots`` groups at the engine at once; the next by :class:`VirtualTokenCounters`."""

    def __init__(self, slots: int, policy: Callable[[str], TenantPolicy] = lambda tenant: DEFAULT_POLICY, *,
                 enabled: bool = True, return_credit: float = 0.0, reserved_slots: int = 0, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        if slots < 1:
            raise ValueError(f"slots: must be at least 1 (got {slots})")
        if not 0 <= reserved_slots < slots:
            raise ValueError(f"reserved_slots: must be at least 0 and below slots ({slots}), got {reserved_slots}")
        self.slots = slots
        # Slots a lower priority class leaves free while a higher one is active (0: fully work-conserving).
        self.reserved_slots = reserved_slots
        self._classes: dict[int, float] = {}  # priority class -> when it last sent a group to the engine
        self.enabled = enabled  # False: first come, first served (the same gate, for comparison)
        self.counters = VirtualTokenCounters(policy, return_credit)
        self.window_s = window_s
        self._clock = clock
        self._free = slots
        self._recorded = itertools.count(1)
        self._wakeups: dict[int, asyncio.Future[None]] = {}
        self._served: dict[str, deque[tuple[float, float]]] = {}  # tenant -> (when, tokens), last window_s

    async def run(self, tenant: str, tokens: float, work: Callable[[], Awaitable[T]],
                  cost: Callable[[T], float]) -> tuple[T, float]:
        """Run ``work`` when the tenant's turn comes; returns its result and how long it waited.

        ``tokens`` is the group's estimated prompt, charged when it is sent; ``cost(result)`` the
        tokens it really took (prompt and answer), the rest of which is charged when it is done.
        """
        started = self._clock()
        entry = self.counters.arrive(tenant, tokens if self.enabled else 0.0)
        wakeup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wakeups[id(entry)] = wakeup
        self._dispatch()
        try:
            await wakeup
        except asyncio.CancelledError:
            if not wakeup.done() or wakeup.cancelled():
                self.counters.withdraw(entry)
                self._wakeups.pop(id(entry), None)
            else:  # it was given a slot as it was cancelled: hand the slot on
                self._release(tenant)
            raise
        waited = self._clock() - started
        result: T | None = None
        try:
            result = await work()
            return result, waited
        finally:
            used = cost(result) if result is not None else tokens
            if self.enabled:
                self.counters.charge(tenant, max(0.0, used - entry.tokens))  # its estimate was charged at take
            self._record(tenant, used)
            self._release(tenant)

    def stats(self) -> dict[str, GateStats]:
        """Each tenant's waiting and running groups, and what it was served in the last window; a tenant
        idle for a whole window is forgotten (its counter too: it would be lifted on return anyway)."""
        self._forget_idle()
        return {
            name: GateStats(waiting=len(self.counters.waiting.get(name, ())), running=self.counters.running[name],
                            recent_groups=len(self._served.get(name, ())),
                            recent_tokens=sum(tokens for _, tokens in self._served.get(name, ())))
            for name in set(self.counters.counters) | set(self._served) | set(self.counters.running)
            if self.counters.active(name) or name in self._served
        }

    def _forget_idle(self) -> None:
        now = self._clock()
        for name in list(self._served):
            served = self._served[name]
            while served and now - served[0][0] > self.window_s:
                served.popleft()
            if not served:
                del self._served[name]
        for name in list(self.counters.counters):
            if name not in self._served and not self.counters.active(name):
                self.counters.forget(name)

    def _dispatch(self) -> None:
        while self._free > 0:
            entry = self.counters.peek() if self.enabled else self._oldest()
            if entry is None or (self.enabled and self._held_back(entry)):
                return
            self.counters.take(entry)  # disabled, its tokens are 0: nothing is charged
            if self.enabled:
                self._classes[self.counters.policy(entry.tenant).priority] = self._clock()
            self._free -= 1
            wakeup = self._wakeups.pop(id(entry), None)
            if wakeup is not None and not wakeup.done():
                wakeup.set_result(None)

    def _held_back(self, entry: _Waiting) -> bool:
        """Whether ``entry`` must leave the last ``reserved_slots`` free: its class is below one that
        sent a group to the engine within the window (whose next group then starts at once)."""
        if self.reserved_slots == 0 or self._free > self.reserved_slots:
            return False
        now = self._clock()
        priority = self.counters.policy(entry.tenant).priority
        return any(higher > priority and now - when <= self.window_s for higher, when in self._classes.items())

    def _oldest(self) -> _Waiting | None:
        """First come, first served (the gate disabled): the earliest waiting group, left waiting."""
        return min((queue[0] for queue in self.counters.waiting.values() if queue), default=None)

    def _release(self, tenant: str) -> None:
        self.counters.finish(tenant)
        self._free += 1
        self._dispatch()

    def _record(self, tenant: str, tokens: float) -> None:
        self._served.setdefault(tenant, deque()).append((self._clock(), tokens))
        if len(self._served) > 1 and next(self._recorded) % 256 == 0:
            self._forget_idle()  # now and then, so a gate nobody asks for stats stays small too
