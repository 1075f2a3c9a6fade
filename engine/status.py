"""Put and get outcomes, named as RocketMQ names them (statuses, not exceptions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class PutStatus(IntEnum):
    """Outcome of one put; the numbers travel through shared memory, so they are fixed.

    OUTCOME_UNKNOWN is not RocketMQ's: the supervisor exited (crash, kill -9) with the request
    published and unanswered, so the message may or may not be stored, and the producer does
    not send it again (never stored twice by it). Unlike FLUSH_DISK_TIMEOUT (stored, not yet
    durable) it claims nothing, so it has no positions and `is_stored` is False."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    MESSAGE_ILLEGAL = 2
    PROPERTIES_SIZE_EXCEEDED = 3
    SERVICE_NOT_AVAILABLE = 4
    DISK_FULL = 5
    OS_PAGE_CACHE_BUSY = 6
    UNKNOWN_ERROR = 7
    OUTCOME_UNKNOWN = 8  # made by the client, never by the supervisor; see the docstring

    @property
    def is_stored(self) -> bool:
        """True when the message is in the log (FLUSH_DISK_TIMEOUT: stored, not yet durable)."""
        return self in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT)


# PutStatus values as plain ints, for comparing numpy status columns on hot paths: numpy
# compares an IntEnum member through a slow generic path (~4 us a compare, ~0.1 us an int).
PUT_OK_CODE = int(PutStatus.PUT_OK)
SERVICE_NOT_AVAILABLE_CODE = int(PutStatus.SERVICE_NOT_AVAILABLE)


class GetStatus(IntEnum):
    """Outcome of get_messages, with RocketMQ's meanings (reference §9.1)."""

    FOUND = 0
    NO_MESSAGE_IN_QUEUE = 1
    OFFSET_TOO_SMALL = 2
    OFFSET_OVERFLOW_ONE = 3
    OFFSET_OVERFLOW_BADLY = 4
    NO_MATCHED_MESSAGE = 5
    OFFSET_FOUND_NULL = 6
    MESSAGE_WAS_REMOVING = 7


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a put returns; positions are None unless the message was stored."""

    status: PutStatus
    commit_pos: int | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    msg_id: str | None = None
    store_ts_ms: int | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


@dataclass(frozen=True, slots=True)
class SkippedRecord:
    """A record a read passed over because its bytes are bad (a checksum fails, a torn header):
    where it is and why. Its queue is None when an index hit led to it (unknown then)."""

    commit_pos: int
    reason: str
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None


@dataclass(frozen=True, slots=True)
class GetResult:
    """Messages read from one queue and where to continue; `skipped`: the corrupt records
    among them, not delivered (next_offset is past them)."""

    status: GetStatus
    messages: list = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    skipped: list[SkippedRecord] = field(default_factory=list)
