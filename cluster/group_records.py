"""The records of scored groups: what every member of a group is told (:class:`Verdict`) and what
is kept of a scored group so a retried member gets the same answer (:class:`CompletedGroup`).

The assembler writes them; the ledgers (``cluster/ledger.py``, ``deployments/ledger.py``) store
them. Pure data: no Ray, no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TypeAlias

from cluster.protocol.schema import FailureReason, MemberRequest

__all__ = ["CompletedGroup", "GroupContext", "MemberKey", "Verdict", "candidate_digest", "group_context",
           "text_digest"]

# A member's identity within its group: its index, or its member_id (MemberRequest.key).
MemberKey: TypeAlias = int | str

# The digest of an invalid member: never equal to a real 16-byte digest.
_INVALID_DIGEST = b""


def text_digest(text: str) -> bytes:
    """The digest a record keeps of a text (records hold no texts)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def candidate_digest(candidate: str | None) -> bytes:
    """The digest of a member's candidate (``None``: an invalid member, which has its own digest)."""
    return _INVALID_DIGEST if candidate is None else text_digest(candidate)


def _optional_digest(text: str | None) -> bytes | None:
    return None if text is None else text_digest(text)


@dataclass(frozen=True, slots=True)
class GroupContext:
    """What every member of a group must agree on besides its size (digests: records hold no texts)."""

    src_lang: str
    trg_lang: str
    source: bytes
    ref_text: bytes | None = None
    ref_lang: str | None = None
    notes: bytes | None = None

    def disagreements(self, other: GroupContext) -> list[str]:
        """The fields on which ``other`` (a member's) differs from this (its group's), for an error message."""
        found = []
        if other.source != self.source:
            found.append("source (a different text)")
        for name in ("src_lang", "trg_lang", "ref_lang"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                found.append(f"{name} ({theirs!r} here, {mine!r} in the group)")
        for name in ("ref_text", "notes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                state = "none" if theirs is None else "a different text" if mine is not None else "one"
                found.append(f"{name} ({state} here{', none in the group' if mine is None else ''})")
        return found


def group_context(member: MemberRequest) -> GroupContext:
    """The context a member gives its group: languages, source, reference and notes."""
    return GroupContext(src_lang=member.src_lang, trg_lang=member.trg_lang, source=text_digest(member.source),
                        ref_text=_optional_digest(member.ref_text), ref_lang=member.ref_lang,
                        notes=_optional_digest(member.notes))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What every member of one group is told; the per-member score and reward are picked from it."""

    scores: tuple[int | None, ...] | None  # in position order; None at invalid members' positions
    valid: bool
    error: str | None
    failure: FailureReason | None
    replica: str
    attempts: int
    # A group of members sent with member_ids: each member's position (None: members have indices).
    positions: dict[str, int] | None = None
    # Wall-clock times of the group (MemberTiming); None when it was not scored.
    complete_at: float | None = None
    scoring_started_at: float | None = None
    scoring_ended_at: float | None = None
    # The recipe's answer per position (None: the group got none; each member gets its default then).
    rewards: tuple[float, ...] | None = None
    components: tuple[dict[str, float], ...] | None = None
    # Per position, a member's own failure (the language gate's wrong_language); None: the group's applies.
    failures: tuple[FailureReason | None, ...] | None = None

    def position_of(self, member: MemberRequest) -> int | None:
        """The member's position in ``scores`` (None: not part of a scored group of ids)."""
        if member.index is not None:
            return member.index
        return None if self.positions is None else self.positions.get(member.member_id or "")


@dataclass(slots=True)
class CompletedGroup:
    """A scored group, kept so a retried member gets the same answer without re-scoring.

    Texts are kept as digests (:func:`text_digest`, :func:`candidate_digest`): the entry only has
    to recognise a retry, and many thousand cached groups of full texts would cost real memory.
    """

    group_size: int
    src_lang: str
    trg_lang: str
    source_digest: bytes
    candidate_digests: tuple[bytes, ...]  # in position order
    verdict: Verdict
    # The members' ids in position order, for a group of members sent with member_ids.
    member_ids: tuple[str, ...] | None = None
    # The group's reference and notes (digests; None: it had none).
    ref_text_digest: bytes | None = None
    ref_lang: str | None = None
    notes_digest: bytes | None = None

    @classmethod
    def of(cls, group_size: int, context: GroupContext, **fields) -> CompletedGroup:
        """A record of a group of ``group_size`` members that agreed on ``context``."""
        return cls(group_size=group_size, src_lang=context.src_lang, trg_lang=context.trg_lang,
                   source_digest=context.source, ref_text_digest=context.ref_text, ref_lang=context.ref_lang,
                   notes_digest=context.notes, **fields)

    @property
    def context(self) -> GroupContext:
        """What the group's members agreed on."""
        return GroupContext(src_lang=self.src_lang, trg_lang=self.trg_lang, source=self.source_digest,
                            ref_text=self.ref_text_digest, ref_lang=self.ref_lang, notes=self.notes_digest)

    def digest_of(self, key: MemberKey) -> bytes | None:
        """The digest this record holds for a member's index or id (None: no such member, or an
        index against a group of ids, or the reverse)."""
        if isinstance(key, int):
            if self.member_ids is not None or key >= len(self.candidate_digests):
                return None
            return self.candidate_digests[key]
        positions = self.verdict.positions
        if self.member_ids is None or positions is None or key not in positions:
            return None
        return self.candidate_digests[positions[key]]
