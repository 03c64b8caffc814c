"""The records of scored groups: what every member of a group is told (:class:`Verdict`) and what
is kept of a scored group so a retried member gets the same answer (:class:`CompletedGroup`).

The assembler writes them; the ledgers (``cluster/ledger.py``, ``deployments/ledger.py``) store
them. Pure data: no Ray, no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TypeAlias

from cluster.schema import FailureReason, MemberRequest

__all__ = ["CompletedGroup", "MemberKey", "Verdict", "candidate_digest", "text_digest"]

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


@dataclass(frozen=True, slots=True)
class Verdict:
    """What every member of one group is told; the per-member score is picked from it."""

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
    expires_at: float
    # The members' ids in position order, for a group of members sent with member_ids.
    member_ids: tuple[str, ...] | None = None

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
