"""Measuring an engine profile, the pure part: what to send, how to send it at a concurrency, and how
the timings become ``cluster/planning/profile.py``'s points and profile. ``grrm profile``
(``grrm_cli/profile.py``) reaches the service and writes the file; nothing here does I/O, the sending
is a function handed in.

What is sent: GQM groups (a source and its candidates), from a user's sample or made from numbers
(group size, words per source and per candidate). Every group sent is different text under its own id:
a replica keeps a scored group's answer under its id for retries, and vLLM's prefix cache would make a
repeated prompt nearly free, so a repeat would measure a cache instead of the engine.

How it is measured: at each concurrency, ``N`` groups with that many in flight (a new one sent as one
is answered); the window runs from the first send to the last answer. Groups per second is the valid
answers over the window; tokens per second their prompt and answer tokens over it (None when the
engine reports none). An invalid answer (``valid: false``, or no answer) is counted by its failure
kind, never as throughput.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cluster.gqm import MIN_CANDIDATES
from cluster.planning.profile import ConcurrencyPoint, EngineProfile
from cluster.protocol.schema import GroupRequest, GroupResult

__all__ = ["Answer", "MadeGroups", "ProfileSettings", "Window", "answer_of", "field_error", "made_groups",
           "measure", "point_of", "profile_of", "sample_groups"]

# Words the made groups are drawn from: plain English, a few tokens each, so words and tokens stay close.
WORDS = ("the", "river", "crossed", "a", "quiet", "valley", "before", "morning", "and", "every", "house", "kept",
         "its", "lights", "on", "while", "travellers", "waited", "for", "news", "from", "northern", "towns", "where",
         "markets", "opened", "late", "because", "rain", "had", "closed", "roads", "during", "night", "old",
         "bridges", "carried", "carts", "of", "grain", "wine", "wool", "toward", "harbour", "ships", "sailed",
         "south", "with", "letters", "written", "by", "merchants", "who", "never", "met", "their", "partners",
         "beyond", "sea", "yet", "trusted", "them", "completely", "anyway")
# Groups sent at a concurrency, when not given: enough that the start and the drain of the window (fewer
# than the concurrency in flight) are a small part of it.
GROUPS_PER_CONCURRENCY = 4
MIN_GROUPS_PER_POINT = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileSettings(_Strict):
    """How a profiling run measures (validated once, each bad value named by its field)."""

    concurrency: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="Groups kept in flight, one measured point each, in this order.")
    groups_per_point: int | None = Field(
        None, ge=1, description="Groups sent at each concurrency (None: 4 x the concurrency, at least 16).")
    warmup_groups: int = Field(2, ge=0, description="Groups sent first and not measured (connections, the "
                                                    "engines' first steps).")
    max_failures: int = Field(3, ge=0, description="Invalid answers tolerated over the run; more stop it.")

    @field_validator("concurrency")
    @classmethod
    def _each_once(cls, concurrency: list[int]) -> list[int]:
        repeated = sorted({value for value in concurrency if concurrency.count(value) > 1})
        if repeated:
            raise ValueError(f"{repeated[0]} given more than once")
        return concurrency

    def groups_at(self, concurrency: int) -> int:
        """Groups sent at ``concurrency``."""
        if self.groups_per_point is not None:
            return self.groups_per_point
        return max(MIN_GROUPS_PER_POINT, GROUPS_PER_CONCURRENCY * concurrency)

    def check_groups(self) -> None:
        """Raise a ValueError naming ``groups_per_point`` when it is below a concurrency: that many groups
        could never be in flight at once."""
        if self.groups_per_point is not None and self.groups_per_point < max(self.concurrency):
            raise ValueError(f"groups_per_point: {self.groups_per_point} is fewer than concurrency "
                             f"{max(self.concurrency)} (never that many in flight)")


class MadeGroups(_Strict):
    """The shape of made-up groups: for an engine measured before a sample of the real data exists."""

    group_size: int = Field(ge=MIN_CANDIDATES, description="Candidates per group.")
    source_words: int = Field(ge=1, description="Words of each source.")
    candidate_words: int = Field(ge=1, description="Words of each candidate.")
    src_lang: str = Field("en", description="The groups' source language.")
    trg_lang: str = Field("de", description="The groups' target language.")


def field_error(error: ValidationError) -> str:
    """A pydantic error as ``field: message`` (its first problem), for a message that names the field."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(the input)"
    return f"{where}: {first['msg']}"


def _label(tag: str, index: int) -> str:
    # At the start of the source: the prompt differs from the other groups' right after the template.
    return f"[{tag} {index}]"


def made_groups(shape: MadeGroups, count: int, tag: str) -> list[GroupRequest]:
    """``count`` groups of ``shape``'s size and lengths, each different text (seeded by ``tag``: a run's
    own tag makes its groups new to a service that scored an earlier run's)."""
    draw = random.Random(tag)

    def words(count: int) -> str:
        return " ".join(draw.choice(WORDS) for _ in range(count))

    groups = []
    for index in range(count):
        candidates: list[str] = []
        while len(candidates) < shape.group_size:
            text = words(shape.candidate_words)
            # Identical candidates are shown once and share a score: the prompt would be smaller than asked.
            candidates.append(text if text not in candidates else f"{text} {len(candidates)}")
        groups.append(GroupRequest(group_id=f"profile-{tag}-{index}",
                                   source=f"{_label(tag, index)} {words(shape.source_words)}",
                                   candidates=candidates, src_lang=shape.src_lang, trg_lang=shape.trg_lang))
    return groups


