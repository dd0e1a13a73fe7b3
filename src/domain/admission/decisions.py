"""What a `SlotLedger` answers an arrival and a cancel (pure values)."""

from __future__ import annotations

import enum

import msgspec


class Outcome(enum.Enum):
    ADMITTED = "admitted"  # holds a slot now
    QUEUED = "queued"  # waits in the queue until `deadline`
    REJECTED = "rejected"  # queue full: answer 503 + Retry-After
    CLOSED = "closed"  # ledger closed (draining): answer 503 + Retry-After


class Decision(msgspec.Struct, frozen=True, gc=False):
    outcome: Outcome
    ticket: int
    deadline: float = 0.0  # QUEUED only
    retry_after: int = 0  # REJECTED and CLOSED only


class Cancel(enum.Enum):
    WITHDRAWN = "withdrawn"  # was queued, has left the queue: nothing else to do
    HOLDS_SLOT = "holds_slot"  # already admitted: the caller must `release` it
    ENDED = "ended"  # already ended (released, expired, withdrawn, drained, rejected)
