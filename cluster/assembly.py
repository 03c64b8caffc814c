"""From members to groups: collect the rollouts of one group, score them once, answer each.

verl's reward loop asks for one reward per rollout, from many workers, in any order. The
router sends every member of a group to one replica; there a :class:`GroupAssembler` holds the
members until the last one arrives, scores the whole group as one GQM prompt and answers every
member with its own score, and the reward and components its tenant's recipe composed
(:mod:`cluster.recipe_runner`: the language gate, the engine, the reward's parts). Every member must
agree with its group on source, languages, size, reference and notes (a disagreeing one is a
conflict). Members are known by their ``index`` (the candidates are shown in index order) or, when the caller has no position, by their ``member_id`` (the candidates are then shown
in the order of their texts' digests, so the prompt never depends on arrival order); a re-sent
member is recognised by the same index or id and the same text. A member marked ``invalid`` (its translation could not be extracted)
counts towards completing the group but is not shown to the model and gets no score; a group with
fewer than 2 members left to show is answered ``too_few_distinct`` without an engine call. A group
whose engine died while scoring it is not answered at all (:class:`EngineDeadError` reaches its
members): it has no verdict, and must be scored elsewhere.
Pure asyncio: no Ray, no engine, no I/O, so it is tested on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from cluster import gqm
from cluster.assembly_observers import AssemblyObserver, GroupTrace
from cluster.completed_groups import CompletedGroups
from cluster.engines.base import EngineDeadError
from cluster.group_records import (
    CompletedGroup,
    GroupContext,
    MemberKey,
    Verdict,
    candidate_digest,
    group_context,
)
from cluster.recipe import RecipeSettings
from cluster.recipe_runner import RecipeOutcome, RecipeRunner
from cluster.protocol.schema import FailureReason, GroupRequest, MemberRequest, MemberResult, MemberTiming
from cluster.scorer import GroupScoring

# How many missing indices a timeout message lists before it only counts the rest.
_MISSING_INDICES_SHOWN = 20
# How far past its waiting-members limit a tenant's members may still join groups it has started.
JOIN_HEADROOM = 1.5
_DEFAULT_RECIPE = RecipeSettings()


@dataclass(frozen=True, slots=True)
class AssemblySettings:
    """How a replica's assembler collects groups: its bounds, and its name in the answers it gives itself."""

    assembly_timeout_s: float  # from a group's first member to its last
    max_pending_groups: int = 100_000  # groups collecting members at once
    replica: str = ""  # this replica, in answers the assembler gives itself (timeouts, rejections)
    # Tenant -> how many of its members may wait here for group-mates (None: no limit).
    waiting_limit: Callable[[str], int | None] = lambda tenant: None

    def __post_init__(self) -> None:
        if self.assembly_timeout_s <= 0:
            raise ValueError(f"assembly_timeout_s must be positive, got {self.assembly_timeout_s}")
        if self.max_pending_groups < 1:
            raise ValueError(f"max_pending_groups must be >= 1, got {self.max_pending_groups}")


@dataclass(slots=True)
class AssemblyCounts:
    """What the assembler did since it started (the names its stats export)."""

    members_received: int = 0
    groups_started: int = 0
    groups_scored: int = 0  # score_group calls
    scoring_failures: int = 0  # score_group raised or answered malformed
    assembly_timeouts: int = 0
    conflicts: int = 0  # members that disagree with their group (fields or candidate)
    duplicates: int = 0  # retries that joined a group still collecting or scoring
    cached_answers: int = 0  # retries answered from an already-scored group
    rejected_overload: int = 0
    rejected_tenant_waiting: int = 0  # a tenant's members waiting for group-mates at its limit
    rejected_closed: int = 0
    single_member_groups: int = 0
    invalid_members: int = 0  # members without a translation (not shown to the model)
    cancelled_waiters: int = 0
    groups_abandoned: int = 0  # the engine died while scoring them: no verdict, not answered
    groups_handed_off: int = 0  # not yet at the engine when another replica became their owner