def sample_groups(sample: Sequence[GroupRequest | Mapping[str, Any]], count: int, tag: str) -> list[GroupRequest]:
    """``count`` groups from a user's sample, in its order and round again when it has fewer, each made
    different by its label at the start of the source. A row that is not a group (a mapping of
    GroupRequest's fields) raises a ValueError naming the row and the field."""
    if not sample:
        raise ValueError("sample: no groups in it")
    rows = []
    for number, row in enumerate(sample):
        try:
            rows.append(row if isinstance(row, GroupRequest) else GroupRequest.model_validate(row))
        except ValidationError as error:
            raise ValueError(f"sample row {number}: {field_error(error)}") from None
    return [rows[index % len(rows)].model_copy(update={
        "group_id": f"profile-{tag}-{index}", "source": f"{_label(tag, index)} {rows[index % len(rows)].source}"})
        for index in range(count)]


@dataclass(frozen=True)
class Answer:
    """One group's call as the profiler saw it: how long from send to answer, whether it was a verdict, why
    not (a failure kind), and the engine tokens the verdict cost (prompt and answer)."""

    latency_s: float
    valid: bool
    failure: str | None = None
    tokens: int = 0


def answer_of(result: GroupResult | None, failure: str | None, latency_s: float) -> Answer:
    """The answer of a call: the service's ``result`` (None when none came; then ``failure`` says why)."""
    if result is None:
        return Answer(latency_s, False, failure or "no_answer")
    if not result.valid:
        return Answer(latency_s, False, result.failure or "invalid")
    return Answer(latency_s, True, None, result.usage.prompt_tokens + result.usage.completion_tokens)


@dataclass(frozen=True)
class Window:
    """The groups sent at one concurrency: their answers and the seconds from the first send to the last answer."""

    concurrency: int
    wall_s: float
    answers: tuple[Answer, ...]

    @property
    def valid(self) -> list[Answer]:
        return [answer for answer in self.answers if answer.valid]

    @property
    def failures(self) -> Counter[str]:
        """Invalid answers by failure kind."""
        return Counter(answer.failure or "invalid" for answer in self.answers if not answer.valid)

    @property
    def mean_latency_s(self) -> float | None:
        """Mean seconds from send to answer of the valid answers (None: there were none)."""
        valid = self.valid
        return sum(answer.latency_s for answer in valid) / len(valid) if valid else None


Send = Callable[[GroupRequest], Awaitable[tuple[GroupResult | None, str | None]]]


async def measure(send: Send, groups: Sequence[GroupRequest], concurrency: int,
                  clock: Callable[[], float] = time.monotonic) -> Window:
    """Send ``groups`` with ``concurrency`` of them in flight (the next one as one is answered) through
    ``send`` (a group in, the service's result or None and the failure out); their window."""
    if concurrency < 1:
        raise ValueError(f"concurrency: {concurrency}, must be at least 1")
    pending = iter(groups)  # shared by the senders: each takes the next group when its own is answered
    answers: list[Answer] = []

    async def sender() -> None:
        for group in pending:
            sent = clock()
            result, failure = await send(group)
            answers.append(answer_of(result, failure, clock() - sent))

    began = clock()
    await asyncio.gather(*(sender() for _ in range(min(concurrency, len(groups)))))
    return Window(concurrency, clock() - began, tuple(answers))


def point_of(window: Window) -> ConcurrencyPoint:
    """The window's throughput: valid answers, and their tokens, per second of the window. A ValueError
    when it has none to give (no valid answer, or no time passed)."""
    valid = window.valid
    if not valid:
        kinds = ", ".join(f"{kind}: {count}" for kind, count in window.failures.most_common()) or "no groups sent"
        raise ValueError(f"concurrency {window.concurrency}: no valid answer ({kinds})")
    if window.wall_s <= 0:
        raise ValueError(f"concurrency {window.concurrency}: a window of {window.wall_s} s")
    tokens = sum(answer.tokens for answer in valid)
    return ConcurrencyPoint(concurrency=window.concurrency, groups_per_s=len(valid) / window.wall_s,
                            tokens_per_s=tokens / window.wall_s if tokens > 0 else None)


def profile_of(windows: Sequence[Window], *, engine: str, model: str, group_size: int, cold_start_s: float,
               cold_start_from: str = "", replicas: int = 1, gpu: str = "") -> EngineProfile:
    """The profile of the measured ``windows`` (one point each; tokens per group over every valid answer)
    and the service's figures."""
    if not windows:
        raise ValueError("windows: none measured")
    valid = [answer for window in windows for answer in window.valid]
    tokens = sum(answer.tokens for answer in valid)
    return EngineProfile(engine=engine, model=model, gpu=gpu, group_size=group_size,
                         tokens_per_group=tokens / len(valid) if tokens > 0 else None, cold_start_s=cold_start_s,
                         cold_start_from=cold_start_from, replicas=replicas,
                         points=[point_of(window) for window in windows])