@dataclass(eq=False, slots=True)
class _Assembly:
    """One group being collected (``scoring`` is None) or being scored (``scoring`` is set)."""

    group_id: str
    first: MemberRequest  # the member every later one must agree with
    context: GroupContext  # what every member must agree on (the first's)
    deadline: float  # on the assembler's clock
    outcome: asyncio.Future[Verdict]
    first_received_at: float  # wall clock
    candidates: dict[MemberKey, str | None] = field(default_factory=dict)  # None: an invalid member
    response_tokens: dict[MemberKey, int | None] = field(default_factory=dict)  # each member's, for the recipe
    first_sent_at: float | None = None
    # The member keys in the order the model sees them (set when the group is complete).
    order: list[MemberKey] | None = None
    complete_at: float | None = None
    timer: asyncio.TimerHandle | None = None
    scoring: asyncio.Task[None] | None = None
    # The key routers place the group by (None: the caller gave none; the group is never handed off).
    route_key: str | None = None
    # Submit calls waiting on it while it collects (each holds a request slot of the replica).
    collecting_waiters: int = 0
    # Its ledger lookup (a replica that died may have scored it): scoring waits for it, so a group
    # whose members all arrive before the ledger answers is not scored a second time.
    lookup: asyncio.Task[CompletedGroup | None] | None = None

    @property
    def keyed(self) -> bool:
        """Whether the group's members come with member_ids instead of indices."""
        return self.first.index is None

    def shown(self) -> list[int]:
        """The positions (in prompt order) of the complete group's members shown to the model: the valid ones."""
        return [position for position, key in enumerate(self.order or ()) if self.candidates[key] is not None]

    def group_request(self, shown: list[int]) -> tuple[GroupRequest, list[int | None]]:
        """The complete group as the engine is asked to score it (its ``shown`` members, in prompt order),
        and those members' response lengths."""
        order = self.order or []
        tokens = [self.response_tokens.get(order[position]) for position in shown]
        first = self.first
        request = GroupRequest(tenant=first.tenant, group_id=self.group_id, source=first.source,
                               candidates=[self.candidates[order[position]] for position in shown],
                               src_lang=first.src_lang, trg_lang=first.trg_lang, ref_text=first.ref_text,
                               ref_lang=first.ref_lang, notes=first.notes,
                               response_tokens=None if None in tokens else tokens)
        return request, tokens


def _candidate_of(member: MemberRequest) -> str | None:
    """What a member contributes to its group: its text, or None when it is invalid."""
    return None if member.invalid else member.candidate


def prompt_order(candidates: dict[MemberKey, str | None]) -> list[MemberKey]:
    """The order in which a complete group's members are shown to the model.

    Members with indices: index order. Members with member_ids: by their texts' digests (invalid
    members last, ids break ties between equal texts), a pseudo-random order that depends only on
    the texts, so the same group gives the same prompt whatever order its members arrived in.
    """
    if all(isinstance(key, int) for key in candidates):
        return sorted(candidates)  # type: ignore[type-var]
    return sorted(
        candidates,
        key=lambda key: (candidates[key] is None, candidate_digest(candidates[key]), str(key)),
    )


class GroupAssembler:
    """Collects the members of each group, scores each complete group once, answers every member.

    Each complete group goes through its tenant's recipe to ``scorer`` once, in a task of its own:
    a caller that is cancelled does not cancel the scoring the other members wait for. Every
    outcome, good or bad, reaches every waiting member; nothing is made up (an invalid group gives
    score None). The one exception is the engine's death (the scorer raises
    :class:`EngineDeadError`): the group is abandoned, neither published nor remembered, and every
    waiting member's :meth:`submit` raises it, so that all of them are re-sent together to a live
    engine. Scored groups are kept (and published) by :class:`~cluster.completed_groups.CompletedGroups`.

    Time is read from ``clock`` (deadlines, cache expiry). The event loop's timer wakes the
    assembler at each deadline; :meth:`expire_overdue` (run on every submit) applies the clock
    too, so a test with a fake clock can expire groups without sleeping.
    """

    def __init__(self, scorer: GroupScoring, settings: AssemblySettings, *, completed: CompletedGroups | None = None,
                 rewards: RecipeRunner | None = None, observers: Sequence[AssemblyObserver] = (),
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        """Set up an empty assembler.

        ``scorer``: where a complete group's shown members are scored (a replica's engine lane);
        ``completed``: the groups scored here, kept for retries and published to the ledger (None:
        kept for 600 s, no ledger); ``rewards`` runs each complete group through its tenant's recipe
        (the language gate, the engine, the reward's parts; None: the default recipe, every member's
        reward its score); ``observers`` are told of every group answered or handed off.
        """
        self.settings = settings
        self._scorer = scorer
        self._rewards = rewards or RecipeRunner(lambda tenant: _DEFAULT_RECIPE, replica=settings.replica)
        self._completed = completed if completed is not None else CompletedGroups(clock=clock)
        self._observers = tuple(observers)
        self._clock = clock
        self._wall_clock = wall_clock
        self.counts = AssemblyCounts()
        # Insertion order is deadline order, so sweeps only look at the front.
        self._assembling: OrderedDict[str, _Assembly] = OrderedDict()
        self._scoring: dict[str, _Assembly] = {}
        self._members_waiting = 0
        # Tenant -> submit calls waiting on its groups still collecting (only tenants with some).
        self._collecting_waiters: dict[str, int] = {}
        self._closed = False
        self._lookups: set[asyncio.Task[CompletedGroup | None]] = set()

    @property
    def replica(self) -> str:
        """This replica's name in the answers the assembler gives itself."""
        return self.settings.replica

    # ----------------------------------------------------------------------------- public

    async def submit(self, member: MemberRequest, route_key: str | None = None) -> MemberResult:
        """Add one member and wait for its group's verdict; the answer carries its own score.
        ``route_key``: what routers place the group by, for :meth:`hand_off` (the first member's counts).

        Raises :class:`EngineDeadError` when the engine died while scoring the member's group.
        """
        self.counts.members_received += 1
        received_at = self._wall_clock()
        if self._closed:
            self.counts.rejected_closed += 1
            return self._refuse(
                member, "shutting_down", f"group {member.group_id}: the replica is shutting down", received_at
            )
        if member.group_size == 1:
            # One candidate has nothing to be ranked against: no prompt, no engine call.
            self.counts.single_member_groups += 1
            return self._refuse(
                member, "too_few_distinct", f"group {member.group_id} has one member: nothing to compare", received_at
            )
        self.expire_overdue()

        group_id = member.group_id
        assembly = self._assembling.get(group_id) or self._scoring.get(group_id)
        over = self._over_waiting_limit(member, assembly)
        if over is not None:
            self.counts.rejected_tenant_waiting += 1
            return self._refuse(member, "overloaded", over, received_at)
        if assembly is not None:
            rejection = self._join(assembly, member, received_at)
            if rejection is not None:
                return rejection
        else:
            completed = self._completed.get(group_id)
            if completed is not None:
                return self._answer_from_cache(completed, member, received_at)
            if len(self._assembling) >= self.settings.max_pending_groups:
                self.counts.rejected_overload += 1
                return self._refuse(
                    member,
                    "overloaded",
                    f"group {group_id}: too many groups assembling "
                    f"({len(self._assembling)}, max_pending_groups {self.settings.max_pending_groups}); retry later",
                    received_at,
                )
            assembly = self._start(member, received_at)
            assembly.route_key = route_key
        return await self._wait(assembly, member, received_at)

    def _over_waiting_limit(self, member: MemberRequest, assembly: _Assembly | None) -> str | None:
        """Why ``member`` is refused (``overloaded``) for its tenant's members waiting for group-mates
        here, else None. Each such member holds one of the replica's request slots, so one tenant
        whose groups never complete (a wrong ``group_size``) would take them all. At ``limit`` its
        new groups are refused; members of its groups already collecting still join up to
        :data:`JOIN_HEADROOM` times the limit, so that an honest run at the limit completes what it
        started; a member that completes its group is never refused (it frees the others)."""
        if assembly is not None and assembly.scoring is not None:
            return None  # its group is complete: it waits on work, not on group-mates
        limit = self.settings.waiting_limit(member.tenant)
        if limit is None:
            return None
        held = self._collecting_waiters.get(member.tenant, 0)
        if assembly is None:
            if held < limit:
                return None
            what = "a new group"
        else:
            completes = (member.key not in assembly.candidates
                         and len(assembly.candidates) + 1 >= assembly.first.group_size)
            if completes or held < JOIN_HEADROOM * limit:
                return None
            what = "a member of a group still collecting"
        return (f"tenant {member.tenant}: {held} of its members wait for group-mates on replica {self.replica} "
                f"(tenants max_waiting_members {limit}: {what} waits for some to complete or time out); "
                "retry later")

    def hand_off(self, new_owner: Callable[[str], str | None], queued: Container[str] = ()) -> int:
        """Release every group that ``new_owner`` (route key -> the replica that owns it now, None: this
        one) places elsewhere and that no engine has begun: its waiting members are answered ``moved``
        at once, to be sent to the new owner. A group still collecting members would otherwise wait out
        the assembly timeout for group-mates that now go there; a complete group in ``queued`` (waiting
        for this replica's engine, which has not seen it) would wait for this engine while a new
        replica's is free. Groups at the engine stay. Returns how many groups were released."""
        released = 0
        for assembly in [*self._assembling.values(), *self._scoring.values()]:
            owner = new_owner(assembly.route_key) if assembly.route_key is not None else None
            if owner is None:
                continue
            if assembly.scoring is None:
                self._drop_assembling(assembly)
                held = f"{len(assembly.candidates)} of {assembly.first.group_size} were here"
            elif assembly.group_id in queued:
                # Cancelled while it waits for an engine slot: no engine call was made, none will be.
                assembly.scoring.cancel()
                del self._scoring[assembly.group_id]
                self.counts.groups_scored -= 1  # counted as its scoring began; its new owner scores it
                held = "complete here, waiting for the engine"
            else:
                continue
            self.counts.groups_handed_off += 1
            released += 1
            for observer in self._observers:
                observer.group_handed_off(assembly.group_id, owner)
            self._resolve(assembly, self._verdict(
                "moved", f"group {assembly.group_id}: the replica set changed and replica {owner} now collects its "
                         f"members ({held})"))
        return released

    def holds(self, group_id: str) -> bool:
        """Whether this assembler collects, scores or has scored (and still remembers) the group."""
        return group_id in self._assembling or group_id in self._scoring or group_id in self._completed

    def pending_groups(self) -> int:
        """Groups still collecting members."""
        return len(self._assembling)

    def scoring_groups(self) -> int:
        """Complete groups whose score_group call has not returned yet."""
        return len(self._scoring)

    def members_collecting(self) -> dict[str, int]:
        """Per tenant (those with some), its submit calls waiting for group-mates here."""
        return dict(self._collecting_waiters)

    def members_waiting(self) -> int:
        """Submit calls waiting for a verdict (collecting or scoring)."""
        return self._members_waiting

    def stats(self) -> dict[str, int]:
        """Counters since start, and the current gauges (for metrics and routing)."""
        return {
            **dataclasses.asdict(self.counts),
            "pending_groups": len(self._assembling),
            "scoring_groups": len(self._scoring),
            "members_waiting": self._members_waiting,
            **self._completed.stats(),
        }

    def expire_overdue(self) -> None:
        """Time out groups past their deadline and forget cached answers past their TTL."""
        now = self._clock()
        while self._assembling:
            oldest = next(iter(self._assembling.values()))
            if oldest.deadline > now:
                break
            self._time_out(oldest)
        self._completed.expire()

    async def close(self) -> None:
        """Answer every waiting member with a shutdown error and refuse new members."""
        self._closed = True
        shutdown = self._verdict("shutting_down", "the replica shut down before the group was scored")
        for assembly in list(self._assembling.values()):
            self._drop_assembling(assembly)
            self._resolve(assembly, shutdown)
        scoring = [assembly.scoring for assembly in self._scoring.values() if assembly.scoring is not None]
        for task in scoring:
            task.cancel()
        # The scoring tasks' done callbacks answer their members when the cancellation lands.
        await asyncio.gather(*scoring, return_exceptions=True)
        for lookup in list(self._lookups):
            lookup.cancel()
        await self._completed.close()

    async def finish_ledger_writes(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the ledger writes still under way (the records of groups
        already answered): a replica about to end gives them this grace."""
        await self._completed.finish_writes(timeout_s)

    # ---------------------------------------------------------------------------- collect

    def _start(self, member: MemberRequest, received_at: float) -> _Assembly:
        loop = asyncio.get_running_loop()
        assembly = _Assembly(
            group_id=member.group_id,
            first=member,
            context=group_context(member),
            deadline=self._clock() + self.settings.assembly_timeout_s,
            outcome=loop.create_future(),
            first_received_at=received_at,
        )
        self.counts.groups_started += 1
        self._assembling[member.group_id] = assembly
        self._add(assembly, member)
        if assembly.scoring is None:
            assembly.timer = loop.call_later(self.settings.assembly_timeout_s, self._on_timer, assembly)
            if self._completed.has_ledger:
                # Off the critical path: the group waits for its other members anyway.
                lookup = loop.create_task(self._look_up(assembly), name=f"ledger-{member.group_id}")
                self._lookups.add(lookup)
                lookup.add_done_callback(self._lookups.discard)
                assembly.lookup = lookup
        return assembly

    async def _look_up(self, assembly: _Assembly) -> CompletedGroup | None:
        """The ledger's record of a group another replica scored (and died before answering all of it),
        adopted at once while the group still collects; returned for its scoring to adopt otherwise
        (None: no record, or no answer within ``ledger_timeout_s``)."""
        record = await self._completed.look_up(assembly.group_id)
        if record is not None and self._assembling.get(assembly.group_id) is assembly:
            self._adopt(assembly, record)
        return record

    def _adopt(self, assembly: _Assembly, record: CompletedGroup) -> bool:
        """Answer ``assembly`` with the ledger's ``record`` if that is this group (whether it did)."""
        agrees = not _disagreements(assembly.first, assembly.context, record.group_size, record.context) and all(
            record.digest_of(key) == candidate_digest(text) for key, text in assembly.candidates.items()
        )
        if not agrees:
            return False  # the same id for a different group: assemble it afresh
        self._drop_assembling(assembly)
        if self._scoring.get(assembly.group_id) is assembly:
            del self._scoring[assembly.group_id]
        self._completed.adopt(assembly.group_id, record)
        self._resolve(assembly, record.verdict)
        return True

    def _join(self, assembly: _Assembly, member: MemberRequest, received_at: float) -> MemberResult | None:
        """Add a member to a known group; a MemberResult when it is refused instead."""
        first = assembly.first
        disagreements = _disagreements(member, group_context(member), first.group_size, assembly.context)
        if (member.index is None) != assembly.keyed:
            disagreements.append(
                "how members are identified (every member of a group has an index, or every member a member_id)"
            )
        if disagreements:
            return self._conflict(member, disagreements, received_at)
        key = member.key
        if key in assembly.candidates:
            if assembly.candidates[key] != _candidate_of(member):
                return self._conflict_on_key(member, received_at)
            # A retry of a member already here: it waits on the same outcome, counted once.
            self.counts.duplicates += 1
            return None
        if assembly.order is not None:
            # Only members with ids can be new once a group is complete: its group_size are all here.
            self.counts.conflicts += 1
            return self._refuse(
                member,
                "conflict",
                f"group {member.group_id}: all {first.group_size} members have arrived; "
                f"member_id {member.member_id!r} is not one of them (is group_size the number of members?)",
                received_at,
            )
        self._add(assembly, member)
        return None

    def _add(self, assembly: _Assembly, member: MemberRequest) -> None:
        assembly.candidates[member.key] = _candidate_of(member)
        assembly.response_tokens[member.key] = member.response_tokens
        if member.sent_at is not None:
            first_sent = assembly.first_sent_at
            assembly.first_sent_at = member.sent_at if first_sent is None else min(first_sent, member.sent_at)
        if member.invalid:
            self.counts.invalid_members += 1
        if len(assembly.candidates) == assembly.first.group_size:
            self._begin_scoring(assembly)

    def _on_timer(self, assembly: _Assembly) -> None:
        if self._assembling.get(assembly.group_id) is not assembly:
            return
        # The loop's timer and the assembler's clock may differ (a fake clock in tests, another
        # loop clock); the clock decides, the timer only wakes us up.
        remaining = assembly.deadline - self._clock()
        if remaining > 0:
            assembly.timer = asyncio.get_running_loop().call_later(remaining, self._on_timer, assembly)
            return
        self._time_out(assembly)

    def _time_out(self, assembly: _Assembly) -> None:
        # The partial group is dropped, not cached: a later member starts a new assembly.
        self._drop_assembling(assembly)
        self.counts.assembly_timeouts += 1
        size = assembly.first.group_size
        missing_text = ""
        if not assembly.keyed:
            missing = [index for index in range(size) if index not in assembly.candidates]
            shown = str(missing[:_MISSING_INDICES_SHOWN])
            if len(missing) > _MISSING_INDICES_SHOWN:
                shown = f"{shown[:-1]}, ... {len(missing) - _MISSING_INDICES_SHOWN} more]"
            missing_text = f" (missing indices {shown})"
        self._resolve(
            assembly,
            self._verdict(
                "timeout",
                f"group {assembly.group_id}: assembly timed out after {self.settings.assembly_timeout_s!r} s "
                f"with {len(assembly.candidates)} of {size} members{missing_text}",
            ),
        )

    def _drop_assembling(self, assembly: _Assembly) -> None:
        if assembly.timer is not None:
            assembly.timer.cancel()
            assembly.timer = None
        if self._assembling.get(assembly.group_id) is assembly:
            del self._assembling[assembly.group_id]
            # Its waiters no longer wait for group-mates (they wait for its verdict, or are answered now).
            self._uncount_collecting(assembly, assembly.collecting_waiters)

    def _uncount_collecting(self, assembly: _Assembly, waiters: int) -> None:
        tenant = assembly.first.tenant
        assembly.collecting_waiters -= waiters
        left = self._collecting_waiters.get(tenant, 0) - waiters
        if left > 0:
            self._collecting_waiters[tenant] = left
        else:
            self._collecting_waiters.pop(tenant, None)

    # ------------------------------------------------------------------------------ score

    def _begin_scoring(self, assembly: _Assembly) -> None:
        assembly.order = prompt_order(assembly.candidates)
        assembly.complete_at = self._wall_clock()
        self._drop_assembling(assembly)
        self._scoring[assembly.group_id] = assembly
        # A task of its own: no single caller's cancellation reaches the engine call.
        assembly.scoring = asyncio.get_running_loop().create_task(
            self._score(assembly), name=f"score-group-{assembly.group_id}"
        )
        assembly.scoring.add_done_callback(lambda task: self._on_scoring_done(assembly, task))

    async def _score(self, assembly: _Assembly) -> None:
        # A group complete before its ledger lookup answered waits for it (at most ledger_timeout_s):
        # a replica that died may have scored it, and its members hold that verdict's rewards.
        if assembly.lookup is not None:
            await asyncio.wait({assembly.lookup})
            record = None if assembly.lookup.cancelled() else assembly.lookup.result()
            if record is not None and self._adopt(assembly, record):
                return
        first = assembly.first
        shown = assembly.shown()
        if len(shown) < gqm.MIN_CANDIDATES:
            # Invalid members leave nothing to compare: no prompt, no engine call.
            verdict = self._group_verdict(
                assembly,
                self._verdict(
                    "too_few_distinct",
                    f"group {assembly.group_id}: {len(shown)} of {first.group_size} members have a "
                    "translation; nothing to compare",
                ),
                started_at=None,
            )
            await self._answer(assembly, verdict)
            return
        self.counts.groups_scored += 1
        started_at = self._wall_clock()
        try:
            request, shown_tokens = assembly.group_request(shown)
            outcome = await self._rewards.run(request, self._scorer, shown_tokens)
            verdict = self._verdict_from_outcome(assembly, outcome, shown)
        except EngineDeadError as error:
            self._abandon(assembly, error)
            return
        except Exception as error:  # noqa: BLE001 - any failure is every member's answer, not a hang
            self.counts.scoring_failures += 1
            verdict = self._verdict(
                "engine_error", f"group {assembly.group_id}: scoring failed: {type(error).__name__}: {error}"
            )
        verdict = self._group_verdict(assembly, verdict, started_at)
        await self._answer(assembly, verdict)

    def _abandon(self, assembly: _Assembly, error: EngineDeadError) -> None:
        """No verdict exists: nothing is published or remembered, every waiting member is told."""
        self.counts.groups_abandoned += 1
        if self._scoring.get(assembly.group_id) is assembly:
            del self._scoring[assembly.group_id]
        if not assembly.outcome.done():
            assembly.outcome.set_exception(error)
            assembly.outcome.exception()  # retrieved here: members that gave up raise nothing unseen

    def _on_scoring_done(self, assembly: _Assembly, task: asyncio.Task[None]) -> None:
        # Reached with the outcome still open only when the task was cancelled (close(), loop
        # shutdown) or broke outside its own error handling: the members still get an answer.
        if assembly.outcome.done():
            return
        if task.cancelled():
            verdict = self._verdict("shutting_down", "the replica shut down before the group was scored")
        else:
            error = task.exception()
            verdict = self._verdict(
                "engine_error", f"group {assembly.group_id}: scoring failed: {type(error).__name__}: {error}"
            )
        self._finish(assembly, verdict, None)

    def _verdict_from_outcome(self, assembly: _Assembly, outcome: RecipeOutcome, shown: list[int]) -> Verdict:
        """The members' verdict from the recipe's outcome for the shown members (``shown``: their
        positions); the members not shown (invalid) get their recipe's reward without a score."""
        if outcome.malformed:
            # A malformed result must not hand out a wrong member's score or raise per member.
            self.counts.scoring_failures += 1
        size = assembly.first.group_size
        result = outcome.result
        scores: list[int | None] | None = None if outcome.scores is None else [None] * size
        idle = self._rewards.unscored(assembly.first.tenant, invalid=True)
        rewards = [idle.reward] * size
        components = [idle.components] * size
        failures: list[FailureReason | None] = [None] * size
        for at, position in enumerate(shown):
            if scores is not None and outcome.scores is not None:
                scores[position] = outcome.scores[at]
            rewards[position] = outcome.rewards[at]
            components[position] = outcome.components[at]
            failures[position] = outcome.failures[at]
        return Verdict(
            scores=None if scores is None else tuple(scores),
            valid=result.valid,
            error=result.error,
            failure=result.failure,
            replica=result.replica or self.replica,
            attempts=result.attempts,
            rewards=tuple(rewards),
            components=tuple(components),
            failures=tuple(failures) if any(failures) else None,
        )

    def _group_verdict(self, assembly: _Assembly, verdict: Verdict, started_at: float | None) -> Verdict:
        """The verdict with what belongs to the group: its members' positions and its times.

        Also tells the observers of it (its trace).
        """
        ended_at = self._wall_clock()
        complete_at = assembly.complete_at if assembly.complete_at is not None else ended_at
        positions = None
        if assembly.keyed and assembly.order is not None:
            positions = {str(key): position for position, key in enumerate(assembly.order)}
        scored = dataclasses.replace(
            verdict,
            positions=positions,
            complete_at=complete_at,
            scoring_started_at=started_at if started_at is not None else ended_at,
            scoring_ended_at=ended_at,
        )
        trace = GroupTrace(group_id=assembly.group_id, group_size=assembly.first.group_size,
                           first_sent_at=assembly.first_sent_at, first_received_at=assembly.first_received_at,
                           complete_at=complete_at, scoring_started_at=scored.scoring_started_at or ended_at,
                           scoring_ended_at=ended_at, valid=verdict.valid, failure=verdict.failure)
        for observer in self._observers:
            observer.group_scored(trace)
        return scored

    async def _answer(self, assembly: _Assembly, verdict: Verdict) -> None:
        """Publish the group's verdict (members wait for the ledger, bounded), keep it for retries, answer."""
        record = self._record(assembly, verdict)
        await self._completed.publish(assembly.group_id, record)
        self._finish(assembly, verdict, record)

    def _finish(self, assembly: _Assembly, verdict: Verdict, record: CompletedGroup | None) -> None:
        """Answer the group's members; keep its ``record`` for retries (None: it is not kept)."""
        if self._scoring.get(assembly.group_id) is assembly:
            del self._scoring[assembly.group_id]
        if record is not None and not self._closed:
            self._completed.remember(assembly.group_id, record)
        self._resolve(assembly, verdict)

    def _record(self, assembly: _Assembly, verdict: Verdict) -> CompletedGroup:
        order = assembly.order or prompt_order(assembly.candidates)
        return CompletedGroup.of(
            assembly.first.group_size,
            assembly.context,
            candidate_digests=tuple(candidate_digest(assembly.candidates[key]) for key in order),
            verdict=verdict,
            member_ids=tuple(str(key) for key in order) if assembly.keyed else None,
        )

    # ----------------------------------------------------------------------------- answer

    async def _wait(self, assembly: _Assembly, member: MemberRequest, received_at: float) -> MemberResult:
        self._members_waiting += 1
        if self._assembling.get(assembly.group_id) is assembly:
            assembly.collecting_waiters += 1
            tenant = assembly.first.tenant
            self._collecting_waiters[tenant] = self._collecting_waiters.get(tenant, 0) + 1
        try:
            # shield: a cancelled caller must not cancel the outcome the other members share.
            verdict = await asyncio.shield(assembly.outcome)
        except asyncio.CancelledError:
            self.counts.cancelled_waiters += 1
            raise
        finally:
            self._members_waiting -= 1
            if self._assembling.get(assembly.group_id) is assembly:
                self._uncount_collecting(assembly, 1)  # a cancelled caller of a group still collecting
        return self._member_result(member, verdict, received_at)

    def _answer_from_cache(self, completed: CompletedGroup, member: MemberRequest, received_at: float) -> MemberResult:
        disagreements = _disagreements(member, group_context(member), completed.group_size, completed.context)
        if (member.index is None) != (completed.member_ids is not None):
            disagreements.append(
                "how members are identified (every member of a group has an index, or every member a member_id)"
            )
        if disagreements:
            return self._conflict(member, disagreements, received_at)
        digest = completed.digest_of(member.key)
        if digest is None:
            self.counts.conflicts += 1
            return self._refuse(
                member,
                "conflict",
                f"group {member.group_id} was scored without member_id {member.member_id!r}",
                received_at,
            )
        if candidate_digest(_candidate_of(member)) != digest:
            return self._conflict_on_key(member, received_at)
        self.counts.cached_answers += 1
        return self._member_result(member, completed.verdict, received_at)

    def _conflict(self, member: MemberRequest, disagreements: list[str], received_at: float) -> MemberResult:
        self.counts.conflicts += 1
        return self._refuse(
            member,
            "conflict",
            f"group {member.group_id}: member {member.key!r} disagrees with the group on "
            f"{'; '.join(disagreements)}; all members of a group must share source, src_lang, "
            "trg_lang, group_size, ref_text, ref_lang and notes",
            received_at,
        )

    def _conflict_on_key(self, member: MemberRequest, received_at: float) -> MemberResult:
        self.counts.conflicts += 1
        which = f"index {member.index}" if member.index is not None else f"member_id {member.member_id!r}"
        return self._refuse(
            member,
            "conflict",
            f"group {member.group_id}: {which} already has a different candidate "
            "(a retry must resend the same candidate)",
            received_at,
        )

    def _verdict(self, failure: FailureReason, error: str) -> Verdict:
        return Verdict(scores=None, valid=False, error=error, failure=failure, replica=self.replica, attempts=0)

    def _refuse(self, member: MemberRequest, failure: FailureReason, error: str, received_at: float) -> MemberResult:
        return self._member_result(member, self._verdict(failure, error), received_at)

    def _member_result(self, member: MemberRequest, verdict: Verdict, received_at: float) -> MemberResult:
        scores = verdict.scores
        position = verdict.position_of(member)
        valid, failure, error = verdict.valid, verdict.failure, verdict.error
        own = verdict.failures[position] if verdict.failures is not None and position is not None else None
        if own is not None:
            # The language gate took this member out of its group: its own failure, whatever the group's.
            valid, failure = False, own
            error = (f"group {member.group_id}: its candidate is not in the target language {member.trg_lang} "
                     "(the recipe's language gate): not shown to the model, default reward")
        if verdict.rewards is not None and verdict.components is not None and position is not None:
            reward, components = verdict.rewards[position], dict(verdict.components[position])
        else:
            composed = self._rewards.unscored(member.tenant, member.invalid)
            reward, components = composed.reward, dict(composed.components)
        return MemberResult(
            group_id=member.group_id,
            index=position,
            member_id=member.member_id,
            score=scores[position] if scores is not None and position is not None else None,
            valid=valid,
            error=error,
            failure=failure,
            replica=verdict.replica,
            attempts=verdict.attempts,
            group_scores=list(scores) if scores is not None else None,
            timing=MemberTiming(
                received_at=received_at,
                complete_at=verdict.complete_at,
                scoring_started_at=verdict.scoring_started_at,
                scoring_ended_at=verdict.scoring_ended_at,
            ),
            reward=reward,
            components=components,
        )

    @staticmethod
    def _resolve(assembly: _Assembly, verdict: Verdict) -> None:
        if not assembly.outcome.done():
            assembly.outcome.set_result(verdict)


def _disagreements(member: MemberRequest, context: GroupContext, group_size: int, group: GroupContext) -> list[str]:
    """The fields on which a member (its ``context``) differs from its group, described for an error message."""
    found = []
    if member.group_size != group_size:
        found.append(f"group_size ({member.group_size} here, {group_size} in the group)")
    return found + group.disagreements(context)
